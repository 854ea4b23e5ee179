"""Which @forward arguments are adapter state, recorded in the IR.

Lowering passes the adapter state @adapter returns to @forward as leading
arguments, and marks each with the @adapter result it is:

    func.func @forward(%arg0: tensor<KxN...> {stageml.adapter_result = 0 : i64}, %x ...)

so that layout rewrites (pack-weights on the CPU, the sm90 kernels' strips)
can move an argument's layout work into @adapter, which then returns it
laid out, once per adapter load instead of once per request.
"""

from iree.compiler import ir

ADAPTER_RESULT = "stageml.adapter_result"


def mark(forward, state: dict) -> None:
    """Marks @forward argument i with {stageml.adapter_result = state[i]}."""
    if not state:
        return
    count = len(forward.regions[0].blocks[0].arguments)
    i64 = ir.IntegerType.get_signless(64)
    forward.attributes["arg_attrs"] = ir.ArrayAttr.get([
        ir.DictAttr.get({ADAPTER_RESULT: ir.IntegerAttr.get(i64, state[i])} if i in state else {})
        for i in range(count)])


def adapter_result(forward, value) -> int | None:
    """The @adapter result `value` (an argument of `forward`) is, else None."""
    if not isinstance(value.owner, ir.Block) or "arg_attrs" not in forward.attributes:
        return None
    attrs = ir.DictAttr(ir.ArrayAttr(forward.attributes["arg_attrs"])[ir.BlockArgument(value).arg_number])
    return ir.IntegerAttr(attrs[ADAPTER_RESULT]).value if ADAPTER_RESULT in attrs else None


def state_arguments(forward) -> list:
    """@forward's arguments that are adapter state."""
    return [a for a in forward.regions[0].blocks[0].arguments if adapter_result(forward, a) is not None]
