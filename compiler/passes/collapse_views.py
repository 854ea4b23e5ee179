"""collapse-views: a view that merges runs of consecutive dims, as flattens.

torch-mlir lowers a `view` whose input has several dynamic dims as if all but
one of them were 1 (llvm/torch-mlir#3852, #4743): [?,?,64] → [?,64] becomes a
cast to [?,1,64] and a collapse, so IREE then refuses every input whose
second dim is not 1, or, inside a function, computes with wrong shapes. A
flatten of the same dims lowers to `tensor.collapse_shape`, which is right
(and, where torch-mlir's view is right, a `tensor.reshape`, which IREE
optimizes less). So a view of an input with two or more dynamic dims that
only merges runs of consecutive dims becomes flattens. Each size of the view
must name the input dims it merges: a constant, `aten.size.int` of the
input, products of those (`aten.mul.int`), or one size that does not (-1,
or sizes of another tensor: the export's `flatten` of a computed value
names the model input's dims), which takes the dims the others leave: a
view keeps the element count, so that size is their product. Views that
split a dim are left alone.

    %n = torch.aten.mul.int %size0, %size1       (size(x, 0) * size(x, 1))
    %s = torch.prim.ListConstruct %n, %int64
    %y = torch.aten.view %x, %s : [?,?,64] -> [?,64]
  → %y = torch.aten.flatten.using_ints %x, %int0, %int1 : [?,?,64] -> [?,64]
"""

import math

from torch_mlir import ir
from torch_mlir.dialects import torch as torch_d

from stageml.compiler.ir import const_int, constant, defining_op, vtensor_shape, vtensor_type
from stageml.compiler.passes import register, rewrite_each


def _factors(value: ir.Value, x: ir.Value, rank: int):
    """(the input dims `value` multiplies, its constant factor), or None where it is not a
    product of constants and sizes of `x`."""
    number = constant(value)
    if number is not None:
        return frozenset(), number
    op = defining_op(value)
    if op is None:
        return None
    if op.name == "torch.aten.size.int" and op.operands[0] == x:
        dim = constant(op.operands[1])
        return None if dim is None else (frozenset({dim % rank}), 1)
    if op.name == "torch.aten.mul.int":
        parts = [_factors(v, x, rank) for v in op.operands]
        if None in parts or parts[0][0] & parts[1][0]:
            return None
        return parts[0][0] | parts[1][0], parts[0][1] * parts[1][1]
    return None


def _match(factor, dims: list, start: int):
    """The end (exclusive) of the shortest run from `start` whose dims `factor` multiplies."""
    named, constant = factor
    static = 1
    for end in range(start, len(dims)):
        if end not in named:
            if dims[end] is None:
                return None
            static *= dims[end]
        if named <= set(range(start, end + 1)) and static == constant:
            return end + 1
    return None


def collapse(op, rewriter) -> bool:
    """The pattern: True when it does not apply (the bindings' convention)."""
    x, size_list = op.operands
    dims, dtype = vtensor_shape(x.type)
    out_dims, _ = vtensor_shape(op.result.type)
    sizes_op = defining_op(size_list)
    if (len(out_dims) >= len(dims) or dims.count(None) < 2 or sizes_op is None
            or sizes_op.name != "torch.prim.ListConstruct"):
        return True
    sizes = list(sizes_op.operands)
    factors = [None if constant(s) == -1 else _factors(s, x, len(dims)) for s in sizes]
    wild = [j for j, f in enumerate(factors) if f is None]  # -1, or a size not named by x's
    if len(wild) > 1:
        return True
    runs, start = [], 0
    for f in factors[:wild[0]] if wild else factors:  # from the left, up to a -1
        end = _match(f, dims, start)
        if end is None:
            return True
        runs.append((start, end))
        start = end
    if wild:
        tail, stop = [], len(dims)
        for f in reversed(factors[wild[0] + 1:]):  # from the right, down to the -1
            begin = next((b for b in range(stop - 1, start - 1, -1) if _match(f, dims, b) == stop), None)
            if begin is None:
                return True
            tail.insert(0, (begin, stop))
            stop = begin
        if stop <= start:
            return True
        runs += [(start, stop)] + tail
    elif start != len(dims):
        return True
    merged = [dims[b:e] for b, e in runs]
    if [None if None in m else math.prod(m) for m in merged] != out_dims:
        return True  # the sizes say more than the result type does: leave the view
    shape, result = list(dims), x
    with rewriter.ip, op.location:
        for b, e in reversed(runs):  # right to left: the dims before a run keep their positions
            if e - b > 1:
                shape[b:e] = [None if None in shape[b:e] else math.prod(shape[b:e])]
                result = torch_d.AtenFlattenUsingIntsOp(vtensor_type(shape, dtype), result, const_int(b),
                                                        const_int(e - 1)).result
    rewriter.replace_op(op, [result])
    return False


@register("collapse-views", "rewrite views that merge dynamic dims as flattens (torch-mlir#3852)")
def run(module_op, options, stats) -> None:
    rewrite_each(module_op, "torch.aten.view", collapse, stats, "collapse-views")
