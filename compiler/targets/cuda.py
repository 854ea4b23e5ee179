"""The CUDA target: IREE's generic CUDA backend (no StageML passes)."""

from stageml.compiler.targets import Target


class CudaTarget(Target):
    """IREE's cuda backend, sm_80 PTX: the newest architecture IREE 3.13 knows
    below Hopper; the driver JIT-compiles it for newer GPUs (sm_90 has no
    target in IREE 3.13: that is the sm90 target's job)."""

    name = "cuda"
    backend = "cuda"
    device = "cuda"

    @classmethod
    def from_options(cls, options):
        return cls()

    def flags(self, module=None) -> list:
        from stageml.compiler.passes.fuse_gathers import gpu_flags
        return ["--iree-cuda-target=sm_80", *(gpu_flags(module) if module is not None else [])]
