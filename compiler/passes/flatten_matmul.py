"""flatten-matmul: batched activations times a 2-D weight as one 2-D mm.

torch-mlir lowers `matmul(x[B,S,K], W[K,N])` to a batch_matmul against W
broadcast to [B,K,N]; flattening keeps W a single 2-D operand, which IREE
data-tiles once as a parameter. (`flatten`, not `view [-1, K]`: torch-mlir
lowers that view of two dynamic dims as if the second were 1.)

    %y = torch.aten.matmul %x, %w : [?,?,K], [K,N] -> [?,?,N]
  → %x2 = torch.aten.flatten.using_ints %x, 0, 1
    %y2 = torch.aten.mm %x2, %w
    %y = torch.aten.view %y2, [size(x,0), size(x,1), N]
"""

import math

from torch_mlir import ir
from torch_mlir.dialects import torch as torch_d

from stageml.compiler.ir import const_int, users, vtensor_shape, vtensor_type
from stageml.compiler.passes import register, rewrite_each


def _int_list(values) -> ir.Value:
    return torch_d.PrimListConstructOp(ir.Type.parse("!torch.list<int>"), values).result


def flatten(op, rewriter) -> bool:
    """The pattern: True when it does not apply (the bindings' convention)."""
    x, w = op.operands
    x_dims, dtype = vtensor_shape(x.type)
    w_dims, _ = vtensor_shape(w.type)
    if len(x_dims) < 3 or len(w_dims) != 2 or not users(op.result):
        return True
    k, n = w_dims
    rows = None if None in x_dims[:-1] else math.prod(x_dims[:-1])
    with rewriter.ip, op.location:
        flat = torch_d.AtenFlattenUsingIntsOp(vtensor_type([rows, k], dtype), x, const_int(0), const_int(len(x_dims) - 2))
        product = torch_d.AtenMmOp(vtensor_type([rows, n], dtype), flat.result, w)
        sizes = [torch_d.AtenSizeIntOp(x, const_int(d)).result if size is None else const_int(size)
                 for d, size in enumerate(x_dims[:-1])]
        out = torch_d.AtenViewOp(op.result.type, product.result, _int_list(sizes + [const_int(n)]))
    rewriter.replace_op(op, [out.result])
    return False


@register("flatten-matmul", "rewrite matmul(x[...,K], W[K,N]) as a 2-D mm between views")
def run(module_op, options, stats) -> None:
    rewrite_each(module_op, "torch.aten.matmul", flatten, stats, "flatten-matmul")
