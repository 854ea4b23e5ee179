"""The compile result: residual .vmfb, parameter archive and manifest."""

import json
import os
from importlib import metadata

import numpy as np
from iree import runtime as iree_rt

from stageml.compiler.passes.use_parameters import SCOPE
from stageml.errors import ArtifactError, OutputError
from stageml.files import write_files
from stageml.runtime.manifest import FORMAT, artifact_files, file_entry
from stageml.runtime.module import numpy_dtype

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
      tenants: for a multi-tenant compile, {"max_adapters", "max_rank", "sites", "unread"}.
      target: what the target records of itself (name, device, ...).
      source: the model file compiled (None for a module): `save` never overwrites it.
    """

    def __init__(self):
        self.report = None
        self.mlir = {}
        self.vmfb = None
        self.entry_points = []
        self.parameters = {}
        self.default_adapter = {}
        self.tenants = None
        self.generation = None  # a generation step's {"sequences", "max_seq", "eos", and its inputs' names}
        self.target = {"name": "cpu", "device": "local-task"}
        self.source = None

    def plan(self, form: str = "json"):
        """The serving plan a load starts from (the runtime's `mod.plan()` before any adapter
        is loaded: policy "auto", no budget, no pairs): each MoE layer's sites and its costs per
        (tenant, expert). JSON-ready data, or with `form="mlir"` verified plan-dialect text."""
        from stageml.compiler.entry_points import routing_sites
        from stageml.policy import expert_layers
        if self.tenants is None:
            raise OutputError("a plan is made for a multi-tenant residual: compile with max_adapters")
        if form not in ("json", "mlir"):
            raise OutputError(f"plan form {form!r} is unknown: pass 'json' or 'mlir'")
        layers = expert_layers(self.tenants["sites"], routing_sites(self.entry_points), self.tenants["max_rank"])
        plan = {"policy": "auto", "budget": None, "bytes_held": 0, "layers": layers, "pairs": []}
        if form == "mlir":
            from stageml.dialects.plan import plan_mlir
            return plan_mlir(plan)
        return plan

    def manifest(self, files: dict) -> dict:
        """The .json manifest: everything the runtime needs, derived from the IR, and
        `files` ({"module": ..., "parameters": ...}: each one's name, size and hash)."""
        manifest = {"format": FORMAT, "target": self.target, "device": self.target["device"], "files": files,
                    "parameter_scope": SCOPE, "default_adapter_prefix": DEFAULT_ADAPTER,
                    "entry_points": self.entry_points, "report": self.report.as_dict(), "versions": _versions()}
        if self.tenants is not None:
            manifest["tenants"] = self.tenants
        if self.generation is not None:
            manifest["generation"] = self.generation
        return manifest

    def save(self, path: str) -> str:
        """Writes PATH (.vmfb), and .irpa and .json beside it; returns PATH.

        Atomic: each file is written under a temporary name and renamed into
        place, the manifest last (it names the others' sizes and hashes, so a
        mix of old and new files fails to load); a failure leaves an earlier
        artifact at PATH as it was."""
        if self.vmfb is None:
            raise ArtifactError("this artifact stopped before the vmfb stage and has no module to save: "
                                "compile with emit='vmfb'")
        targets = artifact_files(path)
        if self.source is not None:
            for target in targets.values():
                if os.path.abspath(target) == os.path.abspath(self.source):
                    raise OutputError(f"saving to {path!r} would overwrite the model file {self.source!r}: "
                                      "choose another output path")
        written = {}

        def parameters(temp):
            self._write_parameters(temp)
            written["parameters"] = temp

        def module(temp):
            with open(temp, "wb") as f:
                f.write(self.vmfb)
            written["module"] = temp

        def manifest(temp):  # the others' contents, under the names they will have once renamed
            files = {role: file_entry(written[role], os.path.basename(targets[role])) for role in written}
            with open(temp, "w") as f:
                json.dump(self.manifest(files), f, indent=1)

        write_files([(targets["parameters"], parameters), (targets["module"], module),
                     (targets["manifest"], manifest)])
        return targets["module"]

    def _write_parameters(self, path: str) -> None:
        index = iree_rt.ParameterIndex()
        entries = {**self.parameters, **{DEFAULT_ADAPTER + k: v for k, v in self.default_adapter.items()}}
        for key, value in entries.items():
            value = np.ascontiguousarray(value)
            if value.dtype == numpy_dtype("bfloat16"):  # IREE's archive writer has no bfloat16: same bits
                value = value.view(np.uint16)
            if value.size and not value.view(np.uint8).any():  # zeros (a KV cache's start): a splat, no bytes
                # (of one zero byte: IREE fills with patterns of 1, 2 or 4 bytes, not an int64's 8)
                index.add_splat(key, bytes(1), value.nbytes)
            else:
                iree_rt.parameter_index_add_numpy_ndarray(index, key, value)
        index.create_archive_file(path)

    def load(self, path: str, device: str | None = None, **serving):
        """Saves to PATH and loads the result (`stageml.load`)."""
        from stageml.runtime import load
        return load(self.save(path), device=device, **serving)
