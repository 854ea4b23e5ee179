"""The compile result: residual .vmfb, parameter archive and manifest."""

import json
import os
from importlib import metadata

import numpy as np
from iree import runtime as iree_rt

from stageml.compiler.passes.use_parameters import SCOPE
from stageml.runtime.module import FORMAT, numpy_dtype

DEFAULT_ADAPTER = "default_adapter/"


def _versions() -> dict:
    names = ("torch", "torch-mlir", "iree-base-compiler", "iree-base-runtime", "stageml")
    return {n: metadata.version(n) for n in names}


class Artifact:
    """What `stageml.compile` returns.

    Attributes:
      report: the compile report (`print(art.report)`).
      mlir: {stage: text} for every IR stage produced (with locations).
      vmfb: the residual module (bytes); None when compilation stopped early.
      entry_points: each entry point as the final IR describes it
        (compiler/entry_points.py): symbol, stage, program, arguments and
        results in call order, with their facts, shapes and dtypes.
      parameters: {name: ndarray} the residual reads (folded or as given).
      default_adapter: {name: ndarray} the adapter weights the model came with.
      tenants: for a multi-tenant compile, {"max_adapters", "max_rank", "sites"}.
      target: what the target records of itself (name, device, ...).
    """

    def __init__(self):
        self.report = None
        self.mlir = {}
        self.vmfb = None
        self.entry_points = []
        self.parameters = {}
        self.default_adapter = {}
        self.tenants = None
        self.target = {"name": "cpu", "device": "local-task"}

    def manifest(self, stem: str) -> dict:
        """The .json manifest: everything the runtime needs, derived from the IR."""
        manifest = {"format": FORMAT, "target": self.target, "device": self.target["device"],
                    "vmfb": stem + ".vmfb", "parameters": stem + ".irpa", "parameter_scope": SCOPE,
                    "default_adapter_prefix": DEFAULT_ADAPTER, "entry_points": self.entry_points,
                    "report": self.report.as_dict(), "versions": _versions()}
        if self.tenants is not None:
            manifest["tenants"] = self.tenants
        return manifest

    def save(self, path: str) -> str:
        """Writes PATH (.vmfb), and .irpa and .json beside it; returns PATH."""
        if self.vmfb is None:
            raise ValueError("this artifact stopped before the vmfb stage; compile with emit='vmfb'")
        directory, name = os.path.split(os.path.abspath(path))
        stem = name[:-5] if name.endswith(".vmfb") else name
        os.makedirs(directory, exist_ok=True)
        index = iree_rt.ParameterIndex()
        entries = {**self.parameters, **{DEFAULT_ADAPTER + k: v for k, v in self.default_adapter.items()}}
        for key, value in entries.items():
            value = np.ascontiguousarray(value)
            if value.dtype == numpy_dtype("bfloat16"):  # IREE's archive writer has no bfloat16: same bits
                value = value.view(np.uint16)
            iree_rt.parameter_index_add_numpy_ndarray(index, key, value)
        index.create_archive_file(os.path.join(directory, stem + ".irpa"))
        with open(os.path.join(directory, stem + ".vmfb"), "wb") as f:
            f.write(self.vmfb)
        with open(os.path.join(directory, stem + ".json"), "w") as f:
            json.dump(self.manifest(stem), f, indent=1)
        return os.path.join(directory, stem + ".vmfb")

    def load(self, path: str, device: str | None = None, **serving):
        """Saves to PATH and loads the result (`stageml.load`)."""
        from stageml.runtime import load
        return load(self.save(path), device=device, **serving)
