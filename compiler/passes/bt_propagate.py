"""bt-propagate: binding-time analysis.

Every operation gets the join of its operands' binding times; constants are
static; an operation with side effects, regions or unknown semantics is
dynamic. This is the least congruent annotation (DESIGN.md):

    %t = torch.aten.transpose.int %w, ...   // %w static
    %y = torch.aten.matmul %x, %t           // %x dynamic
  → %t = ... {bt.time = #bt.time<"static">}
    %y = ... {bt.time = #bt.time<"dynamic">}
"""

from stageml.binding_time import BindingTime
from stageml.compiler.ir import is_effectful, set_op_time, value_time
from stageml.compiler.passes import programs, register

def op_time(op) -> BindingTime:
    """The binding time `op` must have, from its operands and its kind."""
    if is_effectful(op) or len(op.regions) > 0 or len(op.results) == 0:
        return BindingTime.DYNAMIC
    return BindingTime.STATIC.join(*(value_time(v) for v in op.operands))


def propagate(func) -> None:
    for op in func.regions[0].blocks[0].operations:
        if op.operation.name != "func.return":
            set_op_time(op.operation, op_time(op.operation))


@register("bt-propagate", "binding-time analysis: each op gets the join of its operands")
def run(module_op, options, stats) -> None:
    for func in programs(module_op):
        propagate(func)
