"""Lowering: stage functions → linalg → IREE input → .vmfb.

    split IR (torch dialect, @static/@adapter/@forward)
      → torch-mlir's backend pipeline, one stage at a time → linalg on tensors
      → IREE input: for the residual, every lifted static value becomes an
        `util.global = #flow.parameter.named<"model"::NAME>` and every
        adapter-time value a mutable global that @adapter stores and @forward
        loads; products against them use packed weights (pack_weights.py)
      → iree.compiler for the target
"""

import dataclasses
import json

import numpy as np
from iree import compiler as iree_compiler
from iree.compiler import ir as iree_ir
from iree.compiler.dialects import func as func_d, util
from torch_mlir import ir
from torch_mlir.compiler_utils import run_pipeline_with_repro_report

from stageml.binding_time import BindingTime
from stageml.compiler.pack_weights import pack_weights
from stageml.compiler.ir import NAME, TIME, Diagnostics, arg_attrs, parse_time, vtensor_shape
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


@dataclasses.dataclass
class Tensor:
    name: str
    shape: list          # None for a dynamic dim
    dtype: str           # numpy dtype name
    time: str = "dynamic"  # the binding time the value comes from

    def as_dict(self):
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Signature:
    """The arguments and results of one stage function."""

    stage: str
    args: list
    results: list


def _tensor(name, type_, time) -> Tensor:
    shape, dtype = vtensor_shape(type_)
    if dtype not in DTYPES:
        raise CompileError(f"tensor {name!r} has element type {dtype}, which StageML does not support: cast it to float32")
    return Tensor(name, shape, DTYPES[dtype], time.label)


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
            args.append(_tensor(ir.StringAttr(attrs[NAME]).value, type_, parse_time(attrs[TIME])))
        res_names = [f"output.{i}" for i in range(len(fn_type.results))]
        if "res_attrs" in func.attributes:
            res_names = [ir.StringAttr(ir.DictAttr(d)[NAME]).value for d in ir.ArrayAttr(func.attributes["res_attrs"])]
        time = next(t for t, n in STAGE_FUNCS.items() if n == stage)
        result[stage] = Signature(stage, args, [_tensor(n, t, time) for n, t in zip(res_names, fn_type.results)])
    return result


def _strip_bt(func) -> None:
    """Drops bt attributes, which the IREE context cannot parse."""
    for op in func.regions[0].blocks[0].operations:
        if TIME in op.operation.attributes:
            del op.operation.attributes[TIME]
    for key in ("arg_attrs", "res_attrs"):
        if key in func.attributes:
            del func.attributes[key]


def to_linalg(split_module: ir.Module) -> str:
    """Lowers each stage function with torch-mlir; returns one linalg module's text."""
    lowered = iree_ir.Module.create(loc=iree_ir.Location.unknown(_iree_context()))
    for func in split_module.body.operations:
        stage = ir.StringAttr(func.attributes["sym_name"]).value
        single = ir.Module.create(loc=ir.Location.unknown(split_module.context))
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


def static_module(linalg: str) -> str:
    """The @static function alone, for partial evaluation."""
    module = iree_ir.Module.parse(linalg, _iree_context())
    for name, func in _funcs(module).items():
        if name != "static":
            func.erase()
    return str(module)


def _replace_args_with_globals(func, names: list, globals_: set) -> None:
    """Loads each named argument from its global instead; erases the argument."""
    block = func.regions[0].blocks[0]
    with iree_ir.InsertionPoint.at_block_begin(block), func.location:
        for index in reversed([i for i, n in enumerate(names) if n in globals_]):
            arg = block.arguments[index]
            load = util.GlobalLoadOp(arg.type, names[index])
            arg.replace_all_uses_with(load.result)
            block.erase_argument(index)
    fn_type = iree_ir.FunctionType(iree_ir.TypeAttr(func.attributes["function_type"]).value)
    inputs = [a.type for a in block.arguments]
    func.attributes["function_type"] = iree_ir.TypeAttr.get(iree_ir.FunctionType.get(inputs, fn_type.results))


def residual_module(linalg: str, sigs: dict) -> str:
    """@adapter and @forward reading lifted values from globals (IREE input)."""
    with _iree_context():
        return _globalize(iree_ir.Module.parse(linalg), sigs)


def _globalize(module, sigs: dict) -> str:
    funcs = _funcs(module)
    if "static" in funcs:
        funcs.pop("static").erase()
    globals_ = set()  # symbol = the value's name
    with iree_ir.InsertionPoint.at_block_begin(module.body), module.operation.location:
        for stage in ("adapter", "forward"):
            for arg in sigs[stage].args if stage in sigs else []:
                if arg.time == "dynamic" or (stage == "adapter" and arg.time == "adapter") or arg.name in globals_:
                    continue
                type_ = _tensor_type(arg)
                if arg.time == "static":
                    initial = iree_ir.Attribute.parse(
                        f"#flow.parameter.named<{json.dumps(PARAMETER_SCOPE)}::{json.dumps(arg.name)}> : {type_}")
                    util.GlobalOp(arg.name, type_, sym_visibility="private", initial_value=initial)
                else:
                    util.GlobalOp(arg.name, type_, sym_visibility="private", is_mutable=True)
                globals_.add(arg.name)
    forward = funcs["forward"]
    _replace_args_with_globals(forward, [a.name for a in sigs["forward"].args], globals_)
    if "adapter" in funcs:
        adapter = funcs["adapter"]
        _replace_args_with_globals(adapter, [a.name for a in sigs["adapter"].args], globals_)
        block = adapter.regions[0].blocks[0]
        ret = list(block.operations)[-1]
        with iree_ir.InsertionPoint(ret), ret.location:
            for value, result in zip(ret.operands, sigs["adapter"].results):
                util.GlobalStoreOp(value, result.name)
            func_d.ReturnOp([])
        ret.erase()
        fn_type = iree_ir.FunctionType(iree_ir.TypeAttr(adapter.attributes["function_type"]).value)
        adapter.attributes["function_type"] = iree_ir.TypeAttr.get(iree_ir.FunctionType.get(fn_type.inputs, []))
    with module.operation.location:
        pack_weights(module, funcs)
    return str(module)


# numpy dtype names → builtin (signless) element types
_ELEMENT = {numpy: torch.replace("si", "i").replace("ui", "i") for torch, numpy in DTYPES.items()}


def _tensor_type(t: Tensor) -> iree_ir.Type:
    element = iree_ir.Type.parse(_ELEMENT[t.dtype])
    return iree_ir.RankedTensorType.get([iree_ir.ShapedType.get_dynamic_size() if d is None else d for d in t.shape], element)


def compile_cpu(text: str, stage: str, flags=None) -> bytes:
    """Compiles IREE input for the host CPU (llvm-cpu); flags default to CPU_FLAGS."""
    try:
        return iree_compiler.compile_str(text, target_backends=["llvm-cpu"],
                                         extra_args=list(CPU_FLAGS if flags is None else flags))
    except iree_compiler.CompilerToolError as e:
        lines = [l for l in str(e).splitlines() if "error:" in l] or ["(no diagnostic)"]
        raise CompileError(f"IREE failed to compile @{stage}: {lines[0].split('error:')[-1].strip()}") from e


def numpy_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)
