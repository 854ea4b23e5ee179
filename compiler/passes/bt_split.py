"""bt-split: outline one function per binding time.

    func @main(%w {static}, %a {adapter}, %x {dynamic}) {
      %t = transpose %w                       // static
      %l0 = "bt.lift"(%t) {to = adapter, name = "static.0"}
      %m = add %l0, %a                        // adapter
      %l1 = "bt.lift"(%m) {to = dynamic, name = "adapter.0"}
      %y = matmul %x, %l1                     // dynamic
      return %y }
  → func @static(%w) -> (%t {bt.name = "static.0"})
    func @adapter(%static.0, %a) -> (%m {bt.name = "adapter.0"})
    func @forward(%adapter.0, %x) -> %y

A `bt.gather` of adapter state makes that state a result of @adapter and a
table argument of @forward (one entry per adapter slot, `bt.table`), which
@forward indexes by the rows' slots:

    %g = "bt.gather"(%m, %ids) {name = "adapter.0"}      // in @main
  → func @adapter(...) -> (%m {bt.name = "adapter.0"})
    func @forward(%adapter.0 {bt.table}, ..., %ids) {
      %g = torch.aten.index_select %adapter.0, 0, %ids ... }

Arguments of a later stage are, in order: values lifted from static, values
lifted from adapter, then the model's arguments of that time; each carries
`bt.name` and `bt.time` (the time it comes from); an unused static or
adapter-time argument (an inactive adapter's weights) is dropped. A static argument used
later as it is (an embedding table) is not routed through @static: the
later stage names the parameter itself. Constants are cloned into
each stage that uses them. @static and @adapter are left out when they have
no results.
"""

from torch_mlir import ir
from torch_mlir.dialects import func as func_d
from torch_mlir.dialects import torch as torch_d

from stageml.binding_time import BindingTime
from stageml.compiler.ir import (NAME, TABLE, TIME, arg_attrs, arg_name, const_int,
                                 is_rematerializable, parse_time, set_arg_attr, set_op_time,
                                 time_attr, users, value_time)
from stageml.compiler.passes import main_func, register

STAGE_FUNCS = {BindingTime.STATIC: "static", BindingTime.ADAPTER: "adapter",
               BindingTime.DYNAMIC: "forward"}


def _lift_info(op):
    a = op.attributes
    return parse_time(a["from"]), parse_time(a["to"]), ir.StringAttr(a["name"]).value


class _Stage:
    """One stage function being built: its inputs, body ops and outputs."""

    def __init__(self, time):
        self.time = time
        self.inputs = {}    # name -> (value used in @main, from-time or None for arguments)
        self.outputs = {}   # name -> source value in @main
        self.gathers = {}   # name -> bt.gather op in @main, whose table is an input
        self.ops = []


def _plan(main) -> dict:
    block = main.regions[0].blocks[0]
    stages = {t: _Stage(t) for t in BindingTime}
    for op in block.operations:
        op = op.operation
        if op.name == "bt.lift":
            source, to, name = _lift_info(op)
            stages[to].inputs.setdefault(name, (op.result, source))
            if source != BindingTime.STATIC or not isinstance(op.operands[0].owner, ir.Block):
                stages[source].outputs.setdefault(name, op.operands[0])
        elif op.name == "bt.gather":
            source, to, name = _lift_info(op)
            stages[to].inputs.setdefault(name, (op.result, source))
            stages[to].gathers[name] = op
            stages[source].outputs.setdefault(name, op.operands[0])
        elif op.name != "func.return" and TIME in op.attributes and not (
                len(op.results) == 1 and is_rematerializable(op.results[0])):  # cloned where used
            stages[parse_time(op.attributes[TIME])].ops.append(op)
    for stage in stages.values():  # lifted values first (static, adapter), then arguments
        stage.inputs = dict(sorted(stage.inputs.items(), key=lambda kv: kv[1][1]))
    for arg in block.arguments:
        if value_time(arg) == BindingTime.DYNAMIC or users(arg):  # unused weights are dropped
            stages[value_time(arg)].inputs[arg_name(main, arg.arg_number)] = (arg, None)
    return stages


def _emit(stage, main, results) -> None:
    types = [v.type for v, _ in stage.inputs.values()]
    func = func_d.FuncOp(STAGE_FUNCS[stage.time], ir.FunctionType.get(types, [v.type for v in results]))
    entry = func.add_entry_block()
    mapping = {}
    for index, (name, (value, source)) in enumerate(stage.inputs.items()):
        mapping[value] = entry.arguments[index]
        set_arg_attr(func.operation, index, NAME, ir.StringAttr.get(name))
        set_arg_attr(func.operation, index, TIME, time_attr(source if source is not None else stage.time))
        if source is None:
            for key, attr in arg_attrs(main, value.arg_number).items():
                if key not in (NAME, TIME):
                    set_arg_attr(func.operation, index, key, attr)

    with ir.InsertionPoint(entry):
        for name, gather in stage.gathers.items():
            index = list(stage.inputs).index(name)
            set_arg_attr(func.operation, index, TABLE, ir.UnitAttr.get())
            rows = torch_d.AtenIndexSelectOp(gather.result.type, entry.arguments[index], const_int(0, annotate=True),
                                             mapping[gather.operands[1]])
            set_op_time(rows.operation, BindingTime.DYNAMIC)
            mapping[gather.result] = rows.result

    def lookup(value):
        if value not in mapping:  # a constant from another stage: clone it here
            assert is_rematerializable(value), "bt-split needs lifted IR (run bt-lift first)"
            clone(value.owner.operation)
        return mapping[value]

    def clone(op):
        operands = [lookup(v) for v in op.operands]
        new = op.clone()
        for index, value in enumerate(operands):
            new.operands[index] = value
        for old, fresh in zip(op.results, new.results):
            mapping[old] = fresh

    with ir.InsertionPoint(entry):
        for op in stage.ops:
            clone(op)
        func_d.ReturnOp([lookup(v) for v in results])
    if stage.time != BindingTime.DYNAMIC:
        func.operation.attributes["res_attrs"] = ir.ArrayAttr.get(
            [ir.DictAttr.get({NAME: ir.StringAttr.get(n)}) for n in stage.outputs])


def split(module_op) -> dict:
    """Replaces @main by @static, @adapter and @forward; returns {stage: op count}."""
    main = main_func(module_op)
    stages = _plan(main)
    returned = list(main.regions[0].blocks[0].operations)[-1].operands
    with ir.InsertionPoint(main), main.location:
        for time in BindingTime:
            stage = stages[time]
            results = list(stage.outputs.values()) if time != BindingTime.DYNAMIC else list(returned)
            if time == BindingTime.DYNAMIC or results:
                _emit(stage, main, results)
    main.erase()
    return {time: len(stage.ops) for time, stage in stages.items()}


@register("bt-split", "outline one function per stage: @static, @adapter, @forward")
def run(module_op, options) -> None:
    split(module_op)
