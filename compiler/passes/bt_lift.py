"""bt-lift: make every stage crossing an explicit `bt.lift`.

    %t = torch.aten.transpose.int %w, ... {bt.time = #bt.time<"static">}
    %y = torch.aten.matmul %x, %t {bt.time = #bt.time<"dynamic">}
  → %t = ...
    %l = "bt.lift"(%t) {from = #bt.time<"static">, to = #bt.time<"dynamic">,
                        name = "static.0", bt.time = #bt.time<"dynamic">}
    %y = torch.aten.matmul %x, %l

One lift per (value, later time), shared by all its users there. A lifted
argument keeps its model name; computed values are named `<time>.<n>`,
after `<program>.` in programs other than "main" (`factorized.adapter.0`).
Constants (and non-tensor values computed from them) are not lifted: bt-split
clones them into each stage that uses them. The function's results are
request-time, so an earlier-time result is lifted to dynamic.
"""

from torch_mlir import ir

from stageml.binding_time import BindingTime
from stageml.compiler.ir import (TIME, arg_name, is_rematerializable, is_tensor, parse_time, time_attr,
                                 value_time)
from stageml.compiler.passes import program_of, programs, register
from stageml.compiler.facts import MAIN
from stageml.errors import CompileError


def _lift_name(func, value, counters: dict, names: dict, prefix: str) -> str:
    key = value
    if key not in names:
        if isinstance(value.owner, ir.Block):
            names[key] = arg_name(func, ir.BlockArgument(value).arg_number)
        else:
            time = value_time(value)
            names[key] = f"{prefix}{time.label}.{counters.get(time, 0)}"
            counters[time] = counters.get(time, 0) + 1
    return names[key]


def lift(func, prefix: str = "") -> dict:
    """Inserts the lifts; returns {(from, to): count}. Computed values are
    named `<prefix><time>.<n>`."""
    block = func.regions[0].blocks[0]
    lifts, counters, names, crossings = {}, {}, {}, {}
    for op in list(block.operations):
        op = op.operation
        if op.name == "bt.lift":
            continue
        to = parse_time(op.attributes[TIME]) if TIME in op.attributes else BindingTime.DYNAMIC  # (func.return: dynamic)
        for index, value in enumerate(op.operands):
            source = value_time(value)
            if source >= to or is_rematerializable(value):
                continue
            if not is_tensor(value):
                raise CompileError(f"{op.location}: a non-tensor value computed at {source.label} "
                                   f"time is used at {to.label} time; StageML can only carry tensors across stages")
            key = (value, to)
            if key not in lifts:
                name = _lift_name(func, value, counters, names, prefix)
                with ir.InsertionPoint(op), op.location:
                    lifted = ir.Operation.create(
                        "bt.lift", results=[value.type], operands=[value],
                        attributes={"from": time_attr(source), "to": time_attr(to),
                                    "name": ir.StringAttr.get(name), TIME: time_attr(to)})
                lifts[key] = lifted.result
                crossings[(source, to)] = crossings.get((source, to), 0) + 1
            op.operands[index] = lifts[key]
    return crossings


@register("bt-lift", "explicit bt.lift ops where a value crosses to a later stage")
def run(module_op, options, stats) -> None:
    for func in programs(module_op):
        program = program_of(func)
        for (source, to), count in lift(func, "" if program == MAIN else program + ".").items():
            stats[f"lifted {source.label}->{to.label}"] += count
