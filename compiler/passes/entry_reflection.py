"""entry-reflection: each entry point describes itself inside the .vmfb.

IREE keeps a public function's `iree.reflection` dictionary in the compiled
module, where the runtime reads it back (`VmModule.lookup_function(name)
.reflection`) without running anything. Each adapter and request-time
function records its own description (compiler/entry_points.py: stage,
program, arguments and results with their facts, shapes and dtypes) as
JSON; the function that owns the resident slot tables also records the
module's multi-tenant configuration, and each request-time function of a
generation step's module the step's configuration. The runtime trusts these, not the
manifest beside the module, for slot counts, ranks, shapes, dtypes and
bounds, and refuses a manifest that disagrees:

    func.func @forward(%x {bt.kind = "input", ...}) attributes {bt.stage = "dynamic", bt.program = "main"}
  → func.func @forward(...) attributes {..., iree.reflection = {
        stageml.entry = "{\"arguments\": [...], \"program\": \"main\", \"stage\": \"dynamic\", ...}"}}
"""

import json

from iree.compiler import ir

from stageml.compiler import facts
from stageml.compiler.entry_points import describe, entry_points_of, tenants
from stageml.compiler.passes import register
from stageml.runtime.manifest import REFLECTED_ENTRY as ENTRY, REFLECTED_GENERATION as GENERATION, \
    REFLECTED_TENANTS as TENANTS


def reflection(func) -> dict:
    """{key: JSON text} this function's reflection records."""
    module_op = func.parent
    found = {ENTRY: json.dumps(describe(func), sort_keys=True)}
    owned = {e["owner"] for e in facts.get(module_op, facts.RESIDENT, [])
             if e["program"] == facts.get(func, facts.PROGRAM)}
    if facts.get(func, facts.STAGE) in owned and tenants(module_op) is not None:
        found[TENANTS] = json.dumps(tenants(module_op), sort_keys=True)
    if facts.get(func, facts.STAGE) == "dynamic" and facts.get(module_op, facts.GENERATION) is not None:
        found[GENERATION] = json.dumps(facts.get(module_op, facts.GENERATION), sort_keys=True)
    return found


@register("entry-reflection", "record each entry point's description (and the multi-tenant "
          "configuration) in its iree.reflection, for the runtime to check the manifest against", context="iree")
def run(module_op, options, stats) -> None:
    with module_op.context:
        for func in entry_points_of(module_op):
            func.attributes["iree.reflection"] = ir.DictAttr.get(
                {k: ir.StringAttr.get(v) for k, v in reflection(func).items()})
            stats["reflected"] += 1
