"""Lowering: split IR → linalg (torch-mlir) → IREE input → .vmfb.

    split IR (torch dialect; stage functions carrying compiler/facts.py's facts)
      → torch-mlir's backend pipeline, the whole module at once → linalg on tensors
      → into IREE's context, printed with its locations (every op keeps the
        model source line torch.export gave it) and its builtin facts
      → IREE-side passes (use-parameters, resident-state, fuse-gathers, and
        the target's own: pack-weights for the CPU, the sm90 pipeline)
      → iree.compiler for the target
"""

from iree import compiler as iree_compiler
from iree.compiler import ir as iree_ir
from torch_mlir import ir
from torch_mlir.compiler_utils import run_pipeline_with_repro_report

from stageml.compiler.ir import Diagnostics
from stageml.errors import CompileError

_CONTEXT = None


def iree_context() -> iree_ir.Context:
    """The one IREE-bindings context the compiler builds residuals in."""
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = iree_ir.Context()
    return _CONTEXT


def to_iree(module) -> iree_ir.Module:
    """A module of either bindings as a module of IREE's, locations kept."""
    return iree_ir.Module.parse(module.operation.get_asm(enable_debug_info=True), iree_context())


def text(module) -> str:
    """A module as text with its locations, so that a dump is a reproducer."""
    return module.operation.get_asm(enable_debug_info=True)


def to_linalg(split: ir.Module) -> iree_ir.Module:
    """Lowers every stage function with torch-mlir (in place); returns the module in IREE's context."""
    with Diagnostics(split.context) as diagnostics:
        try:
            run_pipeline_with_repro_report(
                split, "builtin.module(torch-backend-to-linalg-on-tensors-backend-pipeline)",
                "lowering the stage functions to linalg")
        except Exception as e:
            raise CompileError(f"the model failed to lower to linalg: {diagnostics.first_error()}; "
                               "StageML cannot compile that op: rewrite the model without it") from e
    return to_iree(split)


class CompilerCrash(CompileError):
    """iree-compile crashed (stopped without a diagnostic), or stopped on a known bug of one of its
    compilation paths (`PATH_BUGS`): another path may compile the module."""


# Diagnostics (their first words) of IREE 3.13 bugs that one compilation path has and another avoids:
# - dispatch creation with data tiling, on a transpose feeding a batch matmul's encoding
#   (half-precision attention; OPT's in f32): llvm/llvm-project#205238, fixed upstream
#   by llvm/llvm-project#205288.
# - dispatch creation with data tiling, on attention products of the Beam, Flint and Inkling
#   families: an unhoisted stack allocation, the symptom of iree-org/iree#14406 (closed).
# - XLM's attention scores (q @ k.transpose(2, 3)): a dispatch whose workgroup count IREE
#   cannot express in the dispatch's workload.
# - dispatch creation with data tiling, on a multi-tenant LoRA site's per-row products of some
#   widths (in 32, out 24, rank 16, for znver4): vectors past IREE's size limit,
#   iree-org/iree#24876 (closed after 3.13). The message goes on with the size.
PATH_BUGS = ("'affine.delinearize_index' op no basis element may be statically non-positive",
             "'memref.alloca' op all stack allocations need to be hoisted to the entry block of the function",
             "'iree_codegen.workgroup_count_hint' op failed to resolve workgroup count hint in terms of workload "
             "ordinals",
             "One or more operations with large vector sizes")


# Every residual is compiled async-external: each entry point takes a wait fence and a signal
# fence and returns once its work is queued, and the runtime waits for the signal itself
# (runtime/module.py: ResidualModule._wait), so that on a GPU the caller is not put to sleep.
RESIDUAL_FLAGS = ("--iree-execution-model=async-external",)


def compile_module(module_text: str, what: str, backend: str, flags: list) -> bytes:
    """Compiles IREE input for `backend` with `flags`."""
    try:
        return iree_compiler.compile_str(module_text, target_backends=[backend], extra_args=list(flags))
    except iree_compiler.CompilerToolError as e:
        lines = [l for l in str(e).splitlines() if "error:" in l]
        if not lines:
            raise CompilerCrash(f"IREE failed to compile {what}: iree-compile stopped without a diagnostic (an IREE "
                                "crash: dump_dir= keeps the input to report)") from e
        where, _, message = lines[0].rpartition("error:")
        where = f" at {where.strip().rstrip(':')}" if where.strip() else ""  # the model's source line, when known
        error = CompilerCrash if message.strip().startswith(PATH_BUGS) else CompileError
        raise error(f"IREE failed to compile {what}{where}: {message.strip()}") from e
