"""fuse-gathers (a pattern on linalg.batch_matmul): in request-time functions, a per-row product reads each row's matrix straight from its
slot table (BGMV-style), instead of first copying every row's matrix out.

torch-mlir lowers @forward_factorized's `index_select(table, ids)` to a
gather generic and the per-row product to a batch_matmul; IREE keeps them
in separate dispatches, so the gathered [B,K,N] would be written to memory
and read back on every call. On the IREE input (linalg on tensors):

    %g = linalg.generic ins(%ids : B) outs(%e : BxKxN) {    // g[b,k,n] = table[ids[b],k,n]
           %w = tensor.extract %table[index_cast(%id), linalg.index 1, linalg.index 2] ...}
    %y = linalg.batch_matmul ins(%x, %g : Bx1xK, BxKxN) outs(%zero : Bx1xN)
  → %y = linalg.generic {(b, m, n, k) : x(b,m,k), ids(b) → y(b,m,n), k a reduction}
           ins(%x, %ids) outs(%zero) {
           %w = tensor.extract %table[index_cast(%id), linalg.index 3, linalg.index 2]
           linalg.yield %acc + %x * %w }

By default only for one token per row (M = 1, a batched GEMV): there each
row's matrix is used once, so the copy doubles the traffic. With M > 1
tokens per row the copy is reused M times and the batch_matmul, which IREE
tiles well, is faster on the CPU (measured: the fused form took 1.3-1.9x
longer on the 16-token rows of the benchmark's Llama). Accumulates in f32,
as torch-mlir's own f16 / bf16 products do.

With `multi-token=true` (the sm90 target, whose BGMV kernel takes the fused
form), rows of T tokens (T dynamic or > 1) become the one-token form on
their B*T token rows, each token with its row's id:

    %y = linalg.batch_matmul ins(%x, %g : BxTxK, BxKxN) outs(%zero : BxTxN)
  → %r = tensor.expand_shape (tensor.collapse_shape %x [[0, 1], [2]]) [[0, 1], [2]]   // (B*T)x1xK
    %i = tensor.collapse_shape (linalg.broadcast ins(%ids : B) outs(BxT) dimensions = [1]) [[0, 1]]
    %p = linalg.generic {as above} ins(%r, %i) outs(linalg.fill 0 : (B*T)x1xN)
    %y = tensor.expand_shape (tensor.collapse_shape %p [[0, 1], [2]]) [[0, 1], [2]]   // BxTxN
"""

import dataclasses
import math

from iree.compiler import ir
from iree.compiler.dialects import arith, linalg, tensor

from stageml.compiler.passes import register
from stageml.compiler.residual_ir import is_zero_fill, rewrite_request_functions

_GATHER_BODY = ["arith.index_cast", "linalg.index", "linalg.index", "tensor.extract", "linalg.yield"]


def _gather(value):
    """(table, ids) when `value` is torch-mlir's gather of table rows by ids, else None."""
    op = value.owner
    if isinstance(op, ir.Block) or op.operation.name != "linalg.generic":
        return None
    generic = op.opview
    if len(generic.inputs) != 1 or len(generic.outputs) != 1:
        return None
    body = list(generic.regions[0].blocks[0].operations)
    if [o.operation.name for o in body] != _GATHER_BODY:
        return None
    cast, first, second, extract = (o.operation for o in body[:4])
    dims = [ir.IntegerAttr(o.attributes["dim"]).value for o in (first, second)]
    if (dims != [1, 2] or list(extract.operands)[1:] != [cast.results[0], first.results[0], second.results[0]]
            or cast.operands[0] != generic.regions[0].blocks[0].arguments[0]
            or body[4].operation.operands[0] != extract.results[0]):
        return None
    table = extract.operands[0]
    if isinstance(table.owner, ir.Block) and table.owner == generic.regions[0].blocks[0]:
        return None
    return table, generic.inputs[0]


def _maps() -> ir.ArrayAttr:
    d = [ir.AffineDimExpr.get(i) for i in range(4)]  # b, m, n, k
    return ir.ArrayAttr.get([ir.AffineMapAttr.get(ir.AffineMap.get(4, 0, exprs))
                             for exprs in ([d[0], d[1], d[3]], [d[0]], [d[0], d[1], d[2]])])


def _element(value) -> ir.Type:
    return ir.RankedTensorType(value.type).element_type


def _fused(x, table, ids, acc) -> ir.Value:
    """y[b, m, n] = acc[b, m, n] + sum_k x[b, m, k] * table[ids[b], k, n]."""
    iterators = ir.ArrayAttr.get([ir.Attribute.parse(f"#linalg.iterator_type<{t}>")
                                  for t in ("parallel", "parallel", "parallel", "reduction")])
    generic = linalg.GenericOp([acc.type], [x, ids], [acc], _maps(), iterators)
    block = generic.regions[0].blocks.append(_element(x), _element(ids), _element(acc))

    def widened(value):  # f16 / bf16 operands accumulate in the accumulator's type
        return value if value.type == _element(acc) else arith.ExtFOp(_element(acc), value).result

    with ir.InsertionPoint(block):
        row = arith.IndexCastOp(ir.IndexType.get(), block.arguments[1]).result
        n, k = linalg.IndexOp(2).result, linalg.IndexOp(3).result
        weight = widened(tensor.ExtractOp(table, [row, k, n]).result)
        product = arith.MulFOp(widened(block.arguments[0]), weight).result
        linalg.YieldOp([arith.AddFOp(block.arguments[2], product).result])
    return generic.results[0]


def dims_of(value) -> list:
    """`value`'s dimensions: ints where static, tensor.dim values where dynamic."""
    type_, index = ir.RankedTensorType(value.type), ir.IndexType.get()
    return [tensor.DimOp(value, arith.ConstantOp(index, i).result).result if type_.is_dynamic_dim(i) else size
            for i, size in enumerate(type_.shape)]


def _collapse(value, groups: list) -> ir.Value:
    """`value` with each group of its dimensions merged into one."""
    type_ = ir.RankedTensorType(value.type)
    shape = [ir.ShapedType.get_dynamic_size() if any(type_.is_dynamic_dim(d) for d in group)
             else math.prod(type_.shape[d] for d in group) for group in groups]
    return tensor.CollapseShapeOp(ir.RankedTensorType.get(shape, type_.element_type), value, groups).result


def expanded(value, groups: list, sizes: list) -> ir.Value:
    """`value` with its dimensions split by `groups` into `sizes` (ints, or index values where dynamic)."""
    dynamic = [size for size in sizes if isinstance(size, ir.Value)]
    shape = [ir.ShapedType.get_dynamic_size() if isinstance(size, ir.Value) else size for size in sizes]
    return tensor.ExpandShapeOp(ir.RankedTensorType.get(shape, _element(value)), value, groups, dynamic, shape).result


def _token_rows(x, table, ids, acc) -> ir.Value:
    """`_fused` on the B*T one-token rows of x [B, T, K], each token with its
    row's id, into zeros; its [B*T, 1, N] result reshaped to acc's [B, T, N]."""
    batch, tokens, n = dims_of(acc)
    flat = _collapse(x, [[0, 1], [2]])
    rows, k = dims_of(flat)
    repeated = tensor.EmptyOp([dims_of(ids)[0], tokens], _element(ids)).result  # (the site's products share it)
    token_ids = _collapse(linalg.broadcast(ids, outs=[repeated], dimensions=[1]).results[0], [[0, 1]])
    zero = arith.ConstantOp(_element(acc), 0.0).result
    zeros = linalg.fill(zero, outs=[tensor.EmptyOp([rows, 1, n], _element(acc)).result])
    product = _fused(expanded(flat, [[0, 1], [2]], [rows, 1, k]), table, token_ids, zeros)
    return expanded(_collapse(product, [[0, 1], [2]]), [[0, 1], [2]], [batch, tokens, n])


def fused_product(op):
    """(x, ids, table) when `op` is a per-row product this rewrite built, else None."""
    if op.name != "linalg.generic":
        return None
    generic = op.opview
    if len(generic.inputs) != 2 or len(generic.outputs) != 1 or generic.indexing_maps != _maps():
        return None
    body = [o.operation for o in generic.regions[0].blocks[0].operations]
    extracts = [o for o in body if o.name == "tensor.extract"]
    if len(extracts) != 1 or [o.name for o in body[-3:]] != ["arith.mulf", "arith.addf", "linalg.yield"]:
        return None
    return generic.inputs[0], generic.inputs[1], extracts[0].operands[0]


# IREE 3.13's GPU codegen fails on these products with its reduction vector distribution
# ("'func.func' op failed to distribute"); without it (its older reduction path) they compile.
GPU_FLAGS = ("--iree-codegen-llvmgpu-use-reduction-vector-distribution=false",)


def gpu_flags(module) -> list:
    """The iree-compile flags IREE's GPU codegen needs for `module` (IREE input): GPU_FLAGS
    where a per-row product this rewrite built is still there, else none."""
    found = []

    def visit(op):
        if fused_product(op) is not None:
            found.append(op)
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    op = getattr(module, "operation", module)
    with op.context:
        op.walk(visit)
    return list(GPU_FLAGS) if found else []


def fuse_gather(op, rewriter, multi_token: bool = False) -> bool:
    """The pattern on linalg.batch_matmul: True when it does not apply."""
    found = _gather(op.operands[1])
    result = ir.RankedTensorType(op.results[0].type)
    one_token = not result.is_dynamic_dim(1) and result.shape[1] == 1
    if (found is None or not is_zero_fill(op.operands[2]) or not isinstance(result.element_type, ir.F32Type)
            or not (one_token or multi_token)):
        return True  # f32 accumulation of any float operands, one token per row unless multi_token
    x, gather, acc = op.operands[0], op.operands[1].owner, op.operands[2]
    with rewriter.ip, op.location:
        fused = _fused(x, *found, acc) if one_token else _token_rows(x, *found, acc)
    rewriter.replace_op(op, [fused])
    if all(len(list(r.uses)) == 0 for r in gather.results):
        rewriter.erase_op(gather)
    return False


@dataclasses.dataclass(frozen=True)
class FuseGathersOptions:
    """multi_token: also rows of several tokens, as one-token rows (the sm90 target, for its BGMV kernel)."""

    multi_token: bool = False


@register("fuse-gathers", "request-time per-row products read their rows' factors from the slot table",
          options=FuseGathersOptions, context="iree")
def run(module_op, options, stats) -> None:
    rewrite_request_functions(module_op, "linalg.batch_matmul",
                              lambda op, rewriter: fuse_gather(op, rewriter, options.multi_token), stats, "fuse-gathers")
