"""The StageML runtime: load a compiled residual and call it."""

from stageml.runtime.module import ResidualModule, load

__all__ = ["ResidualModule", "load"]
