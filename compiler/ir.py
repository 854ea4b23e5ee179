"""Shared MLIR helpers: the context, binding-time attributes, torch types.

Binding times live on the IR as `#bt.time<"...">` attributes: on function
arguments (`bt.time` argument attribute, next to `bt.name`, the model's name
for the argument) and on operations (`bt.time`, one time for all results).
"""

from torch_mlir import ir
from torch_mlir.dialects import torch as torch_d

from stageml.binding_time import BindingTime
from stageml.dialects import load_bt_dialect
from stageml.dialects.plan import load_plan_dialect

TIME = "bt.time"
NAME = "bt.name"

# torch element types → numpy dtype names
DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64",
          "si64": "int64", "si32": "int32", "si16": "int16", "si8": "int8", "ui8": "uint8",
          "i1": "bool"}


def new_context() -> ir.Context:
    """A context with the torch, bt and plan dialects loaded."""
    context = ir.Context()
    torch_d.register_dialect(context)
    load_bt_dialect(context)
    load_plan_dialect(context)
    return context


def time_attr(time: BindingTime) -> ir.Attribute:
    return ir.Attribute.parse(f'#bt.time<"{time.label}">')


def parse_time(attr: ir.Attribute) -> BindingTime:
    """The binding time a `#bt.time<...>` attribute denotes (compared as attributes)."""
    for time in BindingTime:
        if attr == time_attr(time):
            return time
    raise ValueError(f"{attr} is not a #bt.time attribute")


# -- function arguments -------------------------------------------------------

def arg_attrs(func: ir.Operation, index: int) -> dict:
    if "arg_attrs" not in func.attributes or index >= len(ir.ArrayAttr(func.attributes["arg_attrs"])):
        return {}
    entry = ir.DictAttr(ir.ArrayAttr(func.attributes["arg_attrs"])[index])
    return {named.name: named.attr for named in entry}


def set_arg_attr(func: ir.Operation, index: int, key: str, value: ir.Attribute) -> None:
    count = len(func.regions[0].blocks[0].arguments)
    entries = [arg_attrs(func, i) for i in range(count)]
    entries[index][key] = value
    context = func.context
    func.attributes["arg_attrs"] = ir.ArrayAttr.get(
        [ir.DictAttr.get(e, context=context) for e in entries], context=context)


def arg_name(func: ir.Operation, index: int) -> str:
    attr = arg_attrs(func, index).get(NAME)
    return ir.StringAttr(attr).value if attr is not None else f"arg{index}"


# -- binding times of values ---------------------------------------------------

def value_time(value: ir.Value) -> BindingTime:
    """The binding time of `value`; unannotated values are dynamic."""
    owner = value.owner
    if isinstance(owner, ir.Block):
        func = owner.owner.operation
        attr = arg_attrs(func, ir.BlockArgument(value).arg_number).get(TIME)
    else:
        attr = owner.attributes[TIME] if TIME in owner.attributes else None
    return parse_time(attr) if attr is not None else BindingTime.DYNAMIC


def set_op_time(op: ir.Operation, time: BindingTime) -> None:
    op.attributes[TIME] = time_attr(time)


def is_tensor(value: ir.Value) -> bool:
    return str(value.type).startswith("!torch.vtensor")


def is_rematerializable(value: ir.Value) -> bool:
    """True for constants and non-tensor values computed only from constants.

    Such values are cloned into every stage that uses them instead of crossing
    a stage boundary.
    """
    owner = value.owner
    if isinstance(owner, ir.Block):
        return False
    if len(owner.operands) == 0:
        return True
    return not is_tensor(value) and all(is_rematerializable(v) for v in owner.operands)


# -- torch types -----------------------------------------------------------------

def vtensor_type(shape: list, dtype: str) -> ir.Type:
    """`!torch.vtensor<[d0,d1],dtype>`; a None dim is dynamic (`?`)."""
    dims = ",".join("?" if d is None else str(d) for d in shape)
    return ir.Type.parse(f"!torch.vtensor<[{dims}],{dtype}>")


def vtensor_shape(type_: ir.Type) -> tuple[list, str]:
    """(shape, dtype) of a `!torch.vtensor<[..],dtype>` type."""
    text = str(type_)
    dims_text, dtype = text[len("!torch.vtensor<["):-1].split("],")
    dims = [None if d == "?" else int(d) for d in dims_text.split(",")] if dims_text else []
    return dims, dtype


def const_int(value: int, annotate: bool = False) -> ir.Value:
    """A `torch.constant.int` at the current insertion point; `annotate`
    marks it static (in IR that bt-propagate has already annotated)."""
    op = torch_d.ConstantIntOp(ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value))
    if annotate:
        set_op_time(op.operation, BindingTime.STATIC)
    return op.result


def users(value: ir.Value) -> list:
    return [use.owner for use in value.uses]


def defining_op(value: ir.Value):
    """The operation that defines `value`, or None for a block argument."""
    owner = value.owner
    return owner.operation if isinstance(owner, (ir.Operation, ir.OpView)) else None


def argument_names(func, value: ir.Value) -> set:
    """The names of `func`'s arguments `value` is computed from."""
    names, seen, todo = set(), set(), [value]
    while todo:
        value = todo.pop()
        op = defining_op(value)
        if op is None:
            names.add(arg_name(func, ir.BlockArgument(value).arg_number))
            continue
        if op not in seen:
            seen.add(op)
            todo.extend(op.operands)
    return names


_CONSTANTS = {"torch.constant.int": ir.IntegerAttr, "torch.constant.float": ir.FloatAttr,
              "torch.constant.bool": ir.BoolAttr}


def constant(value: ir.Value):
    """The number (int, float or bool) a torch constant scalar holds, or None for any other value."""
    op = defining_op(value)
    if op is None or op.name not in _CONSTANTS:
        return None
    return _CONSTANTS[op.name](op.attributes["value"]).value


# Ops whose results are not a function of their operands alone.
_EFFECTFUL = ("torch.operator", "torch.aten.rand", "torch.aten.randn", "torch.aten.randint",
              "torch.aten.bernoulli", "torch.aten.dropout", "torch.aten.uniform",
              "torch.aten.normal", "torch.aten.multinomial", "torch.runtime.assert")


def is_effectful(op: ir.Operation) -> bool:
    return op.name.startswith(_EFFECTFUL)


def op_time(op: ir.Operation) -> BindingTime:
    """The binding time `op` must have, from its operands and its kind (bt-propagate's rule)."""
    if is_effectful(op) or len(op.regions) > 0 or len(op.results) == 0:
        return BindingTime.DYNAMIC
    return BindingTime.STATIC.join(*(value_time(v) for v in op.operands))


def timed(op) -> ir.Value:
    """`op`'s result, `op` given the binding time its operands imply (for ops a pass builds in
    annotated IR)."""
    set_op_time(op.operation, op_time(op.operation))
    return op.result


def erase_dead_ops(block: ir.Block) -> int:
    """Erases pure operations whose results are all unused."""
    erased = 0
    for op in reversed(list(block.operations)):
        op = op.operation
        if len(op.results) and not is_effectful(op) and all(len(users(r)) == 0 for r in op.results):
            op.erase()
            erased += 1
    return erased


class Diagnostics:
    """Collects a context's error diagnostics instead of printing them.

        with Diagnostics(context) as diags:
            run_pipeline(...)
        diags.first_error()  # "failed to legalize operation 'torch.aten.linalg_qr'"
    """

    def __init__(self, context):
        self.context, self.errors, self.locations = context, [], []

    def _handle(self, diagnostic) -> bool:
        if diagnostic.severity == ir.DiagnosticSeverity.ERROR:
            self.errors.append(str(diagnostic.message))
            self.locations.append(diagnostic.location)
        return True

    def __enter__(self):
        self._handler = self.context.attach_diagnostic_handler(self._handle)
        return self

    def __exit__(self, *exc):
        self._handler.detach()

    def first_error(self) -> str:
        """The first error in one line, naming an unknown op by its torch name."""
        if not self.errors:
            return "no diagnostic was reported"
        message = self.errors[0].splitlines()[0]
        unknown = message.split('name = "', 1)[1].split('"', 1)[0] if 'name = "' in message else None
        message = message.split(": %", 1)[0]
        message = f"{message} ({unknown})" if unknown else message
        where = str(self.locations[0])  # shown as MLIR prints it: loc("models.py":12:0)
        return f"{message} at {where}" if where != "loc(unknown)" else message
