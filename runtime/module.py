"""Loading and calling a compiled residual (.vmfb + .irpa + .json)."""

import json
import os

import numpy as np
from iree import runtime as iree_rt

from stageml.errors import ArtifactError, InputError

FORMAT = "stageml-residual/3"


def _read_manifest(vmfb_path: str) -> dict:
    stem = vmfb_path[:-5] if vmfb_path.endswith(".vmfb") else vmfb_path
    path = stem + ".json"
    try:
        with open(path) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise ArtifactError(f"manifest {path!r} is missing: keep the .json that stagemlc wrote beside the .vmfb") from None
    except (OSError, ValueError):
        raise ArtifactError(f"manifest {path!r} is corrupt: recompile the model with stagemlc") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(f"manifest {path!r} is not a {FORMAT} manifest: recompile the model with stagemlc")
    return manifest


def as_numpy(value) -> np.ndarray:
    """A numpy array of a torch tensor (bfloat16 as ml_dtypes.bfloat16) or array-like."""
    if hasattr(value, "detach"):
        import torch
        value = value.detach().cpu()
        if value.dtype == torch.bfloat16:  # numpy has no bfloat16: reinterpret the bits
            return value.view(torch.int16).numpy().view(numpy_dtype("bfloat16"))
        return value.numpy()
    return np.asarray(value)


def _check_input(spec: dict, value) -> np.ndarray:
    value = as_numpy(value)
    expected = "[" + ", ".join("?" if d is None else str(d) for d in spec["shape"]) + "] " + spec["dtype"]
    shape_ok = value.ndim == len(spec["shape"]) and all(
        d is None or d == s for d, s in zip(spec["shape"], value.shape))
    if not shape_ok or value.dtype != numpy_dtype(spec["dtype"]):
        raise InputError(f"input {spec['name']!r} has shape {list(value.shape)} {value.dtype}; "
                         f"expected {expected}")
    return np.ascontiguousarray(value)


def as_outputs(results):
    """IREE results as numpy arrays (a tuple for several outputs)."""
    if isinstance(results, (tuple, list)):
        return tuple(np.asarray(r.to_host()) for r in results)
    return np.asarray(results.to_host())


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of a manifest dtype name ("bfloat16" is ml_dtypes')."""
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _runtime_config(device: str) -> iree_rt.Config:
    """IREE's runtime for `device`. CUDA gets IREE's caching allocator: with the
    default one, every call's buffer allocations cost more than the residual
    (on an H200, a multi-tenant call took 1.9 ms with numpy inputs, 0.19 ms
    with caching; iree-benchmark-module timed the same function at 0.08 ms)."""
    if device == "cuda":
        return iree_rt.Config(device=iree_rt.get_driver("cuda").create_default_device(allocators=["caching"]))
    return iree_rt.Config(device)


def _check_cpu(manifest: dict, path: str) -> None:
    """A CPU residual runs only where the CPU has the vector features it was compiled for."""
    target = manifest.get("target", {})
    if target.get("name") != "cpu":
        return
    from stageml.compiler.targets.cpu import host_features
    missing = sorted(set(target.get("features", ())) - host_features())
    if missing:
        raise ArtifactError(f"{path!r} was compiled for CPU {target.get('cpu')!r}, whose features "
                            f"{', '.join(missing)} this CPU lacks: recompile it here (--cpu host) or name a "
                            "CPU both machines share (e.g. --cpu x86-64-v3)")


class ResidualModule:
    """A loaded residual: call it like the model (`mod(x)`).

    @adapter runs once, at load, with the adapter weights the model was
    compiled with; its results (the adapter state, on the device) are kept
    and passed to every @forward call."""

    def __init__(self, path: str, device: str | None = None):
        path = os.fspath(path)
        self.manifest = _read_manifest(path)
        device = device or self.manifest["device"]
        _check_cpu(self.manifest, path)
        directory = os.path.dirname(os.path.abspath(path))
        vmfb_path = os.path.join(directory, self.manifest["vmfb"])
        irpa_path = os.path.join(directory, self.manifest["parameters"])
        for file, what in ((vmfb_path, "module"), (irpa_path, "parameter archive")):
            if not os.path.isfile(file):
                raise ArtifactError(f"{what} {file!r} is missing: keep the files stagemlc wrote together")
        try:
            self._config = _runtime_config(device)
        except Exception:
            raise ArtifactError(f"IREE device {device!r} is not available here: run this {self.manifest['target']['name']} "
                                "residual where that device exists, or compile for --target cpu") from None
        self._index = iree_rt.ParameterIndex()
        try:
            self._index.load(irpa_path)
            entries = {key: entry for key, entry in self._index.items()}
        except Exception:
            raise ArtifactError(f"parameter archive {irpa_path!r} is corrupt or truncated: recompile the model") from None
        instance = self._config.vm_instance
        try:
            with open(vmfb_path, "rb") as f:
                main = iree_rt.VmModule.copy_buffer(instance, f.read())
        except Exception:
            raise ArtifactError(f"module {vmfb_path!r} is corrupt: recompile the model") from None
        provider = self._index.create_provider(scope=self.manifest["parameter_scope"])
        params = iree_rt.create_io_parameters_module(instance, provider)
        self._module = iree_rt.load_vm_modules(params, main, config=self._config)[-1]
        self._entries = entries
        self._entry_points = {(e["stage"], e["program"]): e for e in self.manifest["entry_points"]}
        self._inputs = [a for a in self.entry("dynamic")["arguments"] if a["kind"] == "input"]
        self._state = []
        adapter = self.entry("adapter")
        if adapter is not None and "tenants" not in self.manifest:
            self._state = self._run_adapter(self._default_adapter(adapter))

    def entry(self, stage: str, program: str = "main") -> dict | None:
        """The manifest's entry point of `stage` ("adapter" or "dynamic") in `program`, or None."""
        return self._entry_points.get((stage, program))

    def _default_adapter(self, adapter: dict) -> dict:
        prefix = self.manifest["default_adapter_prefix"]
        try:
            return {s["name"]: iree_rt.parameter_index_entry_as_numpy_ndarray(self._entries[prefix + s["name"]])
                    .view(numpy_dtype(s["dtype"])) for s in adapter["arguments"] if s["kind"] == "input"}
        except Exception:
            raise ArtifactError("the parameter archive lacks the default adapter weights: recompile the model") from None

    def _call(self, entry: dict, named: dict, state=()):
        """Calls `entry` with its arguments in the IR's order: adapter state by the
        @adapter result each one is, everything else by name from `named`."""
        args = [state[a["result"]] if a["kind"] == "state" else named[a["name"]] for a in entry["arguments"]]
        return getattr(self._module, entry["symbol"])(*args)

    def _run_adapter(self, named: dict, program: str = "main") -> list:
        """Runs the adapter stage of `program` on {input name: array}; returns its results (device arrays)."""
        state = self._call(self.entry("adapter", program), {k: np.ascontiguousarray(v) for k, v in named.items()})
        return list(state) if isinstance(state, (tuple, list)) else [state]

    @property
    def state(self) -> list:
        """The adapter state (device arrays, in @adapter's result order) @forward takes."""
        return list(self._state)

    @property
    def inputs(self) -> list:
        """The request inputs, in call order: [{"name", "shape", "dtype", ...}]."""
        return self._inputs

    def _check_inputs(self, inputs) -> list:
        specs = self.inputs
        if len(inputs) != len(specs):
            names = ", ".join(s["name"] for s in specs)
            raise InputError(f"the residual takes {len(specs)} input(s) ({names}), got {len(inputs)}: pass exactly those")
        return [_check_input(s, v) for s, v in zip(specs, inputs)]

    def _named_inputs(self, inputs) -> dict:
        return {s["name"]: v for s, v in zip(self.inputs, self._check_inputs(inputs))}

    def __call__(self, *inputs):
        return as_outputs(self._call(self.entry("dynamic"), self._named_inputs(inputs), self._state))


def load(path: str, device: str | None = None, **serving) -> ResidualModule:
    """Loads `residual.vmfb` with its `.irpa` and `.json`.

    Args:
      path: the .vmfb stagemlc or Artifact.save wrote.
      device: the IREE device; default: the one the residual was compiled for
        ("local-task", the CPU, or "cuda").
      **serving: for a multi-tenant residual (compiled with max_adapters):
        adapter_memory_budget (bytes, None: unlimited), policy ("auto",
        "merged" or "factorized"), replan_every (calls between re-plans).
    """
    if "tenants" in _read_manifest(os.fspath(path)):
        from stageml.runtime.tenants import TenantModule
        return TenantModule(path, device, **serving)
    if serving:
        raise ArtifactError(f"{', '.join(serving)} apply to multi-tenant residuals only: compile with max_adapters")
    return ResidualModule(path, device)
