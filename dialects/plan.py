"""The serving plan as MLIR: the `plan` dialect (`plan.irdl.mlir`).

`mod.plan("mlir")` and `stagemlc --emit-plan plan.mlir` write the plan of
runtime/tenants.py's `TenantModule.plan()` as a module of plan ops, built
through the MLIR bindings and verified; `read_plan` turns such text back
into the JSON form:

    {"policy": "auto", "budget": None, "bytes_held": 0, "layers": [{...}], "pairs": [{...}]}
  ⇄ module {
      "plan.summary"() {budget, bytes_held = 0 : i64, policy = "auto"} : () -> ()
      "plan.layer"() {experts = 4 : i64, layer = 0 : i64, sites = ["...lora_A..."], ...} : () -> ()
      "plan.pair"() {expert = 3 : i64, form = "factorized", layer = 0 : i64, tenant = "a", ...} : () -> ()
    }
"""

from pathlib import Path

from stageml.errors import StageMLError

PLAN_IRDL = Path(__file__).with_name("plan.irdl.mlir")
_SUMMARY = ("policy", "budget", "bytes_held")


def load_plan_dialect(context) -> None:
    """Loads the `plan` dialect into `context` (a torch_mlir.ir.Context)."""
    from torch_mlir import ir
    from torch_mlir.dialects import irdl

    with context, ir.Location.unknown():
        irdl.load_dialects(ir.Module.parse(PLAN_IRDL.read_text()))


def _attribute(ir, value):
    if value is None:
        return ir.UnitAttr.get()
    if isinstance(value, str):
        return ir.StringAttr.get(value)
    if isinstance(value, int):
        return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value)
    return ir.ArrayAttr.get([_attribute(ir, v) for v in value])


def _value(ir, attr):
    if isinstance(attr, ir.UnitAttr):
        return None
    if isinstance(attr, ir.StringAttr):
        return attr.value
    if isinstance(attr, ir.IntegerAttr):
        return attr.value
    return [_value(ir, a) for a in ir.ArrayAttr(attr)]


def _context():
    from stageml.compiler.ir import new_context
    return new_context()


def plan_mlir(plan: dict) -> str:
    """`plan` (the JSON form) as the text of a verified module of plan ops."""
    from torch_mlir import ir

    with _context(), ir.Location.unknown():
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            for name, entries in (("summary", [{k: plan[k] for k in _SUMMARY}]), ("layer", plan["layers"]),
                                  ("pair", plan["pairs"])):
                for entry in entries:
                    ir.Operation.create(f"plan.{name}", attributes={k: _attribute(ir, v) for k, v in entry.items()})
        module.operation.verify()  # raises on a plan the dialect refuses
        return str(module)


def read_plan(text: str) -> dict:
    """The JSON form of a plan module's text (verified as it is parsed)."""
    from torch_mlir import ir

    with _context():
        try:
            module = ir.Module.parse(text)
        except ir.MLIRError as e:
            why = e.error_diagnostics[0].message if e.error_diagnostics else str(e).splitlines()[0]
            raise StageMLError(f"the text is not a valid plan module ({why}): pass what mod.plan('mlir') or "
                               "stagemlc --emit-plan wrote") from None
        plan = {"layers": [], "pairs": []}
        for op in module.body.operations:
            op = op.operation
            entry = {name: _value(ir, op.attributes[name]) for name in op.attributes}
            if op.name == "plan.summary":
                plan.update(entry)
            else:
                plan[op.name.split(".", 1)[1] + "s"].append(entry)
        return plan
