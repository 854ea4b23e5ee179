"""bt-gather: per-row tenants. In the "factorized" program, each
adapter-time value used at request time is gathered by the adapter slot of
each request row: the stack it indexes is the value's per-slot copies
(`stack = "slots"`), which bt-split makes resident state.

    %l = "bt.lift"(%at) {from = adapter, to = dynamic, name = "adapter.0"}
    %y = torch.aten.matmul %x, %l : [B,T,K], [K,N] -> [B,T,N]
  → %g = "bt.gather"(%at, %adapter_ids) {from = adapter, to = dynamic, name = "adapter.0",
                                          stack = "slots"} : [K,N], [?] -> [?,K,N]
    %y = torch.aten.matmul %x, %g : [B,T,K], [?,K,N] -> [B,T,N]  // row b uses %g[b]

`adapter_ids` ([?] si64, one slot per row) becomes the last request input.
Rows are the leading dimension of the product's input (a 2-D input is
unsqueezed to [B,1,K]); when an input's leading dimension is not the request
rows, the batch dimensions disagree and the residual fails at run time
instead of mixing tenants. An adapter-time value used any other way cannot
be served per row and is an error.
"""

from torch_mlir import ir
from torch_mlir.dialects import torch as torch_d

from stageml.binding_time import BindingTime
from stageml.compiler.ir import (NAME, TIME, const_int, parse_time, set_arg_attr, set_op_time,
                                 time_attr, users, vtensor_shape,
                                 vtensor_type)
from stageml.compiler import facts
from stageml.compiler.passes import program_of, programs, register
from stageml.errors import CompileError

IDS = facts.IDS
SLOTS = "slots"  # bt.gather's stack: the per-slot copies of an adapter-time value


def _ids_argument(func) -> ir.Value:
    block = func.regions[0].blocks[0]
    ids = block.add_argument(vtensor_type([None], "si64"), func.location)
    set_arg_attr(func, ids.arg_number, NAME, ir.StringAttr.get(IDS))
    set_arg_attr(func, ids.arg_number, TIME, time_attr(BindingTime.DYNAMIC))
    facts.retype_inputs(func)
    return ids


def _timed(op):
    set_op_time(op.operation, BindingTime.DYNAMIC)
    return op.result


def _per_row_product(product, rows: ir.Value) -> None:
    """matmul(x, w) → matmul(x, rows) with rows[b] the matrix of row b."""
    x = product.operands[0]
    x_dims, dtype = vtensor_shape(x.type)
    k, n = vtensor_shape(rows.type)[0][1:]
    with ir.InsertionPoint(product), product.location:
        if len(x_dims) == 2:
            x3 = _timed(torch_d.AtenUnsqueezeOp(vtensor_type([x_dims[0], 1, k], dtype), x, const_int(1, annotate=True)))
            y3 = _timed(torch_d.AtenMatmulOp(vtensor_type([x_dims[0], 1, n], dtype), x3, rows))
            y = _timed(torch_d.AtenSqueezeDimOp(product.results[0].type, y3, const_int(1, annotate=True)))
        else:
            for _ in range(len(x_dims) - 3):  # [B,K,N] → [B,1,...,K,N] to broadcast over middle dims
                dims = vtensor_shape(rows.type)[0]
                rows = _timed(torch_d.AtenUnsqueezeOp(vtensor_type(dims[:1] + [1] + dims[1:], dtype),
                                                      rows, const_int(1, annotate=True)))
            y = _timed(torch_d.AtenMatmulOp(product.results[0].type, x, rows))
    product.results[0].replace_all_uses_with(y)
    product.erase()


def gather(func) -> int:
    """Turns every adapter→dynamic lift into a bt.gather; returns how many."""
    block = func.regions[0].blocks[0]
    lifts = [op.operation for op in block.operations if op.operation.name == "bt.lift"
             and parse_time(op.operation.attributes["from"]) == BindingTime.ADAPTER
             and parse_time(op.operation.attributes["to"]) == BindingTime.DYNAMIC]
    if not lifts:
        return 0
    ids = _ids_argument(func)
    for lift in lifts:
        name = ir.StringAttr(lift.attributes["name"]).value
        dims, dtype = vtensor_shape(lift.results[0].type)
        products = users(lift.results[0])
        for user in products:
            if user.name == "torch.aten.index_select":
                raise CompileError(f"adapter state {name!r} is an expert stack indexed by routed ids (LoRA on "
                                   "MoE experts, PEFT target_parameters): multi-tenant compiles do not serve "
                                   "per-tenant expert LoRA yet; compile without max_adapters (one adapter, "
                                   "merged into the experts at adapter load)")
            if (user.name != "torch.aten.matmul" or len(dims) != 2 or user.operands[1] != lift.results[0]
                    or user.operands[0] == lift.results[0] or len(vtensor_shape(user.operands[0].type)[0]) < 2):
                raise CompileError(f"{user.location}: adapter state {name!r} is used by '{user.name}', which "
                                   "cannot be served per request row; only products x @ W with an adapter-time W can")
        with ir.InsertionPoint(lift), lift.location:
            rows = ir.Operation.create(
                "bt.gather", results=[vtensor_type([None] + dims, dtype)], operands=[lift.operands[0], ids],
                attributes={"from": lift.attributes["from"], "to": lift.attributes["to"],
                            "name": lift.attributes["name"], "stack": ir.StringAttr.get(SLOTS),
                            TIME: lift.attributes[TIME]})
        for product in products:
            _per_row_product(product, rows.result)
        lift.erase()
    return len(lifts)


@register("bt-gather", "per-row tenants: adapter state used at request time is gathered by row slots")
def run(module_op, options, stats) -> None:
    for func in programs(module_op):
        if program_of(func) == facts.FACTORIZED:
            stats["gathered"] += gather(func)
