"""StageML: an ahead-of-time staging compiler for adapter-heavy inference.

    art = stageml.compile(model, (x,))        # static work folded now
    art.save("out/residual.vmfb")
    mod = stageml.load("out/residual.vmfb")   # adapter stage runs once here
    y = mod(x)                                # the residual, per request

    art = stageml.compile(peft_model, (x,), max_adapters=64, max_rank=16)
    mod = art.load("out/tenants.vmfb")        # multi-tenant
    mod.load_adapter("tenant-a", "adapters/a")
    ys = mod.run_batch(xs, adapters=["tenant-a", None])
"""

from stageml.binding_time import BindingTime
from stageml.errors import StageMLError
from stageml.runtime import ResidualModule, load


def compile(model, args=None, *, stages=None, dynamic_shapes=None, target="cpu", emit="vmfb",
            dump_dir=None, merge_lora=True, max_adapters=None, max_rank=16, custom_kernels=True,
            verbose=False):
    """Compiles a PyTorch model into a staged residual.

    Args:
      model: an nn.Module, a torch.export.ExportedProgram, or the path of a
        .pt/.pt2 file written by torch.export.save.
      args: example inputs (a tuple) when `model` is an nn.Module.
      stages: {glob: BindingTime | "static" | "adapter" | "dynamic"} over
        parameter, buffer and input names; applied after the defaults
        (weights static, PEFT adapter tensors adapter-time, inputs dynamic).
      dynamic_shapes: passed to torch.export (e.g. {"x": {0: Dim("batch")}}).
      target: "cpu" (the host CPU), "cuda" (IREE's CUDA backend, sm_80 PTX
        that newer GPUs JIT-compile) or "sm90" (Hopper: StageML's own target
        description and hand-written kernels for the hot products; building
        the kernels needs nvcc).
      emit: the last stage to run: torch, bt, split, linalg, iree or vmfb.
      dump_dir: a folder that receives every stage's output.
      merge_lora: let bt-improve merge LoRA factors into weights.
      max_adapters: compile for multi-tenant serving with this many adapter
        slots (`mod.load_adapter`, `mod.run_batch`); needs a PEFT LoRA model.
      max_rank: with max_adapters, the highest LoRA rank an adapter may have.
      custom_kernels: for sm90, use the hand-written kernels (False: IREE
        codegen only, for the Hopper target).
      verbose: print each stage as it finishes (stderr).

    Returns:
      An Artifact with `.report`, `.mlir`, `.save(path)` and `.load(path)`.
    """
    from stageml.compiler.driver import compile as _compile
    return _compile(model, args, stages=stages, dynamic_shapes=dynamic_shapes, target=target,
                    emit=emit, dump_dir=dump_dir, merge_lora=merge_lora, max_adapters=max_adapters,
                    max_rank=max_rank, custom_kernels=custom_kernels, verbose=verbose)


__all__ = ["BindingTime", "StageMLError", "ResidualModule", "compile", "load"]
