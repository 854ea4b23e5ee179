"""bt-annotate: give every function argument its binding time.

    func @main(%w {bt.name = "fc.weight"}, %x {bt.name = "x"})
  → func @main(%w {bt.name = "fc.weight", bt.time = #bt.time<"static">},
               %x {bt.name = "x", bt.time = #bt.time<"dynamic">})

Times come from the resolved stage spec (`options.stages`, name → time);
arguments it does not name are dynamic.
"""

from stageml.binding_time import BindingTime
from stageml.compiler.ir import TIME, arg_name, set_arg_attr, time_attr
from stageml.compiler.passes import main_func, register


def annotate(func, stages: dict) -> None:
    for index in range(len(func.regions[0].blocks[0].arguments)):
        time = stages.get(arg_name(func, index), BindingTime.DYNAMIC)
        set_arg_attr(func, index, TIME, time_attr(time))


@register("bt-annotate", "binding times of arguments from the stage spec")
def run(module_op, options) -> None:
    annotate(main_func(module_op), options.stages)
