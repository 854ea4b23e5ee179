"""pack-weights: weight layout is earlier-stage work, so the residual's
products against global weights use a pre-packed (mmt4d) layout.

IREE hoists layout work on immutable globals to load time, but not on the
adapter state @forward receives as an argument: with its data tiling, a
merged LoRA weight would be re-packed inside every request. This rewrite
makes the layout explicit on the IREE input module (linalg on tensors):

    func @forward(%w : tensor<KxNxf32>, %x)             // %w from @adapter
    %y = linalg.matmul ins(%x, %w : tensor<?xKxf32>, tensor<KxNxf32>) outs(%zero)
  → func @forward(%w : tensor<N/16xKx16x1xf32>, %x)     // @adapter returns it packed
    %p = linalg.pack %x padding_value(0) inner_tiles = [16, 1] : tensor<?xKx16x1xf32>
    %a = linalg.mmt4d ins(%p, %w) outs(zero : tensor<?xN/16x16x16xf32>)
    %y = linalg.unpack %a inner_tiles = [16, 16] : tensor<?xNxf32>

For an immutable (static) global the pack stays on its load in @forward,
where IREE's const-expr hoisting moves it to load time. The tile (16x16x1)
is the f32 mmt4d tile IREE itself picks on x86 with AVX-512; other element
types are left to IREE.
"""

from iree.compiler import ir
from iree.compiler.dialects import arith, linalg, tensor

from stageml.compiler.adapter_state import adapter_result, state_arguments

M0, N0, K0 = 16, 16, 1


def _packed_rhs_type(k: int, n: int, element) -> ir.Type:
    return ir.RankedTensorType.get([n // N0, k // K0, N0, K0], element)


def _pack_rhs(value, k, n, element):
    dest = tensor.EmptyOp([n // N0, k // K0, N0, K0], element)
    return linalg.PackOp(dest.result.type, value, dest.result, [1, 0], [], [N0, K0], outer_dims_perm=[1, 0]).result


def _defining_op(value):
    owner = value.owner
    return None if isinstance(owner, ir.Block) else owner.operation


def is_zero_fill(value) -> bool:
    fill = _defining_op(value)
    if fill is None or fill.name != "linalg.fill":
        return False
    scalar = _defining_op(fill.operands[0])
    return (scalar is not None and scalar.name == "arith.constant"
            and ir.FloatAttr(scalar.attributes["value"]).value == 0.0)


def _rewrite_matmul(op, rhs_packed) -> None:
    """matmul(x, w) → unpack(mmt4d(pack(x), rhs_packed)), before `op`."""
    x = op.operands[0]
    x_type = ir.RankedTensorType(x.type)
    out_type = ir.RankedTensorType(op.results[0].type)
    element = x_type.element_type
    k, n = x_type.shape[1], out_type.shape[1]
    with ir.InsertionPoint(op), op.location:
        zero = arith.ConstantOp(element, 0.0).result
        if x_type.is_dynamic_dim(0):
            rows = tensor.DimOp(x, arith.ConstantOp(ir.IndexType.get(), 0).result).result
            tiles = arith.CeilDivUIOp(rows, arith.ConstantOp(ir.IndexType.get(), M0).result).result
        else:
            rows = x_type.shape[0]
            tiles = -(-rows // M0)
        lhs = tensor.EmptyOp([tiles, k // K0, M0, K0], element).result
        lhs = linalg.PackOp(lhs.type, x, lhs, [0, 1], [], [M0, K0], padding_value=zero).result
        acc = tensor.EmptyOp([tiles, n // N0, M0, N0], element).result
        acc = linalg.fill(zero, outs=[acc])
        acc = linalg.mmt4d(lhs, rhs_packed, outs=[acc])
        out = tensor.EmptyOp([rows, n], element).result
        out = linalg.UnPackOp(out.type, acc, out, [0, 1], [], [M0, N0]).result
    op.results[0].replace_all_uses_with(out)
    op.erase()


def _packable_products(value) -> list:
    """The matmuls using `value` (an f32 [K, N] weight) as their right-hand side, or []."""
    type_ = ir.RankedTensorType(value.type)
    if type_.rank != 2 or str(type_.element_type) != "f32" or type_.shape[1] % N0:
        return []
    users = [use.owner for use in value.uses]
    if users and all(u.name == "linalg.matmul" and u.operands[1] == value and u.operands[0] != value
                     and is_zero_fill(u.operands[2]) for u in users):
        return users
    return []


def pack_weights(forward, adapter=None) -> int:
    """Rewrites `forward`'s products against global weights and against the
    adapter state it receives (its arguments marked by adapter_state.mark);
    returns how many. Function types are left to the caller."""
    rewritten = 0
    weights = [op.operation.results[0] for op in forward.regions[0].blocks[0].operations
               if op.operation.name == "util.global.load"]
    weights += state_arguments(forward)
    ret = list(adapter.regions[0].blocks[0].operations)[-1] if adapter is not None else None
    for weight in weights:
        matmuls = _packable_products(weight)
        if not matmuls:
            continue
        type_ = ir.RankedTensorType(weight.type)
        k, n = type_.shape
        if isinstance(weight.owner, ir.Block):  # adapter state: @adapter returns it packed
            result = adapter_result(forward, weight)
            with ir.InsertionPoint(ret), ret.location:
                ret.operands[result] = _pack_rhs(ret.operands[result], k, n, type_.element_type)
            weight.set_type(_packed_rhs_type(k, n, type_.element_type))
            rhs = weight
        else:
            load = weight.owner
            with ir.InsertionPoint.after(load), load.location:
                rhs = _pack_rhs(weight, k, n, type_.element_type)
        for matmul in matmuls:
            _rewrite_matmul(matmul, rhs)
            rewritten += 1
    return rewritten
