"""expert-factors: in the factorized program, expert LoRA stays factored per row.

lora-sites leaves an expert site as the merged stack `W + bmm(L, R)`
(adapter-time; the main program serves it merged). In the factorized
program each product of a routed row with its expert's merged matrix
becomes the base expert's product plus the row's low-rank product, so the
per-tenant factors (rank R per expert) are what the request path reads,
never a merged stack per tenant:

    %m = torch.aten.add.Tensor %W, (bmm %L, %R)        // [E,out,in], adapter
    %s = torch.aten.permute %m, [0,2,1]                // [E,in,out]
    %y = bmm %x, (index_select %s, 0, %ids)            // x: [N,1,in], dynamic
  → %y = add (bmm %x, (index_select (permute %W), 0, %ids)),            // static stack
             (bmm (bmm %x, (index_select (permute %R), 0, %ids)),       // [E,in,R]
                  (index_select (permute %L), 0, %ids))                  // [E,R,out]

(a stack used as it is, `W + bmm(L, R)` with W [E,in,out], multiplies by L
then R). bt-lift then lifts the base stack (a bt.gather of its leading dim,
bt-stacks') and the factors, which bt-gather indexes per row by tenant slot
and expert.
"""

from torch_mlir import ir
from torch_mlir.dialects import torch as torch_d

from stageml.binding_time import BindingTime
from stageml.compiler import facts
from stageml.compiler.ir import (const_int, constant, defining_op, erase_dead_ops, timed, users, value_time,
                                 vtensor_shape, vtensor_type)
from stageml.compiler.passes import program_of, programs, register


def _merged_stack(value):
    """(W, L, R) when `value` is lora-sites' merged expert stack W + bmm(L, R), else None."""
    op = defining_op(value)
    if op is None or op.name != "torch.aten.add.Tensor" or value_time(value) != BindingTime.ADAPTER:
        return None
    w, delta = op.operands[0], defining_op(op.operands[1])
    if value_time(w) != BindingTime.STATIC or delta is None or delta.name != "torch.aten.bmm":
        return None
    return w, delta.operands[0], delta.operands[1]


def _swaps_last_two(op) -> bool:
    """Whether `op` is a permute [0, 2, 1] (or transpose of dims 1 and 2) of a 3-D value."""
    if op.name == "torch.aten.transpose.int":
        dims = [constant(v) for v in op.operands[1:]]
        return sorted(d % 3 for d in dims if d is not None) == [1, 2]
    if op.name == "torch.aten.permute":
        listed = defining_op(op.operands[1])
        return listed is not None and [constant(v) for v in listed.operands] == [0, 2, 1]
    return False


def _transposed(value) -> ir.Value:
    (e, p, q), dtype = vtensor_shape(value.type)
    one, two = const_int(1, annotate=True), const_int(2, annotate=True)
    return timed(torch_d.AtenTransposeIntOp(vtensor_type([e, q, p], dtype), value, one, two))


def _row_product(x, stack, ids, type_) -> ir.Value:
    """bmm(x, index_select(stack, 0, ids))."""
    dims, dtype = vtensor_shape(stack.type)
    rows = timed(torch_d.AtenIndexSelectOp(vtensor_type([vtensor_shape(ids.type)[0][0]] + dims[1:], dtype),
                                            stack, const_int(0, annotate=True), ids))
    return timed(torch_d.AtenBmmOp(type_, x, rows))


def factor(func) -> int:
    """Rewrites the products with merged expert stacks; returns how many."""
    count = 0
    for op in list(func.regions[0].blocks[0].operations):
        op = op.operation
        if op.name != "torch.aten.index_select" or constant(op.operands[1]) != 0:
            continue
        stack, permuted = op.operands[0], False
        layout = defining_op(stack)
        if layout is not None and _swaps_last_two(layout):
            stack, permuted = layout.operands[0], True
        merged = _merged_stack(stack)
        products = users(op.results[0])
        if merged is None or not products or any(p.name != "torch.aten.bmm" or p.operands[1] != op.results[0]
                                                  for p in products):
            continue
        w, left, right = merged
        for product in products:
            x, type_ = product.operands[0], product.results[0].type
            _, dtype = vtensor_shape(type_)
            with ir.InsertionPoint(product), product.location:
                base_stack = _transposed(w) if permuted else w
                first, second = (_transposed(right), _transposed(left)) if permuted else (left, right)
                rank = vtensor_shape(first.type)[0][2]
                base = _row_product(x, base_stack, op.operands[2], type_)
                low = _row_product(x, first, op.operands[2],
                                   vtensor_type(vtensor_shape(x.type)[0][:2] + [rank], dtype))
                delta = _row_product(low, second, op.operands[2], type_)
                total = timed(torch_d.AtenAddTensorOp(type_, base, delta, const_int(1, annotate=True)))
            product.results[0].replace_all_uses_with(total)
            product.erase()
            count += 1
    erase_dead_ops(func.regions[0].blocks[0])  # the merged stacks
    return count


@register("expert-factors", "factorized program: products with merged expert stacks as base + per-row LoRA")
def run(module_op, options, stats) -> None:
    for func in programs(module_op):
        if program_of(func) == facts.FACTORIZED:
            stats["expert-factors"] += factor(func)
