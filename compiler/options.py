"""CompileOptions: everything a compile may be told, shared by the Python API,
`stagemlc` and the driver. Frozen, and checked when made."""

import dataclasses

from stageml.binding_time import BindingTime
from stageml.errors import CompileError

EMITS = ("torch", "bt", "split", "linalg", "iree", "vmfb")
KERNELS = (True, False, "reference")


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    """Options of one compile (see `stageml.compile` for each one's meaning).

    stages: ((glob, BindingTime), ...) over parameter, buffer and input names.
    target: "cpu", "cuda" or "sm90"; cpu: the CPU to compile for ("host", or
    an LLVM CPU name such as "znver4"). custom_kernels: sm90's hand-written
    kernels (True), none (False), or their CPU references ("reference": the
    sm90 residual built for the CPU, to check its rewrites numerically).
    keep_quantized: integer weights (torchao's int8 weight-only layers) stay
    integer in every stage and are converted to floats where they are used
    (defer-dequant); by default the conversion is static work, folded.
    trust_model: load a .pt2 even where that needs an unrestricted unpickle
    (which can run any code the file holds); by default such files are refused.
    generate, max_seq, sequences: a generation step over a KV cache of `sequences`
    slots of `max_seq` positions (compiler/generation.py); lora_config: with a
    save_pretrained directory as the model, a PEFT adapter directory whose
    adapter_config.json names the LoRA sites.
    """

    stages: tuple = ()
    target: str = "cpu"
    cpu: str = "host"
    emit: str = "vmfb"
    dump_dir: str | None = None
    merge_lora: bool = True
    keep_quantized: bool = False
    max_adapters: int | None = None
    max_rank: int = 16
    custom_kernels: bool | str = True
    trust_model: bool = False
    verbose: bool = False
    generate: bool = False
    max_seq: int = 2048
    sequences: int = 8
    lora_config: str | None = None

    def __post_init__(self):
        stages = self.stages.items() if isinstance(self.stages, dict) else (self.stages or ())
        if isinstance(stages, str) or any(not isinstance(p, (tuple, list)) or len(p) != 2 for p in stages):
            raise CompileError(f"stages is {self.stages!r}: pass {{glob: time}} or [(glob, time), ...], "
                               "e.g. {'encoder.*': 'adapter'}")
        object.__setattr__(self, "stages", tuple((g, BindingTime.parse(t)) for g, t in stages))
        if self.emit not in EMITS:
            raise CompileError(f"unknown stage {self.emit!r} to emit: choose one of {', '.join(EMITS)}")
        if self.custom_kernels not in KERNELS:
            raise CompileError(f"custom_kernels is True, False or 'reference', not {self.custom_kernels!r}")
        if self.max_adapters is not None:
            if isinstance(self.max_adapters, bool) or int(self.max_adapters) < 1 or int(self.max_rank) < 1:
                raise CompileError(f"max_adapters ({self.max_adapters}) and max_rank ({self.max_rank}) "
                                   "must be at least 1")
            if not self.merge_lora:
                raise CompileError("a multi-tenant residual holds both forms and chooses per adapter when serving: "
                                   "drop --no-lora-merge (merge_lora=False) and load with policy='factorized' instead")
            object.__setattr__(self, "max_adapters", int(self.max_adapters))
        object.__setattr__(self, "max_rank", int(self.max_rank))
        if self.generate and (isinstance(self.max_seq, bool) or int(self.max_seq) < 1 or int(self.sequences) < 1):
            raise CompileError(f"max_seq ({self.max_seq}) and sequences ({self.sequences}) must be at least 1")

    @property
    def multi_tenant(self) -> bool:
        return self.max_adapters is not None
