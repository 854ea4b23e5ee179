"""Frontend: PyTorch model → torch backend IR with named arguments.

    nn.Module / ExportedProgram / .pt2 path
      → torch.export (non-strict), ATen decompositions (linear/matmul kept; the tanh
        GELU, scatter and boolean-mask assignment by StageML's own, where torch-mlir's
        lowering of them is wrong or crashes)
      → torch-mlir stateless FX import: every parameter, buffer and input is a
        function argument, tagged `bt.name` with its fully qualified name;
        `@main` is the program "main" (`bt.program`), its results are named
        after the ExportedProgram's output specs
      → torch backend IR (value semantics, dynamic dims kept as `?`)

A transformers MoE model is exported with StageML's experts implementation
(compiler/experts.py): routing as per-row gathers of the expert stacks; GPT-2's
Conv1D layers as `x @ W + b` (compiler/conv1d.py); torchao's int8 weight-only
layers as `(x @ dequant(W)) * scale + b` on x's own dims (compiler/quantized.py).

A buffer the model mutates (an output spec of kind BUFFER_MUTATION) is
request-time state, never a static weight: it is an input of the residual
and its new value an output named after it.
"""

import dataclasses
import inspect
import logging
import os

import torch
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch_mlir import fx, ir
from torch_mlir.compiler_utils import OutputType
from torch_mlir.extras.fx_decomp_util import get_decomposition_table
from torch_mlir.extras.fx_importer import FxImporter

from stageml.compiler import conv1d, experts, facts, model_file, quantized
from stageml.compiler.ir import NAME, Diagnostics, set_arg_attr
from stageml.errors import CompileError, ModelLoadError

# Ops kept whole so that bt-improve sees matrix products (`x @ W^T`), not
# the reshapes and mm's torch's decompositions would turn them into.
_KEPT_OPS = (torch.ops.aten.linear.default, torch.ops.aten.matmul.default)
# Kept by torch-mlir's own decompositions: decompose-topk lowers top-k (torch-mlir's
# sort-based form is miscompiled by IREE, see that pass).
_LEGAL_OPS = ["aten.topk"]


# Decompositions of ops whose torch-mlir lowering is wrong or crashes; each returns NotImplemented
# (torch-mlir's own) for the forms it does not take.

def _tanh_gelu(x, approximate="none"):
    """gelu(approximate='tanh') by PyTorch's decomposition (exact constants, math.tanh: 1e-6).
    torch-mlir's TorchToLinalg lowering (added in llvm/torch-mlir#2941) writes sqrt(2/pi) as
    0.797724, not 0.7978846 (not reported upstream as far as torch-mlir's issues show): 1.3e-5 off
    per element, 1e-4 to 3.5e-4 on a tiny Gemma 2 or GPT-BigCode."""
    if approximate != "tanh":
        return NotImplemented  # the exact GELU: torch-mlir's erf lowering is exact
    return torch._decomp.decomposition_table[torch.ops.aten.gelu.default](x, approximate=approximate)


def _scatter(x, dim, index, src):
    """x.scatter(dim, index, src), src a tensor or a number, by comparisons: each position along `dim`
    takes src at the last index naming it (PyTorch leaves which of several unspecified), else keeps x.
    torch-mlir's TMTensor lowering of a scatter with a dynamic dim runs out of memory or crashes the
    process (found on PhiMoE's router, which masks its top expert so; not reported upstream as far as
    torch-mlir's issues show). An index narrower than x off `dim` is left to torch-mlir.

        match[.., k, p, ..] = index[.., k, ..] == p          (k along dim, p a position of x's dim)
        last[.., p, ..] = max_k (k + 1 where match, else 0)  (0: no index names p)
        y = where(last > 0, src.gather(dim, last - 1), x)"""
    if x.dim() == 0 or index.dim() != x.dim() or not all(statically_known_true(index.shape[d] == x.shape[d])
                                                         for d in range(x.dim()) if d != dim % x.dim()):
        return NotImplemented
    dim %= x.dim()
    if statically_known_true(index.shape[dim] == 0):
        return x.clone()

    def along(values, axis):  # `values` as a vector along `axis` of a tensor of index's rank + 1
        shape = [1] * (x.dim() + 1)
        shape[axis] = -1
        return values.view(shape)

    match = index.unsqueeze(dim + 1) == along(torch.arange(x.shape[dim], device=x.device), dim + 1)
    order = along(torch.arange(1, index.shape[dim] + 1, device=x.device), dim)
    last = torch.where(match, order, 0).amax(dim)
    if isinstance(src, torch.Tensor):
        src = src[tuple(slice(0, size) for size in index.shape)].gather(dim, (last - 1).clamp(min=0))
    return torch.where(last > 0, src, x)


def _masked_put(x, indices, values, accumulate=False):
    """x[mask] = v (index_put with one boolean index over x's leading dims, one value) as
    `where(mask, v, x)`. torch-mlir's own decomposition finds the mask's positions by a compaction
    whose length is the mask's count, and for an all-false mask the residual wrote v at the first
    position anyway: a wrong answer without a word (found on Gemma 3's multimodal LM, which zeroes
    its image token ids so; not reported upstream as far as torch-mlir's issues show). Other
    index_puts are left to torch-mlir."""
    if (len(indices) != 1 or indices[0] is None or indices[0].dtype != torch.bool or accumulate
            or values.numel() != 1 or indices[0].dim() > x.dim()
            or not all(statically_known_true(a == b) for a, b in zip(indices[0].shape, x.shape))):
        return NotImplemented
    mask = indices[0].view(*indices[0].shape, *[1] * (x.dim() - indices[0].dim()))
    return torch.where(mask, values.reshape(()).to(x.dtype), x)


@dataclasses.dataclass
class ImportedProgram:
    """A model in torch backend IR, with what each argument is bound to."""

    module: ir.Module
    arg_names: list[str]            # one per function argument, in order
    input_names: list[str]          # the forward inputs (a subset of arg_names)
    weights: dict[str, torch.Tensor]  # parameter/buffer/constant name -> value
    mutated: set[str]               # buffers the model mutates (request-time state)


def load_exported(path: str, trust_model: bool = False) -> torch.export.ExportedProgram:
    """Loads an ExportedProgram saved with `torch.export.save`; one that could run code
    when loaded (see `model_file`) only with `trust_model`."""
    if not os.path.isfile(path):
        what = "is not a regular file" if os.path.exists(path) else "does not exist"
        raise ModelLoadError(f"model file {path!r} {what}: pass the path of a file written by torch.export.save")
    model_file.check_trusted(path, trust_model)
    # torch logs a traceback before raising, and a warning with a broken format
    # string where a trusted file needs its weights_only=False fallback
    loggers = {logger: logger.level for logger in map(logging.getLogger, ("torch.export", "torch._export"))}
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        return torch.export.load(path)
    except Exception:
        raise ModelLoadError(f"{path!r} is not an ExportedProgram: write it with torch.export.save") from None
    finally:
        for logger, level in loggers.items():
            logger.setLevel(level)


def export(model, args: tuple, dynamic_shapes=None, trust_model: bool = False) -> torch.export.ExportedProgram:
    """`model` (nn.Module, ExportedProgram or .pt/.pt2 path) as an ExportedProgram."""
    if isinstance(model, (str, os.PathLike)):
        return load_exported(os.fspath(model), trust_model)
    if isinstance(model, torch.export.ExportedProgram):
        return model
    if not isinstance(model, torch.nn.Module):
        raise ModelLoadError(f"cannot compile a {type(model).__name__}: pass an nn.Module, an ExportedProgram or a .pt2 path")
    if args is None:
        raise ModelLoadError("an nn.Module needs example inputs: call stageml.compile(model, (x,))")
    if isinstance(dynamic_shapes, (tuple, list)) and _takes_var_args(model):
        dynamic_shapes = {"args": tuple(dynamic_shapes)}  # e.g. PeftModel.forward(*args, **kwargs)
    try:
        with experts.staged(model), conv1d.staged(model), quantized.staged(model):
            return torch.export.export(model.eval(), tuple(args), dynamic_shapes=dynamic_shapes, strict=False)
    except Exception as e:
        lines = str(e).strip().splitlines() or [""]
        detail = next((l.strip()[2:] for l in lines[1:] if l.startswith("  - ")), "")  # a violated constraint's why
        raise ModelLoadError(f"torch.export failed on the model{_model_line(e)} ({type(e).__name__}: {lines[0]}"
                             f"{' ' + detail if detail else ''}): make it exportable or export it yourself") from e


def _model_line(error: Exception) -> str:
    """" at FILE:LINE" where the export stopped in the model's code: the innermost frame of
    `error`'s traceback in a transformers model's own module, else in any module but PyTorch's
    and StageML's; "" if there is none."""
    found, model, trace = "", "", error.__traceback__
    while trace is not None:
        module = trace.tb_frame.f_globals.get("__name__", "")
        where = f" at {trace.tb_frame.f_code.co_filename}:{trace.tb_lineno}"
        if module.split(".")[0] not in ("torch", "stageml") and not where.startswith(" at <"):
            found = where
            model = where if module.startswith("transformers.models.") else model
        trace = trace.tb_next
    return model or found


def _takes_var_args(model) -> bool:
    params = list(inspect.signature(model.forward).parameters.values())
    return bool(params) and params[0].kind == inspect.Parameter.VAR_POSITIONAL


def _input_dims(program: torch.export.ExportedProgram) -> dict:
    """{forward input: [{"min", "max"} per dimension]}: the export's ranges (a
    dimension without an upper bound has no "max")."""
    from torch.utils._sympy.numbers import int_oo
    from torch.utils._sympy.value_ranges import bound_sympy
    inputs = {s.arg.name for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT}
    dims = {}
    for node in program.graph.nodes:
        if node.op != "placeholder" or node.name not in inputs:
            continue
        ranges = []
        for size in node.meta["val"].shape:
            if isinstance(size, torch.SymInt):
                bound = bound_sympy(size.node.expr, program.range_constraints)
                unbounded = bound.upper == int_oo  # (torch's int_oo says it is finite)
                ranges.append({"min": int(bound.lower), **({} if unbounded else {"max": int(bound.upper)})})
            else:
                ranges.append({"min": int(size), "max": int(size)})
        dims[node.name] = ranges
    return dims


def _size(size, symbols: dict):
    """One output dimension as a bt.sizes entry (compiler/facts.py): an int, or the polynomial in
    the inputs' dimensions (`symbols`: sympy symbol → (input, axis)) that torch.export states it is,
    possibly floor-divided by an integer; None for any other expression."""
    import sympy
    from torch.utils._sympy.functions import FloorDiv

    if not isinstance(size, torch.SymInt):
        return int(size)
    expr, divisor = sympy.expand(size.node.expr), 1
    if isinstance(expr, FloorDiv) and expr.args[1].is_Integer and int(expr.args[1]) > 0:
        expr, divisor = sympy.expand(expr.args[0]), int(expr.args[1])
    terms = []
    for monomial, coefficient in expr.as_coefficients_dict().items():
        factors = [] if monomial == 1 else list(monomial.args) if monomial.is_Mul else [monomial]
        dims = []
        for factor in factors:
            base, power = factor.as_base_exp()
            if base not in symbols or not power.is_Integer or power < 1 or not coefficient.is_Integer:
                return None
            dims += [{"input": symbols[base][0], "axis": symbols[base][1]}] * int(power)
        terms.append({"coefficient": int(coefficient), "dims": dims})
    return {"terms": terms, "divisor": divisor}


def _output_sizes(program: torch.export.ExportedProgram) -> list:
    """Each user output's bt.sizes (None where a dimension is no polynomial of the inputs')."""
    inputs = {s.arg.name for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT}
    symbols = {}
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in inputs:
            for axis, size in enumerate(node.meta["val"].shape):
                if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                    symbols.setdefault(size.node.expr, (node.name, axis))
    (output,) = [n for n in program.graph.nodes if n.op == "output"]
    found = []
    for spec, value in zip(program.graph_signature.output_specs, output.args[0]):
        if spec.kind != OutputKind.BUFFER_MUTATION:
            sizes = [_size(s, symbols) for s in value.meta["val"].shape] \
                if isinstance(value, torch.fx.Node) and isinstance(value.meta.get("val"), torch.Tensor) else [None]
            found.append(None if None in sizes else sizes)
    return found


def import_program(program: torch.export.ExportedProgram, context: ir.Context) -> ImportedProgram:
    """Imports `program` into `context` as torch backend IR (`func.func @main`)."""
    table = get_decomposition_table()
    for op in _KEPT_OPS:
        table.pop(op, None)
    table[torch.ops.aten.gelu.default] = _tanh_gelu
    table[torch.ops.aten.scatter.src] = table[torch.ops.aten.scatter.value] = _scatter
    table[torch.ops.aten.index_put.default] = _masked_put
    program = program.run_decompositions(table)

    arg_names, input_names, weights = [], [], {}
    state = {**program.state_dict, **program.constants}
    for spec in program.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            if not isinstance(spec.arg, torch.export.graph_signature.TensorArgument):
                raise ModelLoadError(f"forward input {spec.arg.name!r} is not a tensor: StageML compiles tensor inputs only; bake it into the model")
            arg_names.append(spec.arg.name)
            input_names.append(spec.arg.name)
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            arg_names.append(spec.target)
            weights[spec.target] = state[spec.target].detach()
        else:
            raise ModelLoadError(f"model input {spec.target!r} of kind {spec.kind.name} is not supported: export a model without it")

    with Diagnostics(context) as diagnostics:
        try:
            module = fx.stateless_fx_import(
                program.graph_module, output_type=OutputType.TORCH,
                fx_importer=FxImporter(context=context), model_name="main",
                backend_legal_ops=_LEGAL_OPS,
            )
        except Exception as e:
            reason = diagnostics.first_error() if diagnostics.errors else str(e).strip().splitlines()[-1]
            raise CompileError(f"torch-mlir could not import the model: {reason}; "
                               "StageML cannot compile that op: rewrite the model without it") from e
    func = module.body.operations[0]
    for index, name in enumerate(arg_names):
        set_arg_attr(func, index, NAME, ir.StringAttr.get(name, context))
    for name, dims in _input_dims(program).items():
        set_arg_attr(func, arg_names.index(name), facts.DIMS, facts.attribute(ir, dims, context))
    mutated, results, sizes = set(), [], iter(_output_sizes(program))
    for index, spec in enumerate(program.graph_signature.output_specs):
        if spec.kind == OutputKind.BUFFER_MUTATION:
            mutated.add(spec.target)
            results.append({NAME: spec.target, facts.KIND: facts.BUFFER})
            set_arg_attr(func, arg_names.index(spec.target), facts.MUTATED, ir.BoolAttr.get(True, context))
        else:
            known = next(sizes)
            results.append({NAME: f"output.{index - len(mutated)}", **({facts.SIZES: known} if known else {})})
    facts.put(func.operation, facts.PROGRAM, facts.MAIN)
    facts.set_all(func.operation, "res", [{k: facts.attribute(ir, v, context) for k, v in r.items()} for r in results])
    return ImportedProgram(module, arg_names, input_names, weights, mutated)
