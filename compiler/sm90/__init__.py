"""The sm90 target's IREE-side passes: the residual (IREE input) made ready
for Hopper GPUs, each a registered pass of its own file:

    attach-hopper-target  the module carries hopper.mlir's Hopper target, which
                          IREE's codegen then compiles for (IREE 3.13 has none)
    use-custom-kernels    hot products → hand-written kernels (kernels.cu), or
                          with lowering=reference their CPU references
                          (reference.mlir); everything else stays on IREE codegen

use-custom-kernels wants CSE'd input (a LoRA site's products share their
rows' SSA value) and leaves canonicalize + CSE work behind. Compiling the
result needs the kernels' PTX on IREE's object search path (`compile_flags`).
"""

import pathlib

from stageml.compiler import facts

EXECUTABLE = "stageml_sm90"  # hopper.mlir's hal.executable.source of the kernels
HOPPER = pathlib.Path(__file__).with_name("hopper.mlir")


def compile_flags(module) -> list:
    """iree-compile flags for the passes' output (an IREE-bindings module): the
    kernels' PTX directory (built if needed) when it holds their executable, and
    what IREE's GPU codegen needs for per-row products no kernel took (fuse-gathers')."""
    from stageml.compiler.passes.fuse_gathers import gpu_flags
    from stageml.compiler.sm90.build import build  # (not at import: `python -m ...build` runs it)

    kernels = any(op.operation.name == "hal.executable.source" and facts.symbol(op.operation) == EXECUTABLE
                  for op in module.body.operations)
    return ([f"--iree-hal-executable-object-search-path={build()}"] if kernels else []) + gpu_flags(module)
