"""Loading and calling a compiled residual (.vmfb + .irpa + .json)."""

import functools
import json
import math
import os
import re
import threading
import time

import numpy as np
import pydantic
from iree import runtime as iree_rt

from stageml.errors import ArtifactError, InputError
from stageml.runtime import manifest as manifests


def as_numpy(value) -> np.ndarray:
    """A numpy array of a torch tensor (bfloat16 as ml_dtypes.bfloat16) or array-like."""
    if hasattr(value, "detach"):
        import torch
        value = value.detach().cpu()
        if value.dtype == torch.bfloat16:  # numpy has no bfloat16: reinterpret the bits
            return value.view(torch.int16).numpy().view(numpy_dtype("bfloat16"))
        return value.numpy()
    return np.asarray(value)


def _is_torch(value) -> bool:
    return _is_torch_type(type(value))


@functools.cache
def _is_torch_type(kind: type) -> bool:
    return kind.__module__.startswith("torch") and hasattr(kind, "__dlpack__")


ACCEPTED_KEPT = 1024  # the (shape, dtype) pairs an input remembers as checked (see InputSpec)
HOST_EXTREMES = 4096  # index tensors up to this many values are range-checked on the host (see _extremes)


class InputSpec:
    """A request input as the residual describes it (the manifest's entry: name, shape, dtype,
    the export's dimension ranges, for indices the values allowed), and the (shape, dtype)
    pairs it has accepted: a decode loop passes the same shape at every step, and a shape
    once checked is a set lookup after (`check`)."""

    def __init__(self, spec: dict):
        self.spec, self.name, self.dtype = spec, spec["name"], spec["dtype"]
        self.range = spec.get("range")
        self._accepted = set()

    def check(self, value, direct: bool):
        """(`value` as the call passes it on, its shape), after checking it: shape, dtype, the
        export's dimension ranges and, for indices, the values the tables allow. A torch
        tensor on the module's own kind of device ("cpu" or "cuda": `direct`) is passed on
        as it is, to be shared with IREE (DLPack), anything else as a contiguous numpy array."""
        if direct:
            if value.requires_grad:
                value = value.detach()
            if not value.is_contiguous():
                value = value.contiguous()
            shape, dtype = value.shape, _torch_dtype_name(value.dtype)
        else:
            value = np.asarray(as_numpy(value), order="C")
            shape, dtype = value.shape, value.dtype.name
        if (shape, dtype) not in self._accepted:
            self._check_shape(tuple(shape), dtype)
            if len(self._accepted) >= ACCEPTED_KEPT:
                self._accepted.clear()
            self._accepted.add((shape, dtype))
        if self.range is not None and math.prod(shape):
            low, high = _extremes(value, direct)
            if low < self.range["min"] or high > self.range["max"]:
                raise InputError(f"input {self.name!r} holds {low if low < self.range['min'] else high}, outside "
                                 f"{self.range['min']}..{self.range['max']} (the rows of the table it indexes): pass "
                                 "indices inside the table, e.g. token ids below the vocabulary size")
        return value, shape

    def _check_shape(self, shape: tuple, dtype: str) -> None:
        spec = self.spec
        shape_ok = len(shape) == len(spec["shape"]) and all(d is None or d == s for d, s in zip(spec["shape"], shape))
        if not shape_ok or dtype != self.dtype:
            expected = "[" + ", ".join("?" if d is None else str(d) for d in spec["shape"]) + "] " + self.dtype
            raise InputError(f"input {self.name!r} has shape {list(shape)} {dtype}; expected {expected}")
        for axis, (size, bound) in enumerate(zip(shape, spec.get("dims", ()))):
            if size < bound["min"] or size > bound.get("max", size):
                allowed = f"{bound['min']}..{bound['max']}" if "max" in bound else f"at least {bound['min']}"
                raise InputError(f"input {self.name!r} has {size} along dimension {axis}, outside the exported "
                                 f"range {allowed}: split the request, or export with a larger Dim max")


def _extremes(value, direct: bool) -> tuple[int, int]:
    """The least and the greatest of an index array's values (a torch tensor when `direct`). A
    tensor of up to HOST_EXTREMES values is copied to the host whole: on a GPU that is one
    copy, where reading the two values aminmax finds is two (on an H100's host, 1 x 16 token
    ids: 22 against 40 µs)."""
    if direct and value.numel() > HOST_EXTREMES:
        low, high = value.aminmax()
        return int(low), int(high)
    host = value.cpu().numpy() if direct else value
    return int(host.min()), int(host.max())


@functools.cache
def _torch_dtype_name(dtype) -> str:
    """The manifest's name of a torch dtype ("float16"); str() of a dtype costs a call more."""
    return str(dtype).removeprefix("torch.")


class Request:
    """A call's checked inputs: `values` (by input name, as IREE takes them), their
    `shapes` (in input order), and whether results go back as torch tensors (on
    `torch_device`) or, for numpy inputs, as numpy arrays."""

    def __init__(self, module, values: dict, shapes: list, torch_device):
        self.values, self.shapes, self.torch_device = values, shapes, torch_device
        self._module = module

    @property
    def rows(self) -> list:
        return [s[0] if s else 0 for s in self.shapes]

    def outputs(self, results):
        """IREE's results as this request returns them (a tuple for several outputs)."""
        returned = self._module._returned
        if not isinstance(results, (tuple, list)):
            return returned(results, self.torch_device)
        converted = tuple(returned(r, self.torch_device) for r in results)
        return converted if len(converted) > 1 else converted[0]


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of a manifest dtype name ("bfloat16" is ml_dtypes')."""
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


_DLPACK_CPU, _DLPACK_CUDA = 1, 2  # DLPack's device type codes
FENCED = ("iree.abi.model", "coarse-fences")  # IREE's reflection of a function compiled async-external
POLL_NS = 2_000_000  # how long a call on a GPU polls for its completion before it sleeps (see _wait)
CUDA_FLAGS = ("--cuda_async_allocations=false",)  # IREE's runtime flags and allocators for CUDA residuals
CUDA_ALLOCATORS = ("caching",)                      # (see _runtime_config)


@functools.cache
def _runtime_config(device: str) -> iree_rt.Config:
    """IREE's runtime for `device`, one per process: the residuals loaded for it share
    its device (streams and allocator pool), which outlives every buffer they return
    (IREE frees a buffer through its device; one freed after its device is gone
    crashed the process). CUDA gets IREE's caching allocator: with the
    default one, every call's buffer allocations cost more than the residual
    (on an H200, a multi-tenant call took 1.9 ms with numpy inputs, 0.19 ms
    with caching; iree-benchmark-module timed the same function at 0.08 ms).
    Its allocations are not stream-ordered (`--cuda_async_allocations=false`,
    IREE's flag, set before the process's first CUDA driver): IREE exports
    only those buffers to DLPack, so results reach torch without a copy."""
    if device == "cuda":
        iree_rt.flags.parse_flags(*CUDA_FLAGS)
        return iree_rt.Config(device=iree_rt.get_driver("cuda").create_default_device(allocators=list(CUDA_ALLOCATORS)))
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


def _path(path) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise ArtifactError(f"a residual is loaded from the path of its .vmfb, not a {type(path).__name__}: pass the "
                            "path stagemlc or Artifact.save wrote")
    return os.fspath(path)


def _described(module, vmfb_path: str) -> tuple[list, dict | None, dict | None]:
    """(the entry points the module describes itself, its multi-tenant configuration or None, its
    generation step's configuration or None), from its functions' reflection
    (compiler/passes/entry_reflection.py)."""
    described, tenants, generation = [], None, None
    try:
        for name in module.function_names:
            reflection = module.lookup_function(name).reflection
            if manifests.REFLECTED_ENTRY in reflection:
                described.append(manifests.EntryPoint.model_validate(json.loads(reflection[manifests.REFLECTED_ENTRY])))
            if manifests.REFLECTED_TENANTS in reflection:
                tenants = manifests.Tenants.model_validate(json.loads(reflection[manifests.REFLECTED_TENANTS]))
            if manifests.REFLECTED_GENERATION in reflection:
                generation = manifests.Generation.model_validate(
                    json.loads(reflection[manifests.REFLECTED_GENERATION]))
    except (ValueError, pydantic.ValidationError):
        raise ArtifactError(f"module {vmfb_path!r} describes its entry points in a form this StageML does not "
                            "read: recompile the model with this StageML") from None
    stages = [(e.stage, e.program) for e in described]
    if ("dynamic", "main") not in stages or len(set(stages)) != len(stages):
        raise ArtifactError(f"module {vmfb_path!r} is not a StageML residual (it describes no request-time "
                            "entry point): compile the model with stagemlc")
    return ([e.model_dump(exclude_none=True) for e in described],
            None if tenants is None else tenants.model_dump(exclude_none=True),
            None if generation is None else generation.model_dump())


def _check_agrees(checked, described: list, tenants: dict | None, generation: dict | None,
                  manifest_path: str) -> None:
    """Refuses a manifest whose entry points, tenants or generation step differ from what the
    module says of itself."""
    listed = sorted((e.model_dump(exclude_none=True) for e in checked.entry_points), key=lambda e: e["symbol"])
    listed_tenants = None if checked.tenants is None else checked.tenants.model_dump(exclude_none=True)
    listed_generation = None if checked.generation is None else checked.generation.model_dump()
    if listed != sorted(described, key=lambda e: e["symbol"]) or listed_tenants != tenants \
            or listed_generation != generation:
        what = ("multi-tenant configuration" if listed_tenants != tenants else
                "generation step" if listed_generation != generation else "entry points")
        raise ArtifactError(f"manifest {manifest_path!r} disagrees with its module about the {what}: "
                            "use the manifest stagemlc wrote with this module")


class ResidualModule:
    """A loaded residual: call it like the model (`mod(x)`).

    @adapter runs once, at load, with the adapter weights the model was
    compiled with; its results (the adapter state, on the device) are kept
    and passed to every @forward call."""

    def __init__(self, path: str, device: str | None = None):
        path = _path(path)
        checked, self.manifest = manifests.read(path)
        device = device or checked.device
        _check_cpu(self.manifest, path)
        manifest_path = manifests.artifact_files(path)["manifest"]
        vmfb_path = manifests.locate(manifest_path, checked.files.module, "module")
        irpa_path = manifests.locate(manifest_path, checked.files.parameters, "parameter archive")
        try:
            with open(vmfb_path, "rb") as f:
                module_bytes = f.read()
        except OSError as e:
            raise ArtifactError(f"module {vmfb_path!r} cannot be read ({e.strerror}): check its permissions") from None
        manifests.verify(vmfb_path, checked.files.module, "module", module_bytes)
        manifests.verify(irpa_path, checked.files.parameters, "parameter archive")
        try:
            self._config = _runtime_config(device)
        except Exception:
            raise ArtifactError(f"IREE device {device!r} is not available here: run this {checked.target.name} "
                                "residual where that device exists, or compile for --target cpu") from None
        self._index = iree_rt.ParameterIndex()
        try:
            self._index.load(irpa_path)
            entries = {key: entry for key, entry in self._index.items()}
        except Exception:
            raise ArtifactError(f"parameter archive {irpa_path!r} is corrupt or truncated: recompile the model") from None
        instance = self._config.vm_instance
        try:
            main = iree_rt.VmModule.copy_buffer(instance, module_bytes)
        except Exception:
            raise ArtifactError(f"module {vmfb_path!r} is corrupt: recompile the model") from None
        described, self.tenants, self.generation = _described(main, vmfb_path)
        _check_agrees(checked, described, self.tenants, self.generation, manifest_path)
        provider = self._index.create_provider(scope=checked.parameter_scope)
        params = iree_rt.create_io_parameters_module(instance, provider)
        try:
            self._context = iree_rt.VmContext(instance, modules=(*self._config.default_vm_modules, params, main))
        except Exception as e:
            raise ArtifactError(f"module {vmfb_path!r} cannot be loaded with its parameters "
                                f"({str(e).strip().splitlines()[0]}): recompile the model") from None
        self._entries = entries
        # each entry point's VM function, its arguments' sources and its results' dtypes, found once
        self._functions = {e["symbol"]: self._function(main, e, vmfb_path) for e in described}
        self._no_wait = iree_rt.HalFence(0)  # the wait fence of every call: nothing to wait for
        self._invoking = threading.Lock()     # IREE's VM context takes one call at a time (see _call)
        self._device_kind = "cuda" if device.startswith("cuda") else "cpu"
        self._exports = True  # results can be shared with torch (DLPack), until IREE says otherwise
        self._stream = None   # (raw handle, torch.cuda.Stream) of the torch stream last waited for
        self._default_prefix = checked.default_adapter_prefix
        self._entry_points = {(e["stage"], e["program"]): e for e in described}
        self._inputs = [a for a in self.entry("dynamic")["arguments"] if a["kind"] == "input"]
        self._input_specs = [InputSpec(a) for a in self._inputs]
        self._outputs = [r for r in self.entry("dynamic")["results"] if r["kind"] == "output"]
        # each output's dimensions (ints and Polynomials), read once; None where the export stated none
        self._sizes = [None if "sizes" not in r else [s if isinstance(s, int) else manifests.Polynomial.model_validate(s)
                                                      for s in r["sizes"]] for r in self._outputs]
        self._state = []
        adapter = self.entry("adapter")
        if adapter is not None and self.tenants is None:
            self._state = self._run_adapter(self._default_adapter(adapter))

    @staticmethod
    def _function(main, entry: dict, vmfb_path: str) -> tuple:
        """(the VM function of `entry`, each argument's source: (the index of the @adapter result
        it is, None) for adapter state, else (None, its name); its results' dtypes), once the
        function is known to take a wait and a signal fence (lowering.RESIDUAL_FLAGS)."""
        function = main.lookup_function(entry["symbol"])
        if function.reflection.get(FENCED[0]) != FENCED[1]:
            raise ArtifactError(f"module {vmfb_path!r} was compiled by an earlier StageML (its entry points wait for "
                                "their own work): recompile the model with this StageML")
        sources = tuple((a["result"], None) if a["kind"] == "state" else (None, a["name"]) for a in entry["arguments"])
        return function, sources, [numpy_dtype(r["dtype"]) for r in entry["results"]]

    def entry(self, stage: str, program: str = "main") -> dict | None:
        """The manifest's entry point of `stage` ("adapter" or "dynamic") in `program`, or None."""
        return self._entry_points.get((stage, program))

    def _default_adapter(self, adapter: dict) -> dict:
        prefix = self._default_prefix
        try:
            return {s["name"]: iree_rt.parameter_index_entry_as_numpy_ndarray(self._entries[prefix + s["name"]])
                    .view(numpy_dtype(s["dtype"])) for s in adapter["arguments"] if s["kind"] == "input"}
        except Exception:
            raise ArtifactError("the parameter archive lacks the default adapter weights: recompile the model") from None

    def _call(self, entry: dict, named: dict, state=()):
        """Calls `entry` with its arguments in the IR's order: adapter state by the
        @adapter result each one is, everything else by name from `named`. Returns
        its results as device arrays (one, or a list).

        The VM call is made here, not through IREE's FunctionInvoker, which re-reads
        the function's reflection and wraps every argument and result on each call
        (about 20 µs of a multi-tenant decode call on an H200's host). The residual is
        compiled async-external (lowering.RESIDUAL_FLAGS): its call returns once the work
        is queued, and this one then waits for the signal fence it passed (`_wait`). IREE
        releases the GIL inside the VM call, and its context must not run two calls at once:
        threads sharing a module queue their calls one at a time and wait for them together."""
        function, sources, dtypes = self._functions[entry["symbol"]]
        arguments = iree_rt.VmVariantList(len(sources) + 2)
        for result, name in sources:
            value = named[name] if result is None else state[result]
            if isinstance(value, int):  # a scalar argument (the slot @adapter_factorized writes)
                arguments.push_int(value)
            else:
                arguments.push_ref(self._buffer_view(value).ref)
        done = self._config.device.create_semaphore(0)
        arguments.push_ref(self._no_wait.ref)
        arguments.push_ref(iree_rt.HalFence.create_at(done, 1).ref)
        results = iree_rt.VmVariantList(len(dtypes))
        try:
            with self._invoking:
                self._context.invoke(function, arguments, results)
        except RuntimeError as e:  # the residual's own checks (cf.assert) fail a call as FAILED_PRECONDITION
            refused = str(e).partition("FAILED_PRECONDITION;")[2].strip().split(";")[0].strip()
            if not refused:
                raise
            raise InputError(f"the residual refused the call: {refused}") from None
        except ValueError as e:  # IREE's check of an argument against the compiled signature (INVALID_ARGUMENT)
            clauses = [c.strip() for c in str(e).partition("INVALID_ARGUMENT;")[2].split(";")[:2]]
            argument = re.match(r"input(\d+) ", clauses[0])
            if argument is None or int(argument.group(1)) >= len(entry["arguments"]):
                raise
            name = entry["arguments"][int(argument.group(1))]["name"]
            raise InputError(f"the residual refused {name!r} ({'; '.join(clauses)}): IREE compiled it for fewer shapes "
                             "than its export allows, so call it with the shape IREE expects, or export that "
                             "dimension static") from None
        self._wait(done)
        arrays = [iree_rt.DeviceArray(self._config.device, results.get_as_object(i, iree_rt.HalBufferView),
                                      implicit_host_transfer=True, override_dtype=dtype)
                  for i, dtype in enumerate(dtypes)]
        return arrays[0] if len(arrays) == 1 else arrays

    def _wait(self, done) -> None:
        """Returns once semaphore `done` reaches 1 (the call's work is complete). On a GPU the
        caller polls for up to POLL_NS (releasing the GIL between polls) before it sleeps:
        IREE's own wait sleeps at once, and waking the caller again costs a call more than
        the polling's CPU time (on an H100, the 8-layer decode stack's `run_batch` took
        260 µs at 1 row and 296 at 32 polling, 307 and 323 sleeping, 274 and 340 as IREE's
        synchronous call). On the CPU, IREE's worker threads need the cores: it sleeps."""
        if self._device_kind == "cuda":
            deadline = time.perf_counter_ns() + POLL_NS
            while not done.wait(1, timeout=0):
                if time.perf_counter_ns() > deadline:
                    break
            else:
                return
        done.wait(1)

    def _buffer_view(self, value) -> iree_rt.HalBufferView:
        """`value` (an imported buffer view, a device array or a numpy array, copied) on the device."""
        if isinstance(value, iree_rt.HalBufferView):
            return value
        if not isinstance(value, iree_rt.DeviceArray):
            value = iree_rt.asdevicearray(self._config.device, value)
        return value._buffer_view

    def _run_adapter(self, named: dict, program: str = "main") -> list:
        """Runs the adapter stage of `program` on {input name: array}; returns its results (device arrays)."""
        state = self._call(self.entry("adapter", program), {k: np.asarray(v, order="C") for k, v in named.items()})
        return list(state) if isinstance(state, (tuple, list)) else [state]

    @property
    def state(self) -> list:
        """The adapter state (device arrays, in @adapter's result order) @forward takes."""
        return list(self._state)

    @property
    def inputs(self) -> list:
        """The request inputs, in call order: [{"name", "shape", "dtype", ...}]."""
        return self._inputs

    @property
    def outputs(self) -> list:
        """The request results a call returns, in order: [{"name", "shape", "dtype", "sizes"?}]."""
        return self._outputs

    def output_shapes(self, shapes: list) -> list:
        """Each output's shape for inputs of `shapes` (in input order; ints or torch SymInts), from
        the export's statement of its dimensions (`sizes`); None for an output without one."""
        named = {spec["name"]: shape for spec, shape in zip(self.inputs, shapes)}
        return [None if sizes is None else tuple(s if isinstance(s, int) else s.of(named) for s in sizes)
                for sizes in self._sizes]

    def _check_inputs(self, inputs) -> Request:
        specs = self._input_specs
        if len(inputs) != len(specs):
            names = ", ".join(s.name for s in specs)
            raise InputError(f"the residual takes {len(specs)} input(s) ({names}), got {len(inputs)}: pass exactly those")
        values, shapes, torch_device = {}, [], None
        for spec, given in zip(specs, inputs):
            device = given.device if _is_torch(given) else None
            direct = device is not None and device.type == self._device_kind
            value, shape = spec.check(given, direct)
            values[spec.name] = self._imported(value, device) if direct else value
            shapes.append(shape)
            if torch_device is None:
                torch_device = device
        return Request(self, values, shapes, torch_device)

    def _imported(self, tensor, device):
        """A torch tensor on this module's device (`device`, its torch device) as an IREE buffer view,
        shared (DLPack), once the work queued on it is done (IREE runs on a stream of its own)."""
        import torch
        if device.type == "cuda":
            stream = self._torch_stream(device)
            if not stream.query():
                stream.synchronize()
        return self._config.device.from_dlpack_capsule(torch.utils.dlpack.to_dlpack(tensor))

    def _torch_stream(self, device):
        """torch's current stream on CUDA `device`. torch.cuda.current_stream builds a Stream
        object on every call (4.4 µs of a 1-row call's host time on an H100): the one built for the
        stream current now is kept, and used again while the current stream has the same raw handle."""
        import torch
        raw = torch._C._cuda_getCurrentRawStream(device.index)
        if self._stream is None or self._stream[0] != raw:
            self._stream = (raw, torch.cuda.current_stream(device))
        return self._stream[1]

    def _returned(self, result, torch_device):
        """One result: numpy, or a torch tensor on `torch_device`, sharing IREE's buffer
        where IREE can export it (DLPack), else copied through the host."""
        if torch_device is None:
            return np.asarray(result.to_host())
        import torch
        if torch_device.type == self._device_kind and self._exports:
            code, index = (_DLPACK_CUDA, torch_device.index or 0) if self._device_kind == "cuda" else (_DLPACK_CPU, 0)
            try:
                return torch.utils.dlpack.from_dlpack(
                    self._config.device.create_dlpack_capsule(result._buffer_view, code, index))
            except RuntimeError:  # IREE exports no stream-ordered CUDA buffers: a driver made without CUDA_FLAGS
                self._exports = False
        host = np.asarray(result.to_host())
        if host.dtype == numpy_dtype("bfloat16"):  # torch takes no ml_dtypes arrays: the same bits
            return torch.from_numpy(host.view(np.int16)).view(torch.bfloat16).to(torch_device)
        return torch.from_numpy(host).to(torch_device)

    def __call__(self, *inputs):
        request = self._check_inputs(inputs)
        return request.outputs(self._call(self.entry("dynamic"), request.values, self._state))


def load(path: str, device: str | None = None, **serving):
    """Loads `residual.vmfb` with its `.irpa` and `.json`: a ResidualModule (a TenantModule when
    compiled with max_adapters), or for a generation step (generate=True) a Generator over it.

    Args:
      path: the .vmfb stagemlc or Artifact.save wrote.
      device: the IREE device; default: the one the residual was compiled for
        ("local-task", the CPU, or "cuda").
      **serving: for a multi-tenant residual (compiled with max_adapters):
        adapter_memory_budget (bytes, None: unlimited), policy ("auto",
        "merged" or "factorized"), replan_every (calls between re-plans),
        quantization_error_bound (an int8 base compiled with keep_quantized:
        the largest error, relative to an adapter's update, its re-quantized
        merge may have to be served merged; default 0.05).
    """
    checked = manifests.read(_path(path))[0]
    if checked.tenants is not None:
        from stageml.runtime.tenants import SERVING, TenantModule
        unknown = sorted(set(serving) - set(SERVING))
        if unknown:
            raise ArtifactError(f"unknown serving option {unknown[0]!r}: choose from {', '.join(SERVING)}")
        module = TenantModule(path, device, **serving)
    elif serving:
        raise ArtifactError(f"{', '.join(serving)} apply to multi-tenant residuals only: compile with max_adapters")
    else:
        module = ResidualModule(path, device)
    if module.generation is not None:
        from stageml.runtime.generation import Generator
        return Generator(module)
    return module
