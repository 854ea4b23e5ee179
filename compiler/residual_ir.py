"""Helpers for the residual's IREE input (linalg on tensors, IREE's bindings)."""

from iree.compiler import ir


def defining_op(value):
    """The operation defining `value`, or None for a block argument."""
    owner = value.owner
    return None if isinstance(owner, ir.Block) else owner.operation


def is_zero_fill(value) -> bool:
    """True when `value` is `linalg.fill` of the constant 0.0."""
    fill = defining_op(value)
    if fill is None or fill.name != "linalg.fill":
        return False
    scalar = defining_op(fill.operands[0])
    return (scalar is not None and scalar.name == "arith.constant"
            and ir.FloatAttr(scalar.attributes["value"]).value == 0.0)


def retype(func) -> None:
    """Sets `func`'s type to its arguments' and returned values' types."""
    block = func.regions[0].blocks[0]
    results = [v.type for v in list(block.operations)[-1].operands]
    func.attributes["function_type"] = ir.TypeAttr.get(
        ir.FunctionType.get([a.type for a in block.arguments], results))
