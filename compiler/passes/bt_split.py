"""bt-split: outline one function per binding time, for each program.

    func @main(%w {static}, %a {adapter}, %x {dynamic}) attributes {bt.program = "main"} {
      %t = transpose %w                       // static
      %l0 = "bt.lift"(%t) {to = adapter, name = "static.0"}
      %m = add %l0, %a                        // adapter
      %l1 = "bt.lift"(%m) {to = dynamic, name = "adapter.0"}
      %y = matmul %x, %l1                     // dynamic
      return %y }
  → func @static(%w {bt.name = "fc.weight", bt.kind = "parameter"})
        -> (%t {bt.name = "static.0", bt.kind = "parameter"})  attributes {bt.stage = "static", ...}
    func @adapter(%static.0 {bt.kind = "parameter"}, %a {bt.kind = "input"})
        -> (%m {bt.name = "adapter.0", bt.kind = "state"})      attributes {bt.stage = "adapter", ...}
    func @forward(%adapter.0 {bt.kind = "state", bt.result = 0}, %x {bt.kind = "input"})
        -> (%y {bt.name = "output.0", bt.kind = "output"})      attributes {bt.stage = "dynamic", ...}

The facts each function, argument and result carries are compiler/facts.py's;
the stage functions of a program other than "main" are suffixed with it
(`@forward_factorized`). The split IR holds no `#bt.time` any more: a
stage function's ops all belong to its stage.

A `bt.gather` of the per-slot copies of adapter state (`stack = "slots"`)
makes that state resident: a result of @adapter and an argument of
@forward of kind "resident", declared once on the module with its owning
stage, shape (the slot dimension leading, `max_adapters` + 1 entries: slot
0 is the base model) and program; @forward indexes it by the rows' slots.
A `bt.measure` of a value makes it a result of its stage's function of kind
"measure" (with the sites it is about), which no later stage takes.

A gather of a value's own leading dimension (`stack = "leading"`: an expert
stack, bt-stacks') indexes the value itself, passed whole (a static argument
by its own name). Each gather is indexed where it is first used, after its
ids (which the request stage may compute: routed experts):

    %g = "bt.gather"(%m, %ids) {name = "adapter.0", stack = "slots"}    // in @main
  → module attributes {bt.resident = [{name = "adapter.0", owner = "adapter", program = "factorized",
                                       shape = [5, 64, 16], slot_dim = 0, dtype = "float32"}]}
    func @forward(%adapter.0 {bt.kind = "resident"}, ..., %ids) {
      %g = torch.aten.index_select %adapter.0, 0, %ids ... }

Arguments of a later stage are, in order: values lifted from static, values
lifted from adapter, then the model's arguments of that time. An unused
static or adapter-time argument (an inactive adapter's weights) is dropped.
A static argument used later as it is (an embedding table) is not routed
through @static: the later stage names the parameter itself. Constants are
cloned into each stage that uses them. @static and @adapter are left out
when they have no results.
"""

from torch_mlir import ir
from torch_mlir.dialects import func as func_d
from torch_mlir.dialects import torch as torch_d

from stageml.binding_time import BindingTime
from stageml.compiler import facts
from stageml.compiler.ir import (DTYPES, TIME, arg_attrs, arg_name, const_int, is_rematerializable,
                                 parse_time, users, value_time, vtensor_shape, vtensor_type)
from stageml.compiler.passes import program_of, programs, register
from stageml.errors import CompileError

STAGE_FUNCS = {BindingTime.STATIC: "static", BindingTime.ADAPTER: "adapter",
               BindingTime.DYNAMIC: "forward"}  # symbol names only: facts say what a function is


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
        self.measures = {}  # name -> the sites a bt.measure output is about
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
            if source != BindingTime.STATIC or not isinstance(op.operands[0].owner, ir.Block):
                stages[source].outputs.setdefault(name, op.operands[0])
        elif op.name == "bt.measure":
            name = ir.StringAttr(op.attributes["name"]).value
            stage = stages[parse_time(op.attributes[TIME])]
            stage.outputs[name] = op.operands[0]
            stage.measures[name] = [ir.StringAttr(s).value for s in ir.ArrayAttr(op.attributes["sites"])]
        elif op.name != "func.return" and TIME in op.attributes and not (
                len(op.results) == 1 and is_rematerializable(op.results[0])):  # cloned where used
            stages[parse_time(op.attributes[TIME])].ops.append(op)
    for stage in stages.values():  # lifted values first (static, adapter), then arguments
        stage.inputs = dict(sorted(stage.inputs.items(), key=lambda kv: kv[1][1]))
    for arg in block.arguments:
        if value_time(arg) == BindingTime.DYNAMIC or users(arg):  # unused weights are dropped
            stages[value_time(arg)].inputs[arg_name(main, arg.arg_number)] = (arg, None)
    return stages


def _kind(stage, name, source) -> str:
    if source is None:
        return facts.PARAMETER if stage.time == BindingTime.STATIC else facts.INPUT
    if name in stage.gathers and _stack(stage.gathers[name]) in _PER_SLOT:
        return facts.RESIDENT_KIND
    return facts.PARAMETER if source == BindingTime.STATIC else facts.STATE


_PER_SLOT = ("slots", "slot_entries")  # the gathers of resident state


def _stack(gather) -> str:
    return ir.StringAttr(gather.attributes["stack"]).value


def _input_type(stage, name, value) -> ir.Type:
    """The request stage's argument for a stage input: a leading stack whole, a slot
    table [slots, ...] of the gathered value (of an expert stack: [slots, E, ...])."""
    gather = stage.gathers.get(name)
    if gather is None or _stack(gather) == "slots":
        return value.type
    if _stack(gather) == "leading":
        return gather.operands[0].type
    dims, dtype = vtensor_shape(gather.operands[0].type)
    return vtensor_type([None] + dims, dtype)


def _emit(stage, main, results, stages, symbol, result_facts) -> None:
    types = [_input_type(stage, n, v) for n, (v, _) in stage.inputs.items()]
    func = func_d.FuncOp(symbol, ir.FunctionType.get(types, [v.type for v in results]))
    entry = func.add_entry_block()
    mapping, arg_entries = {}, []
    adapter_outputs = list(stages[BindingTime.ADAPTER].outputs)
    for index, (name, (value, source)) in enumerate(stage.inputs.items()):
        if name not in stage.gathers:  # (a gather's rows are indexed out where first used)
            mapping[value] = entry.arguments[index]
        entry_facts = {"name": name, "kind": _kind(stage, name, source)}
        if entry_facts["kind"] == facts.STATE:
            entry_facts["result"] = adapter_outputs.index(name)
        attrs = {k: a for k, a in arg_attrs(main, value.arg_number).items()
                 if not k.startswith("bt.") or k == facts.DIMS} if source is None else {}
        if source is None and facts.MUTATED in arg_attrs(main, value.arg_number):
            entry_facts["kind"] = facts.BUFFER  # a buffer the model mutates (its result has the same name)
        attrs.update({"bt." + k: facts.attribute(ir, v) for k, v in entry_facts.items()})
        arg_entries.append(attrs)
    facts.set_all(func.operation, "arg", arg_entries)

    gathered = {gather.result: name for name, gather in stage.gathers.items()}

    def lookup(value):
        if value in gathered:  # the table indexed by the (request-time) ids
            name = gathered.pop(value)
            table = entry.arguments[list(stage.inputs).index(name)]
            ids = lookup(value.owner.operands[1])
            if _stack(stage.gathers[name]) == "slot_entries":  # [slots, E, ...] as [slots·E, ...]
                dims, dtype = vtensor_shape(table.type)
                table = torch_d.AtenFlattenUsingIntsOp(vtensor_type([None] + dims[2:], dtype), table,
                                                       const_int(0), const_int(1)).result
            mapping[value] = torch_d.AtenIndexSelectOp(value.type, table, const_int(0), ids).result
        elif value not in mapping:  # a constant from another stage: clone it here
            assert is_rematerializable(value), "bt-split needs lifted IR (run bt-lift first)"
            clone(value.owner.operation)
        return mapping[value]

    def clone(op):
        operands = [lookup(v) for v in op.operands]
        new = op.clone()
        for index, value in enumerate(operands):
            new.operands[index] = value
        if TIME in new.attributes:
            del new.attributes[TIME]
        for old, fresh in zip(op.results, new.results):
            mapping[old] = fresh

    with ir.InsertionPoint(entry):
        for op in stage.ops:
            clone(op)
        func_d.ReturnOp([lookup(v) for v in results])
    facts.set_all(func.operation, "res", [{"bt." + k: facts.attribute(ir, v) for k, v in f.items()}
                                          for f in result_facts])
    facts.put(func.operation, facts.STAGE, stage.time.label)
    facts.put(func.operation, facts.PROGRAM, program_of(main))


def _result_facts(stage, stages, main) -> list:
    """The facts of `stage`'s results (a later stage's view of what it returns)."""
    if stage.time == BindingTime.DYNAMIC:
        return [{"name": f"output.{i}", "kind": facts.OUTPUT, **facts.facts(main, "res", i)}
                for i in range(len(list(main.regions[0].blocks[0].operations)[-1].operands))]
    later = [s for s in stages.values() if s.time > stage.time]
    entries = []
    for name in stage.outputs:
        if name in stage.measures:
            entries.append({"name": name, "kind": facts.MEASURE, "sites": stage.measures[name]})
            continue
        kind = facts.PARAMETER if stage.time == BindingTime.STATIC else facts.STATE
        if any(name in s.gathers and _stack(s.gathers[name]) in _PER_SLOT for s in later):
            kind = facts.RESIDENT_KIND
        entries.append({"name": name, "kind": kind})
    return entries


def _declare_resident(module_op, stage, program) -> None:
    """Adds the resident state `stage` gathers by slots to the module's bt.resident."""
    declared = facts.get(module_op, facts.RESIDENT, [])
    for name, gather in stage.gathers.items():
        if _stack(gather) not in _PER_SLOT:
            continue
        tenants = facts.get(module_op, facts.TENANTS)
        if tenants is None:
            raise CompileError(f"bt.gather {name!r} indexes adapter slots, but the module declares no "
                               "bt.tenants: run lora-sites (a multi-tenant compile) first")
        dims, dtype = vtensor_shape(gather.operands[0].type)
        declared.append({"name": name, "owner": parse_time(gather.attributes["from"]).label, "program": program,
                         "shape": [tenants["max_adapters"] + 1] + dims, "slot_dim": 0, "dtype": DTYPES[dtype]})
    if declared:
        facts.put(module_op, facts.RESIDENT, declared)


def split_program(module_op, main) -> dict:
    """Replaces program function `main` by its stage functions; returns {stage: op count}."""
    stages = _plan(main)
    program = program_of(main)
    suffix = "" if program == facts.MAIN else "_" + program
    returned = list(main.regions[0].blocks[0].operations)[-1].operands
    with ir.InsertionPoint(main), main.location:
        for time in BindingTime:
            stage = stages[time]
            results = list(stage.outputs.values()) if time != BindingTime.DYNAMIC else list(returned)
            if time == BindingTime.DYNAMIC or results:
                _emit(stage, main, results, stages, STAGE_FUNCS[time] + suffix, _result_facts(stage, stages, main))
        _declare_resident(module_op, stages[BindingTime.DYNAMIC], program)
    main.erase()
    return {time: len(stage.ops) for time, stage in stages.items()}


@register("bt-split", "one function per stage and program: @static, @adapter, @forward")
def run(module_op, options, stats) -> None:
    for func in programs(module_op):
        split_program(module_op, func)
