"""bt-stacks: an earlier-stage stack indexed by request-time ids is a bt.gather.

A routed MoE layer reads each (token, choice) row's expert matrix out of the
expert stack by the routed id (compiler/experts.py): after bt-lift that is an
`index_select` on dim 0 of a lifted stack. It becomes a `bt.gather` of the
stack's own leading dimension, so the IR says which values are expert stacks
and which ids pick their entries (the facts the (tenant, expert) plans and
the grouped kernels start from); bt-split passes the stack to the request
stage whole and indexes it there:

    %l = "bt.lift"(%w) {from = static, to = dynamic, name = "static.0"} : [E,H,N]
    %g = torch.aten.index_select %l, %int0, %ids : [E,H,N], [?] -> [?,H,N]
  → %g = "bt.gather"(%w, %ids) {from = static, to = dynamic, name = "static.0",
                                stack = "leading"} : [E,H,N], [?] -> [?,H,N]

Only a lift whose one use is such an index_select (by request-time ids) is
rewritten; a stack also used whole keeps its lift. In the factorized program
adapter state is per slot (bt-gather's), so there only static stacks are.
"""

from torch_mlir import ir

from stageml.binding_time import BindingTime
from stageml.compiler.ir import TIME, constant, parse_time, users, value_time
from stageml.compiler import facts
from stageml.compiler.passes import program_of, programs, register

LEADING = "leading"  # bt.gather's stack: the value's own leading dimension


def stacks(func) -> int:
    """Rewrites the function's indexed stacks as bt.gathers; returns how many."""
    count, per_slot = 0, program_of(func) == facts.FACTORIZED
    for op in list(func.regions[0].blocks[0].operations):
        lift = op.operation
        if (lift.name != "bt.lift" or parse_time(lift.attributes["to"]) != BindingTime.DYNAMIC
                or per_slot and parse_time(lift.attributes["from"]) != BindingTime.STATIC):
            continue
        uses = users(lift.results[0])
        if len(uses) != 1 or len(list(lift.results[0].uses)) != 1:
            continue
        select = uses[0]
        if (select.name != "torch.aten.index_select" or select.operands[0] != lift.results[0]
                or constant(select.operands[1]) != 0 or value_time(select.operands[2]) != BindingTime.DYNAMIC):
            continue
        with ir.InsertionPoint(select), select.location:
            gather = ir.Operation.create(
                "bt.gather", results=[select.results[0].type], operands=[lift.operands[0], select.operands[2]],
                attributes={"from": lift.attributes["from"], "to": lift.attributes["to"],
                            "name": lift.attributes["name"], "stack": ir.StringAttr.get(LEADING),
                            TIME: lift.attributes[TIME]})
        select.results[0].replace_all_uses_with(gather.results[0])
        select.erase()
        lift.erase()
        count += 1
    return count


@register("bt-stacks", "earlier-stage stacks indexed by request-time ids (MoE experts) become bt.gather")
def run(module_op, options, stats) -> None:
    for func in programs(module_op):
        stats["stacks"] += stacks(func)
