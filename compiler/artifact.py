"""The compile result: residual .vmfb, parameter archive and manifest."""

import json
import os
from importlib import metadata

import numpy as np
from iree import runtime as iree_rt

from stageml.compiler.lowering import PARAMETER_SCOPE, TARGETS
from stageml.runtime.module import FORMAT, numpy_dtype

DEFAULT_ADAPTER = "default_adapter/"


def _versions() -> dict:
    names = ("torch", "torch-mlir", "iree-base-compiler", "iree-base-runtime", "stageml")
    return {n: metadata.version(n) for n in names}


class Artifact:
    """What `stageml.compile` returns.

    Attributes:
      report: the compile report (`print(art.report)`).
      mlir: {stage: text or bytes} for every stage produced.
      vmfb: the residual module (bytes); None when compilation stopped early.
      parameters: {name: ndarray} folded by partial evaluation.
      default_adapter: {name: ndarray} the adapter weights the model came with.
      tenants: for a multi-tenant compile, {"max_adapters", "max_rank", "sites"}.
    """

    def __init__(self):
        self.report = None
        self.mlir = {}
        self.vmfb = None
        self.parameters = {}
        self.default_adapter = {}
        self.signatures = {}
        self.tenants = None
        self.target = "cpu"

    def manifest(self, stem: str) -> dict:
        """The .json manifest. Per entry point: `inputs` in call order after
        `state` (the adapter state @forward takes first, as @adapter returns
        it); a factorized @adapter also takes the slot last, and its state
        lives in `tables`."""
        entry_points = {}
        for name, sig in self.signatures.items():
            if name.startswith("static"):
                continue
            time = "dynamic" if name.startswith("forward") else "adapter"
            entry = {"inputs": [a.as_dict() for a in sig.args if a.time == time]}
            if name.startswith("forward"):
                entry["state"] = [a.name for a in sig.args if a.time == "adapter" and not a.table]
                entry["outputs"] = [r.as_dict() for r in sig.results]
            elif name.endswith("_factorized"):
                entry["tables"] = [r.as_dict() for r in sig.results]
            else:
                entry["state"] = [r.as_dict() for r in sig.results]
            entry_points[name] = entry
        manifest = {"format": FORMAT, "target": self.target, "device": TARGETS[self.target].device,
                    "vmfb": stem + ".vmfb",
                    "parameters": stem + ".irpa", "parameter_scope": PARAMETER_SCOPE,
                    "default_adapter_prefix": DEFAULT_ADAPTER, "entry_points": entry_points,
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
