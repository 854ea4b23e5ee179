"""The sm90 pipeline: the residual (IREE input) made ready for Hopper GPUs.

    attach-hopper-target  the module carries hopper.mlir's Hopper target, which
                          IREE's codegen then compiles for (IREE 3.13 has none)
    cse                   the products of one site share their rows' SSA value,
                          which the LoRA pattern needs to see
    use-custom-kernels    hot products → hand-written kernels (kernels.cu), unless
                          custom_kernels=False; everything else stays on IREE codegen
    canonicalize, cse     drop what the swapped ops left dead

`stageml-opt --pipeline sm90 residual.iree.mlir` runs it alone. Compiling
the result needs the kernels' PTX on IREE's object search path
(`compile_flags`).
"""

from iree.compiler import ir, passmanager

from stageml.compiler.sm90.use_custom_kernels import EXECUTABLE, LIBRARY, use_custom_kernels

TARGETS_ATTR = "hal.device.targets"


def attach_hopper_target(module: ir.Module) -> None:
    """Sets `module`'s device targets to the Hopper target of hopper.mlir."""
    library = ir.Module.parse(LIBRARY.read_text())
    module.operation.attributes[TARGETS_ATTR] = library.operation.attributes[TARGETS_ATTR]


def _cleanup(module: ir.Module, passes: str) -> None:
    pipeline = f"builtin.module(func.func({passes}), util.func({passes}))"
    passmanager.PassManager.parse(pipeline).run(module.operation)


def run_pipeline(text: str, custom_kernels: bool = True, context: ir.Context | None = None) -> tuple:
    """(IREE input for Hopper, {kernel: uses}) from the residual's IREE input."""
    with context or ir.Context():
        module = ir.Module.parse(text)
        attach_hopper_target(module)
        counts = {}
        if custom_kernels:
            _cleanup(module, "cse")
            counts = use_custom_kernels(module)
            _cleanup(module, "canonicalize, cse")
        return str(module), counts


def compile_flags(text: str) -> list:
    """iree-compile flags for the pipeline's output: the kernels' PTX
    directory (built if needed) when the module dispatches a kernel."""
    from stageml.compiler.sm90.build import build  # (not at import: `python -m ...build` runs it)

    if f"hal.executable.source private @{EXECUTABLE}" not in text:
        return []
    return [f"--iree-hal-executable-object-search-path={build()}"]
