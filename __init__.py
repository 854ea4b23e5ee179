"""StageML: an ahead-of-time staging compiler for adapter-heavy inference.

    art = stageml.compile(model, (x,))        # static work folded now
    art.save("out/residual.vmfb")
    mod = stageml.load("out/residual.vmfb")   # adapter stage runs once here
    y = mod(x)                                # the residual, per request

    art = stageml.compile(peft_model, (x,), max_adapters=64, max_rank=16)
    mod = art.load("out/tenants.vmfb")        # multi-tenant
    mod.load_adapter("tenant-a", "adapters/a")
    ys = mod.run_batch(xs, adapters=["tenant-a", None])

    layer = stageml.torch.StagedModule("out/residual.vmfb")   # an nn.Module (a torch custom op)
"""

import importlib
import importlib.abc
import importlib.util
import sys

from stageml.binding_time import BindingTime
from stageml.compiler.options import CompileOptions
from stageml.errors import StageMLError
from stageml.runtime import ResidualModule, load


def compile(model, args=None, *, dynamic_shapes=None, **options):
    """Compiles a PyTorch model into a staged residual.

    Args:
      model: an nn.Module, a torch.export.ExportedProgram, the path of a
        .pt/.pt2 file written by torch.export.save, or a stage file that
        `dump_dir` wrote (`model.split.mlir`, ...): the compile starts there.
      args: example inputs (a tuple) when `model` is an nn.Module.
      dynamic_shapes: passed to torch.export (e.g. {"x": {0: Dim("batch")}}).
      **options: the fields of `stageml.CompileOptions`:
        stages: {glob: BindingTime | "static" | "adapter" | "dynamic"} over
          parameter, buffer and input names; applied after the defaults
          (weights static, PEFT adapter tensors adapter-time, inputs dynamic).
        target: "cpu" (default), "cuda" (IREE's CUDA backend, sm_80 PTX that
          newer GPUs JIT-compile) or "sm90" (Hopper: StageML's own target
          description and hand-written kernels; building them needs nvcc).
        cpu: for target "cpu", the CPU to compile for: "host" (default) or an
          LLVM CPU name ("znver4", "sapphirerapids", "x86-64-v3", ...), so a
          residual built here can run on another machine.
        emit: the last stage to run: torch, bt, split, linalg, iree or vmfb.
        dump_dir: a folder that receives every stage's output.
        merge_lora: let bt-improve merge LoRA factors into weights.
        keep_quantized: keep a quantized base's integer weights (torchao int8
          weight-only layers) integer in the residual, converted to floats
          where they are used: a quarter of the float32 bytes, but IREE 3.13's
          CPU code converts the whole weight on each call (slower; see the
          README). By default the conversion is folded at compile time.
        max_adapters: compile for multi-tenant serving with this many adapter
          slots (`mod.load_adapter`, `mod.run_batch`); needs a PEFT LoRA model.
        max_rank: with max_adapters, the highest LoRA rank an adapter may have.
        custom_kernels: for sm90, the hand-written kernels (True), IREE
          codegen only (False), or "reference": the same rewrites calling the
          kernels' CPU references, built for and run on the CPU.
        trust_model: load a .pt2 even where torch would unpickle or run code from it.
        verbose: print each stage as it finishes (stderr).
        generate: compile one generation step of a transformers causal LM (pass the
          model alone) over a KV cache the module keeps: `stageml.load` then gives a
          Generator (`generate(prompts, ...)`).
        max_seq, sequences: with generate, the cache's positions per sequence and its
          sequence slots (2048 and 8 by default).

    Returns:
      An Artifact with `.report`, `.mlir`, `.save(path)` and `.load(path)`.
    """
    from stageml.compiler.driver import compile as _compile
    return _compile(model, args, dynamic_shapes=dynamic_shapes, options=CompileOptions(**options))


def __getattr__(name: str):
    """`stageml.torch` (interop/torch.py), imported on first use."""
    if name == "torch":
        return importlib.import_module("stageml.interop.torch")
    raise AttributeError(f"module 'stageml' has no attribute {name!r}")


class _TorchInterop(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Lets `import stageml.torch` and `from stageml.torch import StagedModule` find interop/torch.py,
    which a file named torch.py beside this one cannot hold: it would shadow PyTorch wherever this
    directory is on sys.path."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name == "stageml.torch" else None

    def create_module(self, spec):
        return importlib.import_module("stageml.interop.torch")

    def exec_module(self, module):
        pass


if not any(isinstance(finder, _TorchInterop) for finder in sys.meta_path):
    sys.meta_path.append(_TorchInterop())


__all__ = ["BindingTime", "CompileOptions", "StageMLError", "ResidualModule", "compile", "load"]
