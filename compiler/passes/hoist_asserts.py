"""hoist-asserts: each runtime assertion ahead of the work, and once.

The checks the lowering leaves (torch-mlir's shape checks, bt-gather's row
check) sit where the op that needed them was, between the request's tensor
ops, and so does the scalar arithmetic on sizes their conditions come from.
IREE's stream partitioning keeps host ops in order with the dispatches, so
every assertion between two dispatches ends an execution region: each region
is a queue submission of its own, with its own transient allocation waiting
on the previous one, and the GPU idles between them (a 2-site decode
residual: 3 submissions a call, 1 without). The conditions are host values
(sizes), mostly known from the inputs' shapes alone. So each assertion moves
up to just after its condition's definition, that definition's scalar
arithmetic (arith, affine.apply, tensor.dim) first moving up as far as its
own operands allow, and a second assertion of the same condition and message
goes:

    %n = tensor.dim %x, %c0
    %y0 = flow.dispatch @k(%x) ...
    %c = arith.cmpi eq, %n, %m : index
    cf.assert %c, "rows do not line up"
    %y1 = flow.dispatch @k(%y0) ...
    cf.assert %c, "rows do not line up"
  → %n = tensor.dim %x, %c0
    %c = arith.cmpi eq, %n, %m : index
    cf.assert %c, "rows do not line up"
    %y0 = flow.dispatch @k(%x) ...
    %y1 = flow.dispatch @k(%y0) ...

A division or remainder never moves above an assertion it came after (that
assertion may be what keeps its divisor nonzero). A call that fails an
assertion now fails it before any of its work starts; moving one past
another only changes which message a call failing both reports. Ops stay in
their block.
"""

from iree.compiler import ir

from stageml.compiler.passes import register
from stageml.compiler.residual_ir import defining_op

def _scalar(op) -> bool:
    """Size arithmetic free to move: no regions, no side effects, no tensor results."""
    name = op.name
    if len(op.regions) or not (name.startswith("arith.") or name in ("affine.apply", "tensor.dim")):
        return False
    return not any(isinstance(r.type, ir.ShapedType) for r in op.results)


def _ancestor_in(op, block):
    """The op of `block` that is or holds `op`, or None where `op` is outside `block`."""
    while op is not None:
        if op.block == block:
            return op
        op = op.parent
    return None


def _latest(ops: list):
    """The last of `ops` (ops of one block, None for none) in the block's order."""
    last = None
    for op in ops:
        if op is not None and (last is None or last.is_before_in_block(op)):
            last = op
    return last


class _Block:
    """Moves of one block's ops. A moved op goes right after the latest of its operands'
    definitions and of the ops moved before it that came before it: SSA order holds, moved ops
    keep their order, and so a division never passes an assertion it came after."""

    def __init__(self, block):
        self.block = block
        self.position = {op.operation: i for i, op in enumerate(block.operations)}  # before any move
        self.moved = []

    def _move(self, op) -> None:
        operands = [_ancestor_in(d, self.block) for d in map(defining_op, op.operands) if d is not None]
        before = [m for m in self.moved if self.position[m] < self.position[op]]
        anchor = _latest(operands + before)
        if anchor is not None:
            op.move_after(anchor)
        elif self.block.operations[0] != op:
            op.move_before(self.block.operations[0])
        self.moved.append(op)

    def hoist(self, op) -> None:
        """Moves `op` (a cf.assert or scalar arithmetic of this block) and, first, the arithmetic it uses."""
        if op.block != self.block or op in self.moved or not (op.name == "cf.assert" or _scalar(op)):
            return
        for value in op.operands:
            definition = defining_op(value)
            if definition is not None:
                self.hoist(definition)
        self._move(op)


def hoist_asserts(module_op) -> tuple[int, int]:
    """Hoists and deduplicates every cf.assert; returns (kept, dropped)."""
    asserts = []

    def visit(op):
        if op.name == "cf.assert":
            asserts.append(op)
        return ir.WalkResult.ADVANCE

    module_op.walk(visit)
    blocks, kept, dropped = [], [], 0
    for op in asserts:
        condition, message = op.operands[0], ir.StringAttr(op.attributes["msg"]).value
        if any(b == op.block and c == condition and m == message for b, c, m in kept):
            op.erase()
            dropped += 1
            continue
        kept.append((op.block, condition, message))
        moves = next((b for b in blocks if b.block == op.block), None)
        if moves is None:
            moves = _Block(op.block)
            blocks.append(moves)
        moves.hoist(op)
    return len(kept), dropped


@register("hoist-asserts", "runtime assertions and the size arithmetic of their conditions ahead of the work, "
          "once each, so that IREE submits a call's dispatches together", context="iree")
def run(module_op, options, stats) -> None:
    with module_op.context:
        kept, dropped = hoist_asserts(module_op)
    stats["assertions hoisted"] += kept
    stats["assertions dropped"] += dropped
