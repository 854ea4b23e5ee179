"""Lowering: stage functions → linalg → IREE input → .vmfb.

    split IR (torch dialect, @static/@adapter/@forward)
      → torch-mlir's backend pipeline, one stage at a time → linalg on tensors
      → IREE input: for the residual, every lifted static value becomes an
        `util.global = #flow.parameter.named<"model"::NAME>`; @adapter returns
        the adapter state, which the caller keeps and passes to @forward;
        products against weights use packed layouts (pack_weights.py)
      → for sm90, the Hopper pipeline (compiler/sm90): its target description
        and hand-written kernels for the hot products
      → iree.compiler for the target

A multi-tenant artifact holds a second program, suffixed `_factorized`:
its adapter state lives in a per-slot table (a mutable global with one row
per adapter slot, slot 0 all zeros for the base model) that
@adapter_factorized(..., slot) writes and @forward_factorized gathers.
"""

import dataclasses
import json
import math

from iree import compiler as iree_compiler
from iree.compiler import ir as iree_ir
from iree.compiler.dialects import arith, func as func_d, tensor, util
from torch_mlir import ir
from torch_mlir.compiler_utils import run_pipeline_with_repro_report

from stageml.binding_time import BindingTime
from stageml.compiler import adapter_state
from stageml.compiler.fuse_gathers import fuse_gathers
from stageml.compiler.pack_weights import pack_weights
from stageml.compiler.ir import NAME, TABLE, TIME, Diagnostics, arg_attrs, parse_time, vtensor_shape
from stageml.compiler.passes.bt_split import STAGE_FUNCS
from stageml.errors import CompileError

PARAMETER_SCOPE = "model"

# torch element types → numpy dtype names
DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64",
          "si64": "int64", "si32": "int32", "si16": "int16", "si8": "int8", "ui8": "uint8",
          "i1": "bool"}

# Measured on a 2-core CPU to matter 4x for weight-heavy residuals (DESIGN.md):
# weights are data-tiled once, at load time, not per request.
CPU_FLAGS = ["--iree-llvmcpu-target-cpu=host", "--iree-opt-data-tiling",
             "--iree-opt-const-eval", "--iree-opt-const-expr-hoisting"]


@dataclasses.dataclass(frozen=True)
class Target:
    """What the residual is compiled for."""

    backend: str            # IREE target backend
    flags: tuple            # iree-compile flags
    device: str             # IREE runtime device that runs it
    packs_weights: bool     # pack_weights' mmt4d layout (tiles for the CPU's vector unit)
    hopper: bool = False    # the sm90 pipeline: StageML's Hopper target and kernels


TARGETS = {
    "cpu": Target("llvm-cpu", tuple(CPU_FLAGS), "local-task", True),
    # sm_80 PTX: the newest architecture IREE 3.13 knows below Hopper; the
    # driver JIT-compiles it for newer GPUs (sm_90 has no target in IREE 3.13).
    "cuda": Target("cuda", ("--iree-cuda-target=sm_80",), "cuda", False),
    # The module carries its own Hopper target (compiler/sm90/hopper.mlir).
    "sm90": Target("cuda", (), "cuda", False, hopper=True),
}


@dataclasses.dataclass
class Tensor:
    name: str
    shape: list          # None for a dynamic dim
    dtype: str           # numpy dtype name
    time: str = "dynamic"  # the binding time the value comes from
    table: bool = False    # one entry per adapter slot (a factorized program's state)

    def as_dict(self):
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Signature:
    """The arguments and results of one stage function."""

    stage: str
    args: list
    results: list


def _tensor(name, type_, time, table=False) -> Tensor:
    shape, dtype = vtensor_shape(type_)
    if dtype not in DTYPES:
        raise CompileError(f"tensor {name!r} has element type {dtype}, which StageML does not support: cast it to float32")
    return Tensor(name, shape, DTYPES[dtype], time.label, table)


def stage_time(function: str) -> BindingTime:
    """The stage a function belongs to: @adapter and @adapter_factorized are adapter-time."""
    return next(t for t, n in STAGE_FUNCS.items() if function.split("_")[0] == n)


def signatures(split_module: ir.Module) -> dict:
    """{stage name: Signature} read from the split module."""
    result = {}
    for func in split_module.body.operations:
        func = func.operation
        stage = ir.StringAttr(func.attributes["sym_name"]).value
        fn_type = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
        args = []
        for index, type_ in enumerate(fn_type.inputs):
            attrs = arg_attrs(func, index)
            args.append(_tensor(ir.StringAttr(attrs[NAME]).value, type_, parse_time(attrs[TIME]), TABLE in attrs))
        res_names = [f"output.{i}" for i in range(len(fn_type.results))]
        if "res_attrs" in func.attributes:
            res_names = [ir.StringAttr(ir.DictAttr(d)[NAME]).value for d in ir.ArrayAttr(func.attributes["res_attrs"])]
        result[stage] = Signature(stage, args, [_tensor(n, t, stage_time(stage))
                                                for n, t in zip(res_names, fn_type.results)])
    return result


def _strip_bt(func) -> None:
    """Drops bt attributes, which the IREE context cannot parse."""
    for op in func.regions[0].blocks[0].operations:
        if TIME in op.operation.attributes:
            del op.operation.attributes[TIME]
    for key in ("arg_attrs", "res_attrs"):
        if key in func.attributes:
            del func.attributes[key]


def to_linalg(*split_modules: ir.Module) -> str:
    """Lowers each stage function with torch-mlir; returns one linalg module's text."""
    lowered = iree_ir.Module.create(loc=iree_ir.Location.unknown(_iree_context()))
    for func in [f for m in split_modules for f in m.body.operations]:
        stage = ir.StringAttr(func.attributes["sym_name"]).value
        single = ir.Module.create(loc=ir.Location.unknown(func.context))
        copy = func.operation.clone(ip=ir.InsertionPoint(single.body))
        _strip_bt(copy)
        with Diagnostics(single.context) as diagnostics:
            try:
                run_pipeline_with_repro_report(
                    single, "builtin.module(torch-backend-to-linalg-on-tensors-backend-pipeline)",
                    f"lowering @{stage} to linalg")
            except Exception as e:
                raise CompileError(f"stage @{stage} failed to lower to linalg: {diagnostics.first_error()}; "
                                   "StageML cannot compile that op: rewrite the model without it") from e
        parsed = iree_ir.Module.parse(str(single), lowered.context)
        for op in parsed.body.operations:
            op.operation.clone(ip=iree_ir.InsertionPoint(lowered.body))
    return str(lowered)


_CONTEXT = None


def _iree_context() -> iree_ir.Context:
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = iree_ir.Context()
    return _CONTEXT


def _funcs(module) -> dict:
    return {iree_ir.StringAttr(op.attributes["sym_name"]).value: op.operation
            for op in module.body.operations if op.operation.name == "func.func"}


def static_module(linalg: str, function: str = "static") -> str:
    """One @static function alone, for partial evaluation."""
    module = iree_ir.Module.parse(linalg, _iree_context())
    for name, func in _funcs(module).items():
        if name != function:
            func.erase()
    return str(module)


def _replace_args_with_globals(func, names: list, globals_: dict) -> None:
    """Loads each argument named in `globals_` ({name: type}) from its global
    instead (cast to the argument's type); erases the argument."""
    block = func.regions[0].blocks[0]
    with iree_ir.InsertionPoint.at_block_begin(block), func.location:
        for index in reversed([i for i, n in enumerate(names) if n in globals_]):
            arg = block.arguments[index]
            value = util.GlobalLoadOp(globals_[names[index]], names[index]).result
            if value.type != arg.type:
                value = tensor.CastOp(arg.type, value).result
            arg.replace_all_uses_with(value)
            block.erase_argument(index)
    retype(func)


def retype(func) -> None:
    """Sets `func`'s type to its arguments' and returned values' types."""
    block = func.regions[0].blocks[0]
    results = [v.type for v in list(block.operations)[-1].operands]
    func.attributes["function_type"] = iree_ir.TypeAttr.get(
        iree_ir.FunctionType.get([a.type for a in block.arguments], results))


def residual_module(linalg: str, sigs: dict, slots: int = 0, packs_weights: bool = True) -> str:
    """The residual as IREE input: the adapter and forward functions of each
    program, reading static values from parameter globals; a factorized
    program's state in tables of `slots` + 1 entries; products against
    weights in pack_weights' layout when `packs_weights`."""
    with _iree_context():
        module = iree_ir.Module.parse(linalg)
        funcs = _funcs(module)
        for name in [n for n in funcs if stage_time(n) == BindingTime.STATIC]:
            funcs.pop(name).erase()
        parameters = {}  # symbol (the value's name) -> type
        for suffix in ("", "_factorized"):
            if "forward" + suffix not in funcs:
                continue
            forward, adapter = funcs["forward" + suffix], funcs.get("adapter" + suffix)
            fsig, asig = sigs["forward" + suffix], sigs.get("adapter" + suffix)
            with module.operation.location:
                for func, sig in ((forward, fsig), (adapter, asig)):
                    if func is not None:
                        _use_parameters(module, func, sig, parameters)
                if suffix:
                    _use_tables(module, forward, adapter, fsig, asig, slots)
                    fuse_gathers(forward)
                state = {} if suffix or asig is None else {
                    i: [r.name for r in asig.results].index(a.name)
                    for i, a in enumerate(a for a in fsig.args if a.time != "static") if a.time == "adapter"}
                adapter_state.mark(forward, state)
                if packs_weights:
                    pack_weights(forward, adapter)
                for func in (forward, adapter):
                    if func is not None:
                        retype(func)
        return str(module)


def _use_parameters(module, func, sig, parameters: dict) -> None:
    """Static arguments of `func` → globals initialized from the parameter archive."""
    with iree_ir.InsertionPoint.at_block_begin(module.body):
        for arg in sig.args:
            if arg.time == "static" and arg.name not in parameters:
                type_ = _tensor_type(arg)
                initial = iree_ir.Attribute.parse(
                    f"#flow.parameter.named<{json.dumps(PARAMETER_SCOPE)}::{json.dumps(arg.name)}> : {type_}")
                util.GlobalOp(arg.name, type_, sym_visibility="private", initial_value=initial)
                parameters[arg.name] = type_
    static = {a.name: parameters[a.name] for a in sig.args if a.time == "static"}
    _replace_args_with_globals(func, [a.name for a in sig.args], static)


def _use_tables(module, forward, adapter, fsig, asig, slots: int) -> None:
    """Per-slot state in one flat table global per element type: each state
    value [K, N] owns a contiguous [slots + 1, K, N] range. @adapter_factorized
    (..., slot) writes entry `slot` of each range; @forward_factorized reads
    the ranges as tables.

        func @adapter_factorized(%a, ...) -> (%m : KxN, ...)
      → func @adapter_factorized(%a, ..., %slot : i64) {
          %t = util.global.load @factorized.tables.f32
          %u = tensor.insert_slice (collapse %m) into %t[OFFSET + %slot * K*N] [K*N]
          ... util.global.store %u, @factorized.tables.f32 }

    (One global, not one per value: IREE 3.13 lets mutable globals with
    equal splat initial values share storage, so equal-shaped tables of
    separate globals would overwrite each other. Contiguous ranges, so that
    reading a table is a view, not a copy.)
    """
    ranges, totals = {}, {}  # state name -> (table symbol, offset, table type); symbol -> size
    for arg in fsig.args:
        if arg.table:
            type_ = _tensor_type(arg, leading=slots + 1)
            symbol = f"factorized.tables.{type_.element_type}"
            ranges[arg.name] = (symbol, totals.get(symbol, 0), type_)
            totals[symbol] = totals.get(symbol, 0) + math.prod(type_.shape)
    tables = {}
    with iree_ir.InsertionPoint.at_block_begin(module.body):
        for symbol, total in totals.items():
            element = next(t.element_type for s, _, t in ranges.values() if s == symbol)
            tables[symbol] = iree_ir.RankedTensorType.get([total], element)
            zero = iree_ir.DenseElementsAttr.get_splat(tables[symbol], iree_ir.FloatAttr.get(element, 0.0))
            util.GlobalOp(symbol, tables[symbol], sym_visibility="private", is_mutable=True, initial_value=zero)

    block = forward.regions[0].blocks[0]
    names = [a.name for a in fsig.args if a.time != "static"]
    with iree_ir.InsertionPoint.at_block_begin(block), forward.location:
        loaded = {s: util.GlobalLoadOp(t, s).result for s, t in tables.items()}
        for index in reversed([i for i, n in enumerate(names) if n in ranges]):
            symbol, offset, type_ = ranges[names[index]]
            size = math.prod(type_.shape)
            flat = tensor.ExtractSliceOp(iree_ir.RankedTensorType.get([size], type_.element_type),
                                         loaded[symbol], [], [], [], [offset], [size], [1]).result
            table = tensor.ExpandShapeOp(type_, flat, _reassociation([[0, 1, 2]]), [], type_.shape).result
            arg = block.arguments[index]
            arg.replace_all_uses_with(tensor.CastOp(arg.type, table).result)
            block.erase_argument(index)
    retype(forward)

    block = adapter.regions[0].blocks[0]
    slot = block.add_argument(iree_ir.IntegerType.get_signless(64), adapter.location)
    ret = list(block.operations)[-1]
    with iree_ir.InsertionPoint(ret), ret.location:
        index_type = iree_ir.IndexType.get()
        row = arith.IndexCastOp(index_type, slot).result
        updated = {s: util.GlobalLoadOp(t, s).result for s, t in tables.items()}
        for value, result in zip(ret.operands, asig.results):
            symbol, offset, type_ = ranges[result.name]
            size = type_.shape[1] * type_.shape[2]
            flat = tensor.CollapseShapeOp(iree_ir.RankedTensorType.get([size], type_.element_type), value,
                                          _reassociation([[0, 1]])).result
            start = arith.AddIOp(arith.MulIOp(row, arith.ConstantOp(index_type, size).result).result,
                                 arith.ConstantOp(index_type, offset).result).result
            updated[symbol] = tensor.InsertSliceOp(flat, updated[symbol], [start], [], [],
                                                   [iree_ir.ShapedType.get_dynamic_size()], [size], [1]).result
        for symbol, value in updated.items():
            util.GlobalStoreOp(value, symbol)
        func_d.ReturnOp([])
    ret.erase()
    retype(adapter)


def _reassociation(groups) -> iree_ir.ArrayAttr:
    i64 = iree_ir.IntegerType.get_signless(64)
    return iree_ir.ArrayAttr.get([iree_ir.ArrayAttr.get([iree_ir.IntegerAttr.get(i64, d) for d in g]) for g in groups])


# numpy dtype names → builtin (signless) element types
_ELEMENT = {numpy: torch.replace("si", "i").replace("ui", "i") for torch, numpy in DTYPES.items()}


def _tensor_type(t: Tensor, leading: int | None = None) -> iree_ir.Type:
    """`t`'s tensor type; `leading` replaces a table's leading (slot) dimension."""
    element = iree_ir.Type.parse(_ELEMENT[t.dtype])
    shape = [iree_ir.ShapedType.get_dynamic_size() if d is None else d for d in t.shape]
    if leading is not None:
        shape[0] = leading
    return iree_ir.RankedTensorType.get(shape, element)


def compile_module(text: str, stage: str, target: str = "cpu", flags=None) -> bytes:
    """Compiles IREE input for TARGETS[target]; flags default to the target's."""
    backend = TARGETS[target]
    flags = list(backend.flags if flags is None else flags)
    if backend.hopper:
        from stageml.compiler import sm90
        flags += sm90.compile_flags(text)
    try:
        return iree_compiler.compile_str(text, target_backends=[backend.backend], extra_args=flags)
    except iree_compiler.CompilerToolError as e:
        lines = [l for l in str(e).splitlines() if "error:" in l] or ["(no diagnostic)"]
        raise CompileError(f"IREE failed to compile @{stage}: {lines[0].split('error:')[-1].strip()}") from e
