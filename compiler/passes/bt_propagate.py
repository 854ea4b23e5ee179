"""bt-propagate: binding-time analysis.

Every operation gets the join of its operands' binding times; constants are
static; an operation with side effects, regions or unknown semantics is
dynamic. This is the least congruent annotation (DESIGN.md):

    %t = torch.aten.transpose.int %w, ...   // %w static
    %y = torch.aten.matmul %x, %t           // %x dynamic
  → %t = ... {bt.time = #bt.time<"static">}
    %y = ... {bt.time = #bt.time<"dynamic">}
"""

from stageml.compiler.ir import op_time, set_op_time
from stageml.compiler.passes import programs, register



def propagate(func) -> None:
    for op in func.regions[0].blocks[0].operations:
        if op.operation.name != "func.return":
            set_op_time(op.operation, op_time(op.operation))


@register("bt-propagate", "binding-time analysis: each op gets the join of its operands")
def run(module_op, options, stats) -> None:
    for func in programs(module_op):
        propagate(func)
