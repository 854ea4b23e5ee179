"""bt-annotate: give every function argument its binding time.

    func @main(%w {bt.name = "fc.weight"}, %x {bt.name = "x"})
  → func @main(%w {bt.name = "fc.weight", bt.time = #bt.time<"static">},
               %x {bt.name = "x", bt.time = #bt.time<"dynamic">})

Times come from the resolved stage spec (`options.stages`, name → time);
arguments it does not name are dynamic.
"""

import dataclasses

from stageml.binding_time import BindingTime
from stageml.compiler.ir import TIME, arg_name, set_arg_attr, time_attr
from stageml.compiler.passes import programs, register


def annotate(func, stages: dict) -> None:
    for index in range(len(func.regions[0].blocks[0].arguments)):
        time = stages.get(arg_name(func, index), BindingTime.DYNAMIC)
        set_arg_attr(func, index, TIME, time_attr(time))


@dataclasses.dataclass(frozen=True)
class BtAnnotateOptions:
    stages: tuple = ()  # ((argument name, BindingTime), ...), resolved from the stage spec


@register("bt-annotate", "binding times of arguments from the stage spec", options=BtAnnotateOptions)
def run(module_op, options, stats) -> None:
    for func in programs(module_op):
        annotate(func, dict(options.stages))
