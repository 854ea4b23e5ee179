"""The sm90 target: Hopper GPUs (H100 / H200) through StageML's own pipeline.

    attach-hopper-target  the module carries hopper.mlir's Hopper target, which
                          IREE's codegen then compiles for (IREE 3.13 has none)
    fuse-gathers{multi-token=true}
                          the per-row products of multi-token rows, which the
                          common pipeline's fuse-gathers leaves as gather +
                          batch_matmul, as one-token rows (the BGMV kernel's)
    cse                   the products of one site share their rows' SSA value,
                          which the LoRA pattern needs to see
    use-custom-kernels    hot products → hand-written kernels (kernels.cu); with
                          custom_kernels="reference", calls of their CPU
                          references instead (the residual then runs on the CPU)
    canonicalize, cse     drop what the swapped ops left dead

`stageml-opt residual.linalg.mlir -p use-parameters,...` runs any of them alone.
"""

from stageml.compiler.targets import Target


class Sm90Target(Target):
    name = "sm90"
    counts_kernels = True

    def __init__(self, custom_kernels=True):
        self.custom_kernels = custom_kernels
        reference = custom_kernels == "reference"
        self.backend, self.device = ("llvm-cpu", "local-task") if reference else ("cuda", "cuda")

    @classmethod
    def from_options(cls, options):
        return cls(options.custom_kernels)

    def passes(self) -> list:
        from stageml.compiler.passes.fuse_gathers import FuseGathersOptions
        from stageml.compiler.sm90.use_custom_kernels import UseCustomKernelsOptions

        if self.custom_kernels is False:
            return [("attach-hopper-target", None)]
        lowering = "reference" if self.custom_kernels == "reference" else "dispatch"
        head = [] if lowering == "reference" else [("attach-hopper-target", None)]
        return head + [("fuse-gathers", FuseGathersOptions(multi_token=True)), ("cse", None),
                       ("use-custom-kernels", UseCustomKernelsOptions(lowering=lowering)),
                       ("canonicalize", None), ("cse", None)]

    def flags(self, module) -> list:
        if self.custom_kernels == "reference":
            return ["--iree-llvmcpu-target-cpu=host"]
        from stageml.compiler.sm90 import compile_flags
        return compile_flags(module)

    def describe(self) -> dict:
        return {"name": self.name, "device": self.device, "custom_kernels": self.custom_kernels}
