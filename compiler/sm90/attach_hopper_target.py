"""attach-hopper-target: the module carries StageML's Hopper (sm_90) target.

IREE 3.13 knows no sm_90 CUDA target (`--iree-cuda-target=sm_90` fails), so
the residual's IREE input names its own device: hopper.mlir's description
(sm_90, PTX 8.0, 227 KiB shared memory per block, warps of 32, the mma.sync /
wmma shapes IREE may use, 132 SMs), which IREE's codegen then compiles
everything for.

    module {...}
  → module attributes {hal.device.targets = [#hal.device.target<"cuda", [#sm90]> : !hal.device]} {...}
"""

from iree.compiler import ir

from stageml.compiler.passes import register
from stageml.compiler.sm90 import HOPPER

TARGETS_ATTR = "hal.device.targets"


def attach_hopper_target(module) -> None:
    """Sets `module`'s (an ir.Module or its operation) device targets to hopper.mlir's."""
    module_op = getattr(module, "operation", module)
    library = ir.Module.parse(HOPPER.read_text(), context=module_op.context)
    module_op.attributes[TARGETS_ATTR] = library.operation.attributes[TARGETS_ATTR]


@register("attach-hopper-target", "the module carries hopper.mlir's Hopper (sm_90) target for IREE's codegen",
          context="iree")
def run(module_op, options, stats) -> None:
    attach_hopper_target(module_op)
