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


def _asserts(op) -> list:
    """[(block, [its cf.assert ops in order])] of every block nested in `op`."""
    found = []
    for region in op.regions:
        for block in region.blocks:
            mine = []
            for inner in block.operations:
                if inner.operation.name == "cf.assert":
                    mine.append(inner.operation)
                found += _asserts(inner.operation)
            if mine:
                found.append((block, mine))
    return found


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
        self.moved, self.done = [], set()  # in order, and for lookups

    def _here(self, op):
        """The op of this block that is or holds `op`, or None where `op` is outside it."""
        while op is not None and op not in self.position:
            op = op.parent
        return op

    def _move(self, op) -> None:
        operands = [self._here(d) for d in map(defining_op, op.operands) if d is not None]
        before = [m for m in self.moved if self.position[m] < self.position[op]]
        anchor = _latest(operands + before)
        if anchor is not None:
            op.move_after(anchor)
        elif self.block.operations[0] != op:
            op.move_before(self.block.operations[0])
        self.moved.append(op)
        self.done.add(op)

    def hoist(self, op) -> None:
        """Moves `op` (a cf.assert or scalar arithmetic of this block) and, first, the arithmetic it
        uses (depth first, by a stack: a chain of sizes may be long)."""
        stack = [(op, False)]
        while stack:
            current, ready = stack.pop()
            if current not in self.position or current in self.done or not (
                    current.name == "cf.assert" or _scalar(current)):
                continue
            if ready:
                self._move(current)
                continue
            stack.append((current, True))
            stack += [(d, False) for d in map(defining_op, reversed(list(current.operands))) if d is not None]


def hoist_asserts(module_op) -> tuple[int, int]:
    """Hoists and deduplicates every cf.assert; returns (kept, dropped)."""
    kept = dropped = 0
    for block, asserts in _asserts(module_op):
        moves, seen = _Block(block), []
        for op in asserts:
            key = (op.operands[0], ir.StringAttr(op.attributes["msg"]).value)
            if key in seen:
                del moves.position[op]
                op.erase()
                dropped += 1
            else:
                seen.append(key)
                moves.hoist(op)
                kept += 1
    return kept, dropped


@register("hoist-asserts", "runtime assertions and the size arithmetic of their conditions ahead of the work, "
          "once each, so that IREE submits a call's dispatches together", context="iree")
def run(module_op, options, stats) -> None:
    with module_op.context:
        kept, dropped = hoist_asserts(module_op)
    stats["assertions hoisted"] += kept
    stats["assertions dropped"] += dropped
