"""pack-weights: weight layout is earlier-stage work, so the residual's
products against weights use a pre-packed (mmt4d) layout in the CPU's tiles.

IREE hoists layout work on immutable globals to load time, but not on the
adapter state a request-time function receives as an argument: with its
data tiling, a merged LoRA weight would be re-packed inside every request.
This rewrite makes the layout explicit on the IREE input module (linalg on
tensors), for every function with bt.stage = "dynamic":

    func @forward(%w : tensor<KxNxf32> {bt.result = 0}, %x : tensor<3xKxf32>)
    %y = linalg.matmul ins(%x, %w) outs(zero : tensor<3xNxf32>)
  → func @forward(%w : tensor<N/N0xKxN0x1xf32> {bt.result = 0}, %x)  // @adapter returns it packed
    %p = linalg.pack %x padding_value(0) inner_tiles = [4, 1] : tensor<1xKx4x1xf32>
    %a = linalg.mmt4d ins(%p, %w) outs(zero : tensor<1xN/N0x4xN0xf32>)
    %y = linalg.unpack %a inner_tiles = [4, N0] : tensor<3xNxf32>

and with a dynamic row count (%x : tensor<?xKxf32>), one branch per tile:

    %y = scf.if (rows <= 1) { unpack(mmt4d(pack(%x) in [1, 1], %w)) }
         else { scf.if (rows <= 2) { ...[2, 1]... } else { ... { widest } } }

Beyond the narrow tiles (more rows than one tile of the widest), the
operands swap: `unpack(mmt4d(%w, pack(%x) in [M0, 1]))`, the weight on
mmt4d's left, so that it is read once, not once per row tile.

For an immutable global the pack of the weight follows its load, where
IREE's const-expr hoisting moves it to load time. The weight's layout (N0,
K0) is the CPU's widest f32 tile; each product's M0 fits its row count
(`CpuTarget.mmt4d_tiles`: 1, 2, 4, 8 or the widest): the smallest tile that
covers a static row count, as IREE's data tiling picks it, and for a dynamic
one the ladder above on `tensor.dim %x, 0`, where IREE would take the widest
(a dynamic M is never narrow to it); IREE compiles each branch to its own
pack, mmt4d and unpack dispatches. Element types with no tiles (all but
f32) are left to IREE.
"""

import collections
import dataclasses

from iree.compiler import ir
from iree.compiler.dialects import arith, linalg, scf, tensor

from stageml.compiler import facts
from stageml.compiler.passes import register
from stageml.compiler.residual_ir import is_zero_fill, retype
from stageml.compiler.targets.cpu import CpuTarget


@dataclasses.dataclass(frozen=True)
class PackWeightsOptions:
    cpu: str = "host"  # the CPU whose mmt4d tiles to use ("host" or an LLVM CPU name)


def _pack_rhs(value, n0: int, k0: int):
    """[K, N] → [N/N0, K/K0, N0, K0] (mmt4d's transposed right-hand side)."""
    k, n = ir.RankedTensorType(value.type).shape
    dest = tensor.EmptyOp([n // n0, k // k0, n0, k0], ir.RankedTensorType(value.type).element_type).result
    return linalg.pack(value, dest, [1, 0], [n0, k0], outer_dims_perm=[1, 0])


def _product(x, rows, rhs, m0: int, n0: int, k0: int, widest: bool):
    """x @ w for w packed in (N0, K0), x packed in M0 x K0 tiles; `rows` is x's
    row count (an int, or an index value when dynamic).

    Narrow tiles: unpack(mmt4d(pack(x), w)). The widest (square, M0 = N0) tile
    swaps the operands, (W^T @ x^T)^T = unpack(mmt4d(w, pack(x))): the weight,
    the large operand, is then read once however many row tiles there are
    (x @ w reads it once per row tile; measured on an AVX2 CPU, 64 rows of a
    4096² f32 layer: 32.0 → 17.7 ms). The packed weight is the same bytes:
    [N/N0, K/K0, N0, K0] is the left-hand layout of W^T in (N0, K0) tiles."""
    swapped = widest and m0 == n0
    x_type = ir.RankedTensorType(x.type)
    element, k = x_type.element_type, x_type.shape[1]
    n = ir.RankedTensorType(rhs.type).shape[0] * n0
    zero = arith.ConstantOp(element, 0.0).result
    if isinstance(rows, int):
        tiles = -(-rows // m0)
    else:
        tiles = rows if m0 == 1 else arith.CeilDivUIOp(rows, arith.ConstantOp(ir.IndexType.get(), m0).result).result
    packed_x = tensor.EmptyOp([tiles, k // k0, m0, k0], element).result
    packed_x = linalg.pack(x, packed_x, [0, 1], [m0, k0], padding_value=zero)
    out = tensor.EmptyOp([rows, n], element).result
    if swapped:
        acc = linalg.fill(zero, outs=[tensor.EmptyOp([n // n0, tiles, n0, m0], element).result])
        acc = linalg.mmt4d(rhs, packed_x, outs=[acc])
        return linalg.unpack(acc, out, [1, 0], [n0, m0], outer_dims_perm=[1, 0])
    acc = linalg.fill(zero, outs=[tensor.EmptyOp([tiles, n // n0, m0, n0], element).result])
    acc = linalg.mmt4d(packed_x, rhs, outs=[acc])
    return linalg.unpack(acc, out, [0, 1], [m0, n0])


def _ladder(x, rows, rhs, tiles: tuple):
    """x @ w with M0 chosen by x's dynamic row count: nested scf.if, narrowest first."""
    (max_rows, m0, n0, k0), rest = tiles[0], tiles[1:]
    if max_rows is None:
        return _product(x, rows, rhs, m0, n0, k0, widest=True)
    narrow = arith.CmpIOp(arith.CmpIPredicate.ule, rows, arith.ConstantOp(ir.IndexType.get(), max_rows).result)
    out_type = ir.RankedTensorType.get([ir.ShapedType.get_dynamic_size(), ir.RankedTensorType(rhs.type).shape[0] * n0],
                                       ir.RankedTensorType(x.type).element_type)
    branch = scf.IfOp(narrow.result, [out_type], has_else=True)
    with ir.InsertionPoint(branch.then_block):
        scf.YieldOp([_product(x, rows, rhs, m0, n0, k0, widest=False)])
    with ir.InsertionPoint(branch.else_block):
        scf.YieldOp([_ladder(x, rows, rhs, rest)])
    return branch.results[0]


def _rewrite_matmul(op, rhs, tiles: tuple) -> None:
    """matmul(x, w) → unpack(mmt4d(pack(x), rhs)) in the tile for x's rows, before `op`."""
    x, _, init = op.operands
    x_type = ir.RankedTensorType(x.type)
    with ir.InsertionPoint(op), op.location:
        if x_type.is_dynamic_dim(0):
            rows = tensor.DimOp(x, arith.ConstantOp(ir.IndexType.get(), 0).result).result
            out = _ladder(x, rows, rhs, tiles)
        else:
            rows = x_type.shape[0]
            max_rows, m0, n0, k0 = next(t for t in tiles if t[0] is None or rows <= t[0])
            out = _product(x, rows, rhs, m0, n0, k0, widest=max_rows is None and rows > m0)
    op.results[0].replace_all_uses_with(out)
    op.erase()
    fill = init.owner.operation
    if not list(init.uses):
        dest = fill.operands[1]
        fill.erase()
        if not isinstance(dest.owner, ir.Block) and dest.owner.operation.name == "tensor.empty" and not list(dest.uses):
            dest.owner.operation.erase()


def _packable_products(value, tiles_for) -> list | None:
    """The matmuls using `value` (a [K, N] weight) as their right-hand side ([] when
    it has no uses), or None when its products cannot all use the packed layout."""
    if not isinstance(value.type, ir.RankedTensorType):
        return None
    type_ = ir.RankedTensorType(value.type)
    tiles = tiles_for(str(type_.element_type))
    if type_.rank != 2 or not tiles or type_.is_dynamic_dim(0) or type_.is_dynamic_dim(1):
        return None
    _, _, n0, k0 = tiles[-1]
    if type_.shape[1] % n0 or type_.shape[0] % k0:
        return None
    users = [use.owner for use in value.uses]
    if all(u.name == "linalg.matmul" and u.operands[1] == value and u.operands[0] != value
           and ir.RankedTensorType(u.operands[0].type).element_type == type_.element_type
           and ir.RankedTensorType(u.operands[2].type).element_type == type_.element_type
           and is_zero_fill(u.operands[2]) for u in users):
        return users
    return None


def _packed_type(value_type, tiles) -> ir.Type:
    k, n = ir.RankedTensorType(value_type).shape
    _, _, n0, k0 = tiles[-1]
    return ir.RankedTensorType.get([n // n0, k // k0, n0, k0], ir.RankedTensorType(value_type).element_type)


@register("pack-weights", "products against weights and adapter state in the CPU's mmt4d layout, "
          "packed once off the request path", options=PackWeightsOptions, context="iree")
def run(module_op, options, stats) -> None:
    with module_op.context, module_op.location:
        _pack_weights(module_op, CpuTarget(options.cpu).mmt4d_tiles, stats)


def _pack_weights(module_op, tiles_for, stats) -> None:
    retyped = []
    # Adapter state first: an @adapter result is packed only when every
    # request-time function receiving it can use the packed layout.
    state = collections.defaultdict(list)  # (program, result) -> [(func, argument, matmuls)]
    for func in facts.stage_functions(module_op, "dynamic"):
        for arg in facts.state_arguments(func):
            state[(facts.get(func, facts.PROGRAM), facts.adapter_result(func, arg))].append(
                (func, arg, _packable_products(arg, tiles_for)))
    for (program, result), uses in state.items():
        adapter = facts.stage_function(module_op, "adapter", program)
        if adapter is None or any(m is None for _, _, m in uses) or not any(m for _, _, m in uses):
            continue
        tiles = tiles_for(str(ir.RankedTensorType(uses[0][1].type).element_type))
        if len({str(a.type) for _, a, _ in uses}) != 1:
            continue
        ret = list(adapter.regions[0].blocks[0].operations)[-1]
        with ir.InsertionPoint(ret), ret.location:
            ret.operands[result] = _pack_rhs(ret.operands[result], *tiles[-1][2:])
        retyped.append(adapter)
        for func, arg, matmuls in uses:
            arg.set_type(_packed_type(arg.type, tiles))
            retyped.append(func)
            for matmul in matmuls:
                _rewrite_matmul(matmul, arg, tiles)
                stats["pack-weights"] += 1
    # Immutable globals: each load's pack is hoisted by IREE to load time
    # (a mutable one, such as a slot table, would be packed on every call).
    immutable = {ir.StringAttr(op.operation.attributes["sym_name"]).value
                 for op in module_op.regions[0].blocks[0].operations
                 if op.operation.name == "util.global" and "is_mutable" not in op.operation.attributes}
    for func in facts.stage_functions(module_op, "dynamic"):
        loads = [op.operation for op in func.regions[0].blocks[0].operations
                 if op.operation.name == "util.global.load"
                 and ir.FlatSymbolRefAttr(op.operation.attributes["global"]).value in immutable]
        for load in loads:
            weight = load.results[0]
            matmuls = _packable_products(weight, tiles_for)
            if not matmuls:
                continue
            tiles = tiles_for(str(ir.RankedTensorType(weight.type).element_type))
            with ir.InsertionPoint.after(load), load.location:
                rhs = _pack_rhs(weight, *tiles[-1][2:])
            for matmul in matmuls:
                _rewrite_matmul(matmul, rhs, tiles)
                stats["pack-weights"] += 1
    for func in retyped:
        retype(func)
