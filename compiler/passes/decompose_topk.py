"""decompose-topk: top-k over the last dim as k rounds of arg-max, after bt-split.

torch-mlir decomposes `topk` into a full sort, and IREE 3.13 miscompiles two
sorts whose index operands are equal iotas: CSE merges the iotas and both
in-place sorts write one buffer, so the second's indices are wrong (every
MoE model of two or more layers routed its tokens wrongly). An MoE router
picks k of E scores, k small: k arg-max reductions (parallel, fusable) are
also cheaper than a sort. Round r takes the max of what the earlier rounds
left and masks its index out with the lowest finite value of the dtype (so
scores at -inf, which no router makes, could be taken twice). The new ops
are ones torch-mlir's linalg lowering takes as they are (its decompositions
ran at import): literals, `where.self`, `eq.Tensor`, `max.dim`, `cat`. Of equal scores the lowest index wins (torch's
own tie order is unspecified); `largest=false` takes minima the same way.

    %v, %i = torch.aten.topk %x, %int2, %int-1, %true, %true : [?,E] -> [?,2], [?,2]
  → %v0, %i0 = torch.aten.max.dim %x, %int-1, %true            : [?,1], [?,1]
    %iota = torch.vtensor.literal(dense<[0, 1, .., E-1]> : tensor<Exsi64>)
    %low = torch.vtensor.literal(dense<-3.4e38> : tensor<f32>)
    %x1 = torch.aten.where.self (torch.aten.eq.Tensor %iota, %i0), %low, %x
    %v1, %i1 = torch.aten.max.dim %x1, %int-1, %true
    %v = torch.aten.cat [%v0, %v1], -1 ;  %i = torch.aten.cat [%i0, %i1], -1
"""

import numpy as np
import torch
from torch_mlir import ir
from torch_mlir.dialects import torch as torch_d

from stageml.compiler.ir import DTYPES, const_int, constant, vtensor_shape, vtensor_type
from stageml.compiler.passes import register, rewrite_each
from stageml.errors import CompileError

def _cat(parts: list, type_: ir.Type) -> ir.Value:
    if len(parts) == 1:
        return parts[0]
    listed = torch_d.PrimListConstructOp(ir.Type.parse("!torch.list<vtensor>"), parts).result
    return torch_d.AtenCatOp(type_, listed, const_int(-1)).result


def decompose(op, rewriter) -> bool:
    """The pattern: True when it does not apply (the bindings' convention)."""
    x, k_value, dim_value, largest_value = list(op.operands)[:4]
    dims, dtype = vtensor_shape(x.type)
    k, dim, largest = constant(k_value), constant(dim_value), constant(largest_value)
    if k is None or dim is None or largest is None or dim % len(dims) != len(dims) - 1 or dims[-1] is None:
        raise CompileError(f"{op.location}: torch.topk needs a constant k and largest, over the last dim "
                           f"of a static size; this one is over dim {dim} of {dims}: move the dim last")
    keep = dims[:-1] + [1]
    reduce = torch_d.AtenMaxDimOp if largest else torch_d.AtenMinDimOp
    with rewriter.ip, op.location:
        true = torch_d.ConstantBoolOp(True).result
        iota = torch_d.ValueTensorLiteralOp(ir.DenseElementsAttr.get(
            np.arange(dims[-1], dtype=np.int64), signless=False, type=ir.IntegerType.get_signed(64))).result
        bound = torch.finfo(getattr(torch, DTYPES[dtype]))
        fill = torch_d.ValueTensorLiteralOp(ir.DenseElementsAttr.get_splat(
            ir.RankedTensorType.get([], ir.Type.parse(dtype)),
            ir.FloatAttr.get(ir.Type.parse(dtype), float(bound.min if largest else bound.max)))).result
        values, indices, rest = [], [], x
        for r in range(k):
            found = reduce(vtensor_type(keep, dtype), vtensor_type(keep, "si64"), rest, const_int(-1), true)
            values.append(found.results[0])
            indices.append(found.results[1])
            if r + 1 < k:
                taken = torch_d.AtenEqTensorOp(vtensor_type(dims, "i1"), iota, found.results[1]).result
                rest = torch_d.AtenWhereSelfOp(x.type, taken, fill, rest).result
        results = [_cat(values, op.results[0].type), _cat(indices, op.results[1].type)]
    rewriter.replace_op(op, results)
    return False


@register("decompose-topk", "top-k as k rounds of arg-max (IREE miscompiles several sorts)")
def run(module_op, options, stats) -> None:
    rewrite_each(module_op, "torch.aten.topk", decompose, stats, "decompose-topk")
