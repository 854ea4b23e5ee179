"""group-experts: a long batch of routed rows reads each expert's matrix once per
block of rows, not once per row.

A routed product multiplies each row by its expert's matrix, gathered by the
routed ids (`bmm(x, index_select(W, 0, e))`; fuse-gathers reads W in place):
N rows read N matrices. Placed in blocks of B rows of one expert each, they
read at most N/B + E (the grouped GEMM of MoE kernels): on a 2-vCPU EPYC with
8 experts of 1024x2048 f32, 1024 rows took 339 ms grouped in blocks of 64
against 1684 ms row by row (256 rows: 178 against 375 ms). A few rows are
cheaper row by row (a block computes B rows), so the rewrite branches on N,
in each request-time function, for an expert stack that is a parameter or
adapter state (not a slot table: those hold per-row factors); where N is
static (a compile without dynamic shapes), the branch is taken now:

    %g = torch.aten.index_select %W, 0, %e : [E,K,O], [?] -> [?,K,O]
    %y = torch.aten.bmm %x, %g             : [?,1,K], [?,K,O] -> [?,1,O]
  → %y = torch.prim.If (size(%e, 0) >= min-rows) {
      %h = to.dtype (eq (unsqueeze %e, 1), iota(E)), int64            // [N,E] one-hot
      %padded = floor(sum(%h, 0) + B-1, B)·B ; %ends = cumsum %padded ; %starts = %ends - %padded
      %pos = sum((%starts + cumsum(%h, 0) - 1)·%h, 1)                  // [N]: row r's place
      %xp = index_put (zeros [(N/B + E)·B, K]), (%pos), (view %x [N,K])  // rows of an expert together
      %be = clamp (sum (%ends <= arange(N/B + E)·B, 1)), max = E-1      // each block's expert
      %yb = bmm (view %xp [N/B+E, B, K]), (index_select %W, 0, %be)
      yield view (index_select (view %yb [(N/B+E)·B, O]), 0, %pos), [N,1,O]
    } else { yield bmm %x, (index_select %W, 0, %e) }
  (N static: the first region's value if N >= min-rows, else %y unchanged)

(The blocks past the last expert's are zero rows multiplied by expert E-1.)
"""

import dataclasses

import numpy as np
from torch_mlir import ir
from torch_mlir.dialects import torch as torch_d

from stageml.compiler import facts
from stageml.compiler.ir import const_int, constant, defining_op, users, vtensor_shape, vtensor_type
from stageml.compiler.passes import register

_INT64 = 4  # torch's dtype code of int64
_STACKS = (facts.PARAMETER, facts.STATE)  # expert stacks a block reads whole (not per-row slot tables)


@dataclasses.dataclass(frozen=True)
class GroupExpertsOptions:
    block: int = 64      # rows of one expert per block
    min_rows: int = 128  # from this many routed rows on, products are grouped


def _ints(values) -> ir.Value:
    return torch_d.PrimListConstructOp(ir.Type.parse("!torch.list<int>"),
                                       [const_int(v) if isinstance(v, int) else v for v in values]).result


def _stack(func, value):
    """The expert stack argument [E, K, O] `value` (an index_select's source) is, else None."""
    if defining_op(value) is not None or ir.BlockArgument(value).owner.owner.operation != func:
        return None
    dims, _ = vtensor_shape(value.type)
    kind = facts.facts(func, "arg", ir.BlockArgument(value).arg_number).get("kind")
    return value if kind in _STACKS and len(dims) == 3 and None not in dims else None


def _grouped(x, w, e, block: int, type_) -> ir.Value:
    """bmm(x, index_select(w, 0, e)), of type `type_`, computed in blocks of `block` rows of one expert."""
    (experts, k, o), dtype = vtensor_shape(w.type)
    rows_dim = vtensor_shape(e.type)[0][0]  # the dims of rows, blocks and capacity: static where the rows are
    blocks_dim = None if rows_dim is None else rows_dim // block + experts
    capacity_dim = None if blocks_dim is None else blocks_dim * block
    none, false = torch_d.ConstantNoneOp().result, torch_d.ConstantBoolOp(False).result
    zero, one = const_int(0), const_int(1)

    def long(dims):
        return vtensor_type(dims, "si64")

    n = torch_d.AtenSizeIntOp(e, zero).result
    iota = torch_d.ValueTensorLiteralOp(ir.DenseElementsAttr.get(
        np.arange(experts, dtype=np.int64), signless=False, type=ir.IntegerType.get_signed(64))).result
    column = torch_d.AtenUnsqueezeOp(long([rows_dim, 1]), e, one).result
    hits = torch_d.AtenEqTensorOp(vtensor_type([rows_dim, experts], "i1"), column, iota).result
    onehot = torch_d.AtenToDtypeOp(long([rows_dim, experts]), hits, const_int(_INT64), false, false, none).result
    rank = torch_d.AtenCumsumOp(long([rows_dim, experts]), onehot, zero, none).result
    counts = torch_d.AtenSumDimIntListOp(long([experts]), onehot, _ints([0]), false, none).result
    rounded = torch_d.AtenAddScalarOp(long([experts]), counts, const_int(block - 1), one).result
    divisor = torch_d.ValueTensorLiteralOp(ir.DenseElementsAttr.get_splat(
        ir.RankedTensorType.get([], ir.IntegerType.get_signed(64)),
        ir.IntegerAttr.get(ir.IntegerType.get_signed(64), block))).result
    blocks_of = torch_d.AtenDivTensorModeOp(long([experts]), rounded, divisor, torch_d.ConstantStrOp("floor").result).result
    padded = torch_d.AtenMulScalarOp(long([experts]), blocks_of, const_int(block)).result
    ends = torch_d.AtenCumsumOp(long([experts]), padded, zero, none).result
    starts = torch_d.AtenSubTensorOp(long([experts]), ends, padded, one).result
    first = torch_d.AtenAddTensorOp(long([rows_dim, experts]),
                                    torch_d.AtenUnsqueezeOp(long([1, experts]), starts, zero).result, rank, one).result
    place = torch_d.AtenSubScalarOp(long([rows_dim, experts]), first, one, one).result
    pos = torch_d.AtenSumDimIntListOp(long([rows_dim]),
                                      torch_d.AtenMulTensorOp(long([rows_dim, experts]), place, onehot).result,
                                      _ints([1]), false, none).result
    count = torch_d.AtenAddIntOp(torch_d.AtenFloordivIntOp(n, const_int(block)).result, const_int(experts)).result
    capacity = torch_d.AtenMulIntOp(count, const_int(block)).result
    fill = torch_d.ValueTensorLiteralOp(ir.DenseElementsAttr.get_splat(
        ir.RankedTensorType.get([], ir.Type.parse(dtype)), ir.FloatAttr.get(ir.Type.parse(dtype), 0.0))).result
    zeros = torch_d.AtenBroadcastToOp(vtensor_type([capacity_dim, k], dtype), fill, _ints([capacity, k])).result
    rows = torch_d.AtenViewOp(vtensor_type([rows_dim, k], dtype), x, _ints([n, k])).result
    indices = torch_d.PrimListConstructOp(ir.Type.parse("!torch.list<vtensor>"), [pos]).result
    placed = torch_d.AtenIndexPutHackedTwinOp(vtensor_type([capacity_dim, k], dtype), zeros, indices, rows,
                                              false).result
    cpu = torch_d.ConstantDeviceOp("cpu").result
    starts_of = torch_d.AtenMulScalarOp(long([blocks_dim]), torch_d.AtenArangeStartStepOp(
        long([blocks_dim]), zero, count, one, none, zero, cpu, false).result, const_int(block)).result
    behind = torch_d.AtenLeTensorOp(vtensor_type([blocks_dim, experts], "i1"),
                                    torch_d.AtenUnsqueezeOp(long([1, experts]), ends, zero).result,
                                    torch_d.AtenUnsqueezeOp(long([blocks_dim, 1]), starts_of, one).result).result
    owner = torch_d.AtenClampOp(long([blocks_dim]), torch_d.AtenSumDimIntListOp(
        long([blocks_dim]), behind, _ints([1]), false, none).result, none, const_int(experts - 1)).result
    matrices = torch_d.AtenIndexSelectOp(vtensor_type([blocks_dim, k, o], dtype), w, zero, owner).result
    blocks = torch_d.AtenViewOp(vtensor_type([blocks_dim, block, k], dtype), placed, _ints([count, block, k])).result
    products = torch_d.AtenBmmOp(vtensor_type([blocks_dim, block, o], dtype), blocks, matrices).result
    flat = torch_d.AtenViewOp(vtensor_type([capacity_dim, o], dtype), products, _ints([capacity, o])).result
    back = torch_d.AtenIndexSelectOp(vtensor_type([rows_dim, o], dtype), flat, zero, pos).result
    return torch_d.AtenViewOp(type_, back, _ints([n, 1, o])).result


def _routed_products(func) -> list:
    """(select, [bmm users]) for each row gather of an expert stack used only by one-row products."""
    found = []
    for op in func.regions[0].blocks[0].operations:
        op = op.operation
        if op.name != "torch.aten.index_select" or constant(op.operands[1]) != 0 or _stack(func, op.operands[0]) is None:
            continue
        products = users(op.results[0])
        if products and all(p.name == "torch.aten.bmm" and p.operands[1] == op.results[0]
                            and vtensor_shape(p.operands[0].type)[0][1:2] == [1] for p in products):
            found.append((op, products))
    return found


def _by_rows(x, select, type_, options: GroupExpertsOptions) -> ir.Value:
    """bmm(x, `select`: index_select(w, 0, e)), grouped where e has min-rows rows or more (a prim.If on them)."""
    w, e = select.operands[0], select.operands[2]
    long = torch_d.AtenGeIntOp(torch_d.AtenSizeIntOp(e, const_int(0)).result, const_int(options.min_rows)).result
    branch = torch_d.PrimIfOp([type_], long)
    with ir.InsertionPoint(branch.regions[0].blocks.append()):
        torch_d.PrimIfYieldOp([_grouped(x, w, e, options.block, type_)])
    with ir.InsertionPoint(branch.regions[1].blocks.append()):
        rows = torch_d.AtenIndexSelectOp(select.results[0].type, w, const_int(0), e).result
        torch_d.PrimIfYieldOp([torch_d.AtenBmmOp(type_, x, rows).result])
    return branch.results[0]


def group(func, options: GroupExpertsOptions) -> int:
    """Rewrites `func`'s routed products; returns how many."""
    count = 0
    for select, products in _routed_products(func):
        w, e = select.operands[0], select.operands[2]
        static_rows = vtensor_shape(e.type)[0][0]
        if static_rows is not None and static_rows < options.min_rows:
            continue  # a few rows, known now: the per-row products stay
        for product in products:
            x, type_ = product.operands[0], product.results[0].type
            with ir.InsertionPoint(product), product.location:
                y = (_by_rows(x, select, type_, options) if static_rows is None
                     else _grouped(x, w, e, options.block, type_))
            product.results[0].replace_all_uses_with(y)
            product.erase()
            count += 1
        select.erase()
    return count


@register("group-experts", "long batches of routed rows: expert products in blocks of rows of one expert",
          options=GroupExpertsOptions)
def run(module_op, options, stats) -> None:
    for func in facts.stage_functions(module_op, "dynamic"):
        stats["group-experts"] += group(func, options)
