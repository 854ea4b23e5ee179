"""Targets: what a residual is compiled for, each one object owning its facts.

A target knows the IREE backend and runtime device, the IREE-side passes
that make the residual's IREE input ready for it (`passes`), the flags
iree-compile needs (`flags`, and `flag_choices` where a crash of
iree-compile has a workaround), and what the manifest records about it
(`describe`). Adding a target is one file here plus a line in TARGETS.
"""

import importlib

from stageml.errors import CompileError

TARGETS = {"cpu": "stageml.compiler.targets.cpu:CpuTarget",
           "cuda": "stageml.compiler.targets.cuda:CudaTarget",
           "sm90": "stageml.compiler.sm90.target:Sm90Target"}


class Target:
    """The interface every target implements."""

    name: str      # the key in TARGETS
    backend: str   # IREE target backend
    device: str    # IREE runtime device that runs the residual
    counts_kernels = False  # its passes may swap products for StageML's kernels (the report counts them)

    def passes(self) -> list:
        """[(pass name, options)]: IREE-side passes on the residual's IREE input."""
        return []

    def flags(self, module) -> list:
        """iree-compile flags for the residual `module` (IREE input, IREE's bindings)."""
        return []

    def flag_choices(self, module) -> list:
        """The flags to compile `module` with, best first: each next one is tried when
        iree-compile crashed on the one before."""
        return [self.flags(module)]

    def describe(self) -> dict:
        """What the manifest records about the target."""
        return {"name": self.name, "device": self.device}


def get_target(options) -> Target:
    """The target object `options` (a CompileOptions) names."""
    if options.target not in TARGETS:
        raise CompileError(f"unknown target {options.target!r}: choose one of {', '.join(TARGETS)}")
    module, cls = TARGETS[options.target].split(":")
    return getattr(importlib.import_module(module), cls).from_options(options)
