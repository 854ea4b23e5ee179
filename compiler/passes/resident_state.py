"""resident-state: the module's declared resident state, and the buffers the model
mutates, become device globals.

Each entry of the module's `bt.resident` (written by bt-split: name, owning
stage, program, shape with its slot dimension leading, dtype) owns a
contiguous range of one flat mutable table per element type. The owning
function (the program's @adapter) gets a `slot` argument and writes its
resident results into entry `slot`; the program's request-time function
reads its resident arguments as views of the table:

    func @adapter_factorized(%a, ...) -> (%m : KxN {bt.kind = "resident", bt.name = "s"})
    func @forward_factorized(%s : ?xKxN {bt.kind = "resident", bt.name = "s"}, %x, %ids)
  → util.global private mutable @resident.f32 = dense<0.0> : tensor<TOTAL x f32>
    func @adapter_factorized(%a, ..., %slot : i64 {bt.kind = "slot", bt.range = {min = 1, max = SLOTS-1}}) {
      cf.assert (1 <= %slot < SLOTS), "adapter slot out of range ..."   // never a write outside the table
      %t = util.global.load @resident.f32
      %u = tensor.insert_slice (collapse %m) into %t[OFFSET + %slot * K*N] [K*N]
      util.global.store %u, @resident.f32 }
    func @forward_factorized(%x, %ids) {
      %s = expand_shape (extract_slice (util.global.load @resident.f32)[OFFSET] [SLOTS*K*N]) ... }

A buffer the model mutates (arguments and results of kind "buffer" of the
request-time functions, bt-split's) becomes a mutable global of its own,
@buffer.<name>, starting from the parameter of its name: each request-time
function loads it and stores its new value there instead of returning it,
so the module keeps it from call to call (every program sharing it), as the
model keeps its buffers, and IREE updates it in place (a KV cache's
index_put writes its rows, no copy). Its start is a parameter even when it
is zeros (a splat in the archive, no bytes): IREE 3.13 fuses globals that
start equal and whose in-place updates it does not see as stores, so equal
splat starts, or one initializer storing zeros into each, made one buffer
of several (resident-state-buffers.mlir). A generation step's buffers are
its KV cache: their bytes join the module's `bt.generation` as `cache_bytes`
(resident-state-cache-bytes.mlir).

(One global per element type, not one per value: IREE 3.13 lets mutable
globals with equal splat initial values share storage, so equal-shaped
tables of separate globals would overwrite each other. Contiguous ranges,
so that reading a table is a view, not a copy.)
"""

import math

from iree.compiler import ir
from iree.compiler.dialects import arith, cf, func as func_d, tensor, util

from stageml.compiler import facts
from stageml.compiler.passes import register
from stageml.compiler.passes.use_parameters import SCOPE
from stageml.compiler.residual_ir import retype
from stageml.errors import CompileError

_ELEMENTS = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
_BUFFER = "buffer."  # a buffer's global: @buffer.<its name>


def _reassociation(groups) -> ir.ArrayAttr:
    i64 = ir.IntegerType.get_signless(64)
    return ir.ArrayAttr.get([ir.ArrayAttr.get([ir.IntegerAttr.get(i64, d) for d in g]) for g in groups])


def _layout(declared: list) -> tuple[dict, dict]:
    """({name: (table symbol, offset, per-slot type [slots, ...])}, {symbol: flat type})."""
    ranges, totals = {}, {}
    for entry in declared:
        if entry["slot_dim"] != 0 or entry["dtype"] not in _ELEMENTS:
            raise CompileError(f"resident state {entry['name']!r} ({entry['dtype']}, slot dimension "
                               f"{entry['slot_dim']}) has no lowering: StageML keeps float tables with slots leading")
        element = ir.Type.parse(_ELEMENTS[entry["dtype"]])
        type_ = ir.RankedTensorType.get(entry["shape"], element)
        symbol = f"resident.{_ELEMENTS[entry['dtype']]}"
        ranges[entry["name"]] = (symbol, totals.get(symbol, 0), type_)
        totals[symbol] = totals.get(symbol, 0) + math.prod(entry["shape"])
    flat = {s: ir.RankedTensorType.get([n], next(t.element_type for sym, _, t in ranges.values() if sym == s))
            for s, n in totals.items()}
    return ranges, flat


def _read(func, ranges, flat) -> None:
    block = func.regions[0].blocks[0]
    with ir.InsertionPoint.at_block_begin(block), func.location:
        loaded = {}
        for index in reversed(range(len(block.arguments))):
            entry = facts.facts(func, "arg", index)
            if entry.get("kind") != facts.RESIDENT_KIND:
                continue
            symbol, offset, type_ = ranges[entry["name"]]
            if symbol not in loaded:
                loaded[symbol] = util.GlobalLoadOp(flat[symbol], symbol).result
            size = math.prod(type_.shape)
            view = tensor.ExtractSliceOp(ir.RankedTensorType.get([size], type_.element_type), loaded[symbol],
                                         [], [], [], [offset], [size], [1]).result
            table = tensor.ExpandShapeOp(type_, view, _reassociation([list(range(len(type_.shape)))]), [],
                                         type_.shape).result
            arg = block.arguments[index]
            arg.replace_all_uses_with(tensor.CastOp(arg.type, table).result)
            facts.erase_argument(func, index)


def _check_slot(slot, slots: int) -> None:
    """Fails the call (an error, not a write) unless 1 <= slot < slots: slot 0 is the base model's."""
    i64 = ir.IntegerType.get_signless(64)
    low = arith.CmpIOp(arith.CmpIPredicate.sge, slot, arith.ConstantOp(i64, 1).result).result
    high = arith.CmpIOp(arith.CmpIPredicate.slt, slot, arith.ConstantOp(i64, slots).result).result
    cf.AssertOp(arith.AndIOp(low, high).result, f"adapter slot out of range [1, {slots - 1}]")


def _write(func, ranges, flat, slots: int) -> None:
    block = func.regions[0].blocks[0]
    slot = facts.add_argument(func, ir.IntegerType.get_signless(64), name="slot", kind=facts.SLOT,
                              range={"min": 1, "max": slots - 1})
    with ir.InsertionPoint.at_block_begin(block), func.location:
        _check_slot(slot, slots)
    ret = list(block.operations)[-1]
    kept, kept_facts = [], []
    with ir.InsertionPoint(ret), ret.location:
        index_type = ir.IndexType.get()
        row = arith.IndexCastOp(index_type, slot).result
        updated = {}
        for i, value in enumerate(ret.operands):
            entry = facts.facts(func, "res", i)
            if entry.get("kind") != facts.RESIDENT_KIND:
                kept.append(value)
                kept_facts.append(facts.attrs(func, "res", i))
                continue
            symbol, offset, type_ = ranges[entry["name"]]
            if symbol not in updated:
                updated[symbol] = util.GlobalLoadOp(flat[symbol], symbol).result
            size = math.prod(type_.shape[1:])
            value_type = ir.RankedTensorType(value.type)
            collapsed = tensor.CollapseShapeOp(ir.RankedTensorType.get([size], value_type.element_type), value,
                                               _reassociation([list(range(value_type.rank))])).result
            start = arith.AddIOp(arith.MulIOp(row, arith.ConstantOp(index_type, size).result).result,
                                 arith.ConstantOp(index_type, offset).result).result
            updated[symbol] = tensor.InsertSliceOp(collapsed, updated[symbol], [start], [], [],
                                                   [ir.ShapedType.get_dynamic_size()], [size], [1]).result
        for symbol, value in updated.items():
            util.GlobalStoreOp(value, symbol)
        func_d.ReturnOp(kept)
    ret.erase()
    retype(func)
    facts.set_all(func, "res", kept_facts)


def _buffers(module_op) -> dict:
    """{name: type} of the buffers the model mutates (each request-time function's arguments of
    kind "buffer"; every program's functions name the same ones)."""
    found = {}
    for func in facts.stage_functions(module_op, "dynamic"):
        for index, type_ in enumerate(ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value).inputs):
            entry = facts.facts(func, "arg", index)
            if entry.get("kind") != facts.BUFFER:
                continue
            if not ir.RankedTensorType(type_).has_static_shape:
                raise CompileError(f"buffer {entry['name']!r} ({type_}) is mutated by the model, but StageML keeps "
                                   "only buffers of static shape on the device: give it a fixed shape")
            found[entry["name"]] = ir.RankedTensorType(type_)
    return found


def _keep_buffers(func) -> None:
    """A request-time function's buffers: each argument a load of the buffer's global, each
    result (the buffer's new value) stored there in place of being returned."""
    block = func.regions[0].blocks[0]
    with ir.InsertionPoint.at_block_begin(block), func.location:
        for index in reversed(range(len(block.arguments))):
            entry = facts.facts(func, "arg", index)
            if entry.get("kind") == facts.BUFFER:
                arg = block.arguments[index]
                arg.replace_all_uses_with(util.GlobalLoadOp(arg.type, _BUFFER + entry["name"]).result)
                facts.erase_argument(func, index)
    ret = list(block.operations)[-1]
    kept, kept_facts = [], []
    with ir.InsertionPoint(ret), ret.location:
        for i, value in enumerate(ret.operands):
            entry = facts.facts(func, "res", i)
            if entry.get("kind") == facts.BUFFER:
                util.GlobalStoreOp(value, _BUFFER + entry["name"])
            else:
                kept.append(value)
                kept_facts.append(facts.attrs(func, "res", i))
        func_d.ReturnOp(kept)
    ret.erase()
    retype(func)
    facts.set_all(func, "res", kept_facts)


def _declare_buffers(module_op, buffers: dict) -> None:
    """A mutable global per buffer, starting from the parameter of its name (its value when
    compiled; the archive holds one of zeros as a splat):
        util.global private mutable @buffer.<name> {bt.kind = "buffer", bt.name = name}
            = #flow.parameter.named<"model"::"<name>">"""
    with ir.InsertionPoint.at_block_begin(module_op.regions[0].blocks[0]):
        for name, type_ in buffers.items():
            initial = ir.Attribute.parse(f'#flow.parameter.named<"{SCOPE}"::"{name}"> : {type_}')
            op = util.GlobalOp(_BUFFER + name, type_, sym_visibility="private", is_mutable=True,
                               initial_value=initial).operation
            facts.put(op, facts.NAME, name)
            facts.put(op, facts.KIND, facts.BUFFER)


def lower_resident_state(module_op) -> int:
    """Lowers every declared piece of resident state and every buffer the model mutates;
    returns how many."""
    declared = facts.get(module_op, facts.RESIDENT, [])
    buffers = _buffers(module_op)
    if buffers:
        _declare_buffers(module_op, buffers)
        for func in facts.stage_functions(module_op, "dynamic"):
            _keep_buffers(func)
        generation = facts.get(module_op, facts.GENERATION)
        if generation is not None:  # a generation step: its buffers are its KV cache
            cache = sum(math.prod(t.shape) * t.element_type.width // 8 for t in buffers.values())
            facts.put(module_op, facts.GENERATION, {**generation, "cache_bytes": cache})
    if not declared:
        return len(buffers)
    ranges, flat = _layout(declared)
    with ir.InsertionPoint.at_block_begin(module_op.regions[0].blocks[0]):
        for symbol, type_ in flat.items():
            zero = ir.DenseElementsAttr.get_splat(type_, ir.FloatAttr.get(type_.element_type, 0.0))
            util.GlobalOp(symbol, type_, sym_visibility="private", is_mutable=True, initial_value=zero)
    for program, owner in sorted({(e["program"], e["owner"]) for e in declared}):
        writer = facts.stage_function(module_op, owner, program)
        if writer is None:
            raise CompileError(f"resident state of program {program!r} has no @{owner} function to write it")
        _write(writer, ranges, flat, slots={e["shape"][0] for e in declared if e["program"] == program}.pop())
        for reader in facts.stage_functions(module_op, "dynamic", program):
            _read(reader, ranges, flat)
    return len(declared) + len(buffers)


@register("resident-state", "declared resident state (slot tables) becomes device globals, written "
          "by its owning stage at a slot and read by the request path; buffers the model mutates become "
          "globals the request path loads and stores", context="iree")
def run(module_op, options, stats) -> None:
    with module_op.context, module_op.location:
        stats["resident"] += lower_resident_state(module_op)
