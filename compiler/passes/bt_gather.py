"""bt-gather: per-row tenants. In the "factorized" program, each
adapter-time value used at request time is gathered by the adapter slot of
each request row: the stack it indexes is the value's per-slot copies
(`stack = "slots"`), which bt-split makes resident state.

    %l = "bt.lift"(%at) {from = adapter, to = dynamic, name = "adapter.0"}
    %y = torch.aten.matmul %x, %l : [B,T,K], [K,N] -> [B,T,N]
  → torch.runtime.assert (B == b)         // b: adapter_ids' rows
    %g = "bt.gather"(%at, %adapter_ids) {from = adapter, to = dynamic, name = "adapter.0",
                                        stack = "slots"} : [K,N], [?] -> [?,K,N]
    %y = torch.aten.matmul %x, %g : [B,T,K], [?,K,N] -> [B,T,N]  // row b uses %g[b]

`adapter_ids` ([?] si64, one slot per row) becomes the last request input.
A 2-D input's N rows take `flatten((unsqueeze %adapter_ids, 1) * ones([b, N / b]))`,
N / b asserted whole.
Rows are the leading dimension of the product's input (a 2-D input is
unsqueezed to [B,1,K]): the request rows, or for a 2-D input a multiple of
them in their order (transformers flattens [B, S] to B·S tokens in MoE
blocks: the router, Qwen2-MoE's shared expert), each taking the slot of its
request row. Any other count fails the call (a runtime assertion), never
reads past the slots. An expert stack's per-expert LoRA factors ([E, in, R], expert-factors')
selected by routed expert ids are gathered by entry (`stack =
"slot_entries"`): a routed row's entry is slot·E + e, its slot that of the
request row its token comes from:

    %f = torch.aten.index_select %l, %int0, %e : [E,K,R], [?] -> [?,K,R]
  → %g = "bt.gather"(%at, slot(%e)·E + %e) {stack = "slot_entries", ...} : [E,K,R], [?] -> [?,K,R]

An adapter-time value used any other way cannot
be served per row and is an error.
"""

from torch_mlir import ir
from torch_mlir.dialects import torch as torch_d

from stageml.binding_time import BindingTime
from stageml.compiler.ir import (NAME, TIME, const_int, parse_time, set_arg_attr, set_op_time, time_attr, timed,
                                 users, vtensor_shape, vtensor_type)
from stageml.compiler import facts
from stageml.compiler.passes import program_of, programs, register
from stageml.errors import CompileError

IDS = facts.IDS
SLOTS = "slots"  # bt.gather's stack: the per-slot copies of an adapter-time value
SLOT_ENTRIES = "slot_entries"  # the entries (slot·E + e) of the per-slot copies of an expert stack
_INT64 = 4  # torch's dtype code of int64
UNEVEN_ROWS = ("a LoRA site's input rows do not line up with the request rows, so its per-row adapters cannot "
               "serve this batch: pass rows that split evenly, or one adapter per call under policy='merged'")


def _ids_argument(func) -> ir.Value:
    block = func.regions[0].blocks[0]
    ids = block.add_argument(vtensor_type([None], "si64"), func.location)
    set_arg_attr(func, ids.arg_number, NAME, ir.StringAttr.get(IDS))
    set_arg_attr(func, ids.arg_number, TIME, time_attr(BindingTime.DYNAMIC))
    facts.retype_inputs(func)
    return ids


def _per_row_product(product, rows: ir.Value) -> None:
    """matmul(x, w) → matmul(x, rows) with rows[b] the matrix of row b."""
    x = product.operands[0]
    x_dims, dtype = vtensor_shape(x.type)
    k, n = vtensor_shape(rows.type)[0][1:]
    with ir.InsertionPoint(product), product.location:
        if len(x_dims) == 2:
            x3 = timed(torch_d.AtenUnsqueezeOp(vtensor_type([x_dims[0], 1, k], dtype), x, const_int(1, annotate=True)))
            y3 = timed(torch_d.AtenMatmulOp(vtensor_type([x_dims[0], 1, n], dtype), x3, rows))
            y = timed(torch_d.AtenSqueezeDimOp(product.results[0].type, y3, const_int(1, annotate=True)))
        else:
            for _ in range(len(x_dims) - 3):  # [B,K,N] → [B,1,...,K,N] to broadcast over middle dims
                dims = vtensor_shape(rows.type)[0]
                rows = timed(torch_d.AtenUnsqueezeOp(vtensor_type(dims[:1] + [1] + dims[1:], dtype),
                                                      rows, const_int(1, annotate=True)))
            y = timed(torch_d.AtenMatmulOp(product.results[0].type, x, rows))
    product.results[0].replace_all_uses_with(y)
    product.erase()


def _row_slots(ids: ir.Value, rows: ir.Value, cache: dict) -> ir.Value:
    """The slot of each row of `rows` (its leading dimension). A 2-D value's rows are the
    request rows or a multiple of them in their order (transformers flattens [B, S] tokens,
    StageML's experts repeat each token k times), each taking the slot of the request row it
    comes from; a higher-rank value's are the request rows. Any other count fails the call
    (an assertion) instead of reading past the slots."""
    if ("slots", rows) not in cache:
        n = timed(torch_d.AtenSizeIntOp(rows, const_int(0, annotate=True)))
        b = timed(torch_d.AtenSizeIntOp(ids, const_int(0, annotate=True)))
        if len(vtensor_shape(rows.type)[0]) > 2:
            set_op_time(torch_d.RuntimeAssertOp(timed(torch_d.AtenEqIntOp(n, b)), UNEVEN_ROWS).operation,
                        BindingTime.DYNAMIC)
            cache["slots", rows] = ids
            return ids
        per = timed(torch_d.AtenFloordivIntOp(n, b))
        whole = timed(torch_d.AtenEqIntOp(timed(torch_d.AtenMulIntOp(b, per)), n))
        set_op_time(torch_d.RuntimeAssertOp(whole, UNEVEN_ROWS).operation, BindingTime.DYNAMIC)
        column = timed(torch_d.AtenUnsqueezeOp(vtensor_type([None, 1], "si64"), ids, const_int(1, annotate=True)))
        sizes = timed(torch_d.PrimListConstructOp(ir.Type.parse("!torch.list<int>"), [b, per]))
        none = timed(torch_d.ConstantNoneOp())
        ones = timed(torch_d.AtenOnesOp(vtensor_type([None, None], "si64"), sizes, const_int(_INT64, annotate=True),
                                        none, none, none))
        # [b, 1] x [b, per]: an elementwise broadcast (broadcast_to's dynamic sizes lower to a gather)
        spread = timed(torch_d.AtenMulTensorOp(vtensor_type([None, None], "si64"), column, ones))
        cache["slots", rows] = timed(torch_d.AtenFlattenUsingIntsOp(vtensor_type([None], "si64"), spread,
                                                                   const_int(0, annotate=True),
                                                                   const_int(1, annotate=True)))
    return cache["slots", rows]


def _slot_gather(lift, slots: ir.Value, dims: list, dtype) -> ir.Value:
    """bt.gather of the lifted value's per-slot copies by `slots`, at the insertion point."""
    return ir.Operation.create(
        "bt.gather", results=[vtensor_type([None] + dims, dtype)], operands=[lift.operands[0], slots],
        attributes={"from": lift.attributes["from"], "to": lift.attributes["to"], "name": lift.attributes["name"],
                    "stack": ir.StringAttr.get(SLOTS), TIME: lift.attributes[TIME]}).result


def _entry_ids(ids: ir.Value, entries: ir.Value, experts: int, cache: dict) -> ir.Value:
    """slot·E + e for each routed row, its slot that of the request row its token comes from."""
    if entries not in cache:
        slots = _row_slots(ids, entries, cache)
        first = timed(torch_d.AtenMulScalarOp(slots.type, slots, const_int(experts, annotate=True)))
        cache[entries] = timed(torch_d.AtenAddTensorOp(slots.type, first, entries, const_int(1, annotate=True)))
    return cache[entries]


def _per_entry(lift, ids, cache: dict) -> None:
    """Each index_select(lift, 0, e) of an expert stack [E, ...] → bt.gather of slot·E + e."""
    experts = vtensor_shape(lift.results[0].type)[0][0]
    for select in users(lift.results[0]):
        with ir.InsertionPoint(select), select.location:
            entry_ids = _entry_ids(ids, select.operands[2], experts, cache)
            rows = ir.Operation.create(
                "bt.gather", results=[select.results[0].type], operands=[lift.operands[0], entry_ids],
                attributes={"from": lift.attributes["from"], "to": lift.attributes["to"],
                            "name": lift.attributes["name"], "stack": ir.StringAttr.get(SLOT_ENTRIES),
                            TIME: lift.attributes[TIME]})
        select.results[0].replace_all_uses_with(rows.results[0])
        select.erase()


def _indexes_entries(user, lift) -> bool:
    """Whether `user` selects entries of the lifted (3-D) stack by request-time ids."""
    return (user.name == "torch.aten.index_select" and user.operands[0] == lift.results[0]
            and len(vtensor_shape(lift.results[0].type)[0]) == 3 and user.operands[2] != lift.results[0])


def gather(func) -> int:
    """Turns every adapter→dynamic lift into a bt.gather; returns how many."""
    block = func.regions[0].blocks[0]
    lifts = [op.operation for op in block.operations if op.operation.name == "bt.lift"
             and parse_time(op.operation.attributes["from"]) == BindingTime.ADAPTER
             and parse_time(op.operation.attributes["to"]) == BindingTime.DYNAMIC]
    if not lifts:
        return 0
    ids, cache = _ids_argument(func), {}
    for lift in lifts:
        name = ir.StringAttr(lift.attributes["name"]).value
        dims, dtype = vtensor_shape(lift.results[0].type)
        products = users(lift.results[0])
        if products and all(_indexes_entries(user, lift) for user in products):
            _per_entry(lift, ids, cache)
            lift.erase()
            continue
        for user in products:
            if (user.name != "torch.aten.matmul" or len(dims) != 2 or user.operands[1] != lift.results[0]
                    or user.operands[0] == lift.results[0] or len(vtensor_shape(user.operands[0].type)[0]) < 2):
                raise CompileError(f"{user.location}: adapter state {name!r} is used by '{user.name}', which "
                                   "cannot be served per request row; only products x @ W with an adapter-time W can")
        for product in products:
            with ir.InsertionPoint(product), product.location:
                _per_row_product(product, _slot_gather(lift, _row_slots(ids, product.operands[0], cache), dims, dtype))
        lift.erase()
    return len(lifts)


@register("bt-gather", "per-row tenants: adapter state used at request time is gathered by row slots")
def run(module_op, options, stats) -> None:
    for func in programs(module_op):
        if program_of(func) == facts.FACTORIZED:
            stats["gathered"] += gather(func)
