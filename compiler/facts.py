"""The facts staged IR carries about itself, readable in both MLIR contexts.

From `bt-split` on, every stage function says what it is, and every
argument and result what it holds, in builtin attributes (strings, integers,
dictionaries), which torch-mlir's context and IREE's parse alike:

    func.func @forward(
        %w {bt.name = "fc.weight", bt.kind = "parameter"},   // static: a parameter global
        %m {bt.name = "adapter.0", bt.kind = "state", bt.result = 0 : i64},
                                                            // @adapter's result 0 (same program)
        %t {bt.name = "factorized.adapter.0", bt.kind = "resident"},  // a slot table
        %x {bt.name = "x", bt.kind = "input",               // a request input, with its
            bt.dims = [{min = 1, max = 32}, {min = 64, max = 64}]})  // dimensions' ranges
      -> (tensor {bt.name = "output.0", bt.kind = "output",  // a result, with its dimensions
                  bt.sizes = [{terms = [{coefficient = 1, dims = [{input = "x", axis = 0}]}], divisor = 1}, 128]})
      attributes {bt.stage = "dynamic", bt.program = "main"}

Stages are binding times ("static", "adapter", "dynamic"). A program is one
way of running the model: "main", and for a multi-tenant compile also
"factorized" (per-row adapters gathered from resident slot tables). The
module records the multi-tenant configuration (`bt.tenants`) and each
piece of resident state (`bt.resident`: its owning stage, program, shape
and slot dimension) and its LoRA sites (`bt.sites`, see lora-sites; `bt.unread_factors`, the adapter-time
arguments nothing reads). An
argument that indexes a table records the values it may take (`bt.range`,
see index-bounds).

Everything downstream (the manifest, the runtime's argument order, layout
rewrites, kernel matching) reads these facts; nothing looks at symbol names.
"""

import importlib

STAGE = "bt.stage"
PROGRAM = "bt.program"
NAME = "bt.name"
KIND = "bt.kind"
RESULT = "bt.result"
SITES = "bt.sites"
UNREAD_FACTORS = "bt.unread_factors"  # adapter-time arguments no program reads (LoRA on a module the forward never runs)
TENANTS = "bt.tenants"
RESIDENT = "bt.resident"
DIMS = "bt.dims"    # an input's dimension ranges from the export: [{"min": lo, "max": hi (absent: unbounded)}]
RANGE = "bt.range"  # the values an integer index argument may take: {"min": lo, "max": hi}
# an output's dimensions from the export, each an int or a polynomial in the inputs' dimensions:
# {"terms": [{"coefficient": c, "dims": [{"input": name, "axis": a}, ...]}, ...], "divisor": d}
# (the sum of the terms, floor-divided by d); absent where any dimension is no such polynomial
SIZES = "bt.sizes"
# an argument of @main that is a buffer the model mutates: request-time state the module keeps on the
# device (resident-state), starting from its value in the parameter archive
MUTATED = "bt.mutated"
# a generation step's module (compiler/generation.py): {"sequences": S, "max_seq": M, "eos": [token ids
# that end a sequence]} and the names of its inputs "tokens", "slots" and "positions"
GENERATION = "bt.generation"

MAIN, FACTORIZED = "main", "factorized"
IDS = "adapter_ids"  # the factorized program's request input: each row's adapter slot

# Argument kinds. A parameter's value is static, state and resident state are
# adapter-time, an input or slot has the function's own stage.
PARAMETER, STATE, RESIDENT_KIND, INPUT, SLOT, OUTPUT = "parameter", "state", "resident", "input", "slot", "output"
ROUTING = "routing"  # a result: the rows one MoE layer routed to each (slot, expert) (routing-counts)
MEASURE = "measure"  # a result of @adapter the runtime reads, no later stage's input (bt.measure)
BUFFER = "buffer"    # an argument and a result of a request-time function: a buffer the model mutates


def _ir(obj):
    """The `ir` module of the bindings `obj` belongs to (torch-mlir's or IREE's)."""
    return importlib.import_module(type(obj).__module__)


def _python(attr):
    """A builtin attribute as a Python value (str, int, float, bool, list, dict)."""
    ir = _ir(attr)
    for cls, get in ((ir.StringAttr, lambda a: a.value), (ir.BoolAttr, lambda a: a.value),
                     (ir.IntegerAttr, lambda a: a.value), (ir.FloatAttr, lambda a: a.value),
                     (ir.ArrayAttr, lambda a: [_python(x) for x in a]),
                     (ir.DictAttr, lambda a: {n.name: _python(n.attr) for n in a}),
                     (ir.UnitAttr, lambda a: True)):
        if isinstance(attr, cls):
            return get(attr)
    raise TypeError(f"attribute {attr} is not a builtin fact")


def _is_builtin(attr) -> bool:
    ir = _ir(attr)
    return any(isinstance(attr, c) for c in (ir.StringAttr, ir.BoolAttr, ir.IntegerAttr, ir.FloatAttr,
                                            ir.ArrayAttr, ir.DictAttr, ir.UnitAttr))


def attribute(ir, value, context=None):
    """A Python value (str, bool, int, float, list, dict) as a builtin attribute of `ir`."""
    if isinstance(value, str):
        return ir.StringAttr.get(value, context=context)
    if isinstance(value, bool):
        return ir.BoolAttr.get(value, context=context)
    if isinstance(value, int):
        return ir.IntegerAttr.get(ir.IntegerType.get_signless(64, context=context), value)
    if isinstance(value, float):
        return ir.FloatAttr.get_f64(value, context=context)
    if isinstance(value, (list, tuple)):
        return ir.ArrayAttr.get([attribute(ir, v, context) for v in value], context=context)
    if isinstance(value, dict):
        return ir.DictAttr.get({k: attribute(ir, v, context) for k, v in value.items()}, context=context)
    raise TypeError(f"{value!r} cannot be a fact")


# -- attribute dictionaries of operations, arguments and results ---------------

def get(op, key, default=None):
    """The fact `key` of operation `op` as a Python value."""
    return _python(op.attributes[key]) if key in op.attributes else default


def put(op, key, value) -> None:
    op.attributes[key] = attribute(_ir(op), value, op.context)


def _entries(func, which: str, count: int) -> list:
    key = "arg_attrs" if which == "arg" else "res_attrs"
    ir = _ir(func)
    if key not in func.attributes:
        return [{} for _ in range(count)]
    entries = [{n.name: n.attr for n in ir.DictAttr(d)} for d in ir.ArrayAttr(func.attributes[key])]
    return entries + [{} for _ in range(count - len(entries))]


def _count(func, which: str) -> int:
    ir = _ir(func)
    fn_type = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
    return len(fn_type.inputs if which == "arg" else fn_type.results)


def attrs(func, which: str, index: int) -> dict:
    """The attribute dictionary of argument (`which`="arg") or result ("res") `index`."""
    return _entries(func, which, _count(func, which))[index]


def facts(func, which: str, index: int) -> dict:
    """The bt.* facts of an argument or result as Python values ({"name": ..., "kind": ...})."""
    return {k[len("bt."):]: _python(v) for k, v in attrs(func, which, index).items()
            if k.startswith("bt.") and _is_builtin(v)}


def set_facts(func, which: str, index: int, **values) -> None:
    """Sets facts of argument / result `index` (`kind="state"` sets bt.kind); None removes one."""
    ir, key = _ir(func), "arg_attrs" if which == "arg" else "res_attrs"
    entries = _entries(func, which, _count(func, which))
    for name, value in values.items():
        if value is None:
            entries[index].pop("bt." + name, None)
        else:
            entries[index]["bt." + name] = attribute(ir, value, func.context)
    func.attributes[key] = ir.ArrayAttr.get([ir.DictAttr.get(e, context=func.context) for e in entries],
                                            context=func.context)


def set_all(func, which: str, entries: list) -> None:
    """Replaces the attribute dictionaries of all arguments or results."""
    ir, key = _ir(func), "arg_attrs" if which == "arg" else "res_attrs"
    func.attributes[key] = ir.ArrayAttr.get([ir.DictAttr.get(e, context=func.context) for e in entries],
                                            context=func.context)


# -- stage functions -------------------------------------------------------------

def stage_functions(module_op, stage: str | None = None, program: str | None = None) -> list:
    """The stage functions of a split module (those with bt.stage), filtered."""
    found = []
    for op in module_op.regions[0].blocks[0].operations:
        op = op.operation
        if op.name != "func.func" or STAGE not in op.attributes:
            continue
        if (stage is None or get(op, STAGE) == stage) and (program is None or get(op, PROGRAM) == program):
            found.append(op)
    return found


def symbol(func) -> str:
    return _ir(func).StringAttr(func.attributes["sym_name"]).value


def stage_function(module_op, stage: str, program: str):
    """The one function of `stage` in `program`, or None."""
    found = stage_functions(module_op, stage, program)
    return found[0] if found else None


def adapter_result(func, value) -> int | None:
    """The @adapter result `value` (an argument of `func`) is, else None."""
    ir = _ir(value)
    if not isinstance(value.owner, ir.Block) or value.owner.owner.operation != func:
        return None
    return facts(func, "arg", ir.BlockArgument(value).arg_number).get("result")


def state_arguments(func) -> list:
    """`func`'s arguments that are adapter state (results of its program's @adapter)."""
    block = func.regions[0].blocks[0]
    return [a for a in block.arguments if adapter_result(func, a) is not None]


def erase_argument(func, index: int) -> None:
    """Erases argument `index` of `func` with its attributes; retypes `func`."""
    entries = _entries(func, "arg", _count(func, "arg"))
    func.regions[0].blocks[0].erase_argument(index)
    del entries[index]
    set_all(func, "arg", entries)
    retype_inputs(func)


def add_argument(func, type_, **values):
    """Appends an argument of `type_` with the facts `values`; returns it."""
    entries = _entries(func, "arg", _count(func, "arg"))
    arg = func.regions[0].blocks[0].add_argument(type_, func.location)
    retype_inputs(func)
    set_all(func, "arg", entries + [{}])
    set_facts(func, "arg", len(entries), **values)
    return arg


def retype_inputs(func) -> None:
    """Sets `func`'s input types to its entry block's argument types."""
    ir = _ir(func)
    fn_type = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
    inputs = [a.type for a in func.regions[0].blocks[0].arguments]
    func.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(inputs, fn_type.results))
