"""Multi-tenant serving: many LoRA adapters on one compiled residual.

    mod = stageml.load("residual.vmfb", adapter_memory_budget=512 << 20)
    mod.load_adapter("tenant-a", "adapters/a")
    y = mod(x, adapter="tenant-a")
    ys = mod.run_batch(x, adapters=["tenant-a", "tenant-b", None])   # per row

Every resident adapter holds one slot of the factorized tables, written by
@adapter_factorized (slot 0 stays zero: the base model). The cost policy
(stageml.policy) may also give it a merged form: @adapter's state, its own
`W + s·B·A` per site, kept on the device. Each call is one residual call:

  - all rows use one merged adapter → @forward with that adapter's state,
    as cheap as the base model;
  - otherwise → @forward_factorized with each row's slot: the base weights
    are read once for the whole batch and each row adds its own low-rank
    product. One merged call per tenant would read them once per tenant.

More adapters may be registered than there are slots: the least recently
used resident adapter is evicted (slot and merged state freed) and reloaded
from its source when next used. One lock serializes loads, unloads and
calls, so any number of threads may use a module; a load that fails
changes nothing.
"""

import collections
import dataclasses
import itertools
import math
import threading

import numpy as np
from iree import runtime as iree_rt

from stageml.compiler.entry_points import routing_sites
from stageml.compiler.facts import FACTORIZED, IDS, MAIN, MEASURE, ROUTING
from stageml.errors import AdapterError, ArtifactError, InputError
from stageml.policy import AdapterProfile, LoraSite, expert_layers, plan, requantization_reason
from stageml.runtime import peft_adapter
from stageml.runtime.module import ResidualModule, numpy_dtype

POLICIES = ("auto", "merged", "factorized")
SERVING = ("adapter_memory_budget", "policy", "replan_every", "quantization_error_bound")  # stageml.load's options
_BATCHES_KEPT = 64  # batch compositions kept checked, with their slot ids on the device


@dataclasses.dataclass
class _Adapter:
    source: object            # a PEFT directory, or the prepared inputs of a dict
    config: dict | None
    inputs: dict | None       # prepared @adapter inputs; None while evicted (directory sources)
    slot: int | None = None   # None: evicted
    merged: list | None = None
    requests: float = 0.0     # rows served, halved at every re-plan
    total: int = 0            # rows served since loaded
    last_used: int = 0
    routed: dict = dataclasses.field(default_factory=dict)  # MoE layer -> rows routed per expert
    reason: str = ""          # why the policy gave it its form
    merge_error: float | None = None  # its re-quantized merge's error relative to its update (int8 bases)


@dataclasses.dataclass
class _Batch:
    """A batch composition (a name or None per row), checked: its adapters by name, rows per
    name (None: the base model), the rows' slots and, once uploaded, their device array."""
    named: dict
    rows_of: collections.Counter
    slots: np.ndarray
    residency: int            # TenantModule._residency when checked
    ids: object = None
    calls: int = 0            # calls since its rows were last added to its adapters' counts
    last_call: int = 0        # the clock at its latest call


class TenantModule(ResidualModule):
    """A multi-tenant residual (compiled with max_adapters). See the module doc."""

    def __init__(self, path, device=None, adapter_memory_budget=None, policy="auto", replan_every=64,
                 quantization_error_bound=0.05):
        if not isinstance(policy, str) or policy not in POLICIES:
            raise AdapterError(f"unknown adapter policy {policy!r}: choose one of {', '.join(POLICIES)}")
        if adapter_memory_budget is not None and (not isinstance(adapter_memory_budget, int) or
                                                  isinstance(adapter_memory_budget, bool) or adapter_memory_budget < 0):
            raise AdapterError(f"adapter_memory_budget is {adapter_memory_budget!r}: pass a number of bytes (an int "
                               "of at least 0) or None for no limit")
        if not isinstance(replan_every, int) or isinstance(replan_every, bool) or replan_every < 1:
            raise AdapterError(f"replan_every is {replan_every!r}: pass a number of calls, at least 1")
        bound = quantization_error_bound
        if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not bound >= 0:
            raise AdapterError(f"quantization_error_bound is {bound!r}: pass the largest error a re-quantized merge "
                               "may have relative to the adapter's update, a number of at least 0 (e.g. 0.05)")
        super().__init__(path, device)
        tenants = self.tenants
        self._sites = tenants["sites"]
        self._unread = tenants.get("unread", [])
        self._max_rank = tenants["max_rank"]
        self._free = list(range(tenants["max_adapters"], 0, -1))  # slot 0 is the base model
        self._budget = adapter_memory_budget
        self._policy = policy
        self._replan_every = replan_every
        self._error_bound = float(bound)
        # the main adapter stage's measures of each re-quantized merge: [error², update²] (requantize-merged)
        self._measures = [i for i, r in enumerate(self.entry("adapter", MAIN)["results"]) if r["kind"] == MEASURE]
        self._adapters = {}
        self._lock = threading.RLock()
        self._clock = itertools.count(1)
        self._calls = 0
        self._batches = {}  # composition (a tuple of names) -> _Batch, least recently used first
        self._residency = 0  # counts slot changes: a _Batch checked before one is stale
        requantized = {name for r in self.entry("adapter", MAIN)["results"] if r["kind"] == MEASURE
                       for name in r["sites"]}
        sites = tuple(LoraSite(s["in_features"], s["out_features"], numpy_dtype(s["dtype"]).itemsize,
                               max(s.get("experts", 0), 1), s["lora_A"] in requantized) for s in self._sites)
        self._profile = AdapterProfile("", self._max_rank, sites)
        routed = routing_sites([self.entry("dynamic", FACTORIZED)])
        self._layers = expert_layers(self._sites, routed, self._max_rank)
        # per program, whether each result is a layer's routing counts (the main program's: [1, E], its tenant's)
        self._routing = {p: [r["kind"] == ROUTING for r in self.entry("dynamic", p)["results"]]
                         for p in (MAIN, FACTORIZED)}
        if routing_sites([self.entry("dynamic", MAIN)], MAIN) not in ([], routed):
            raise ArtifactError(f"module {path!r} routes its MoE layers differently in its two request-time programs: "
                                "recompile the model with this StageML")
        self._routed = []  # (slot -> adapter name, the routing results) of calls not yet counted

    # -- adapters -------------------------------------------------------------

    @property
    def adapters(self) -> list:
        """The registered adapters' names (resident or evicted)."""
        with self._lock:
            return sorted(self._adapters)

    def load_adapter(self, name: str, source, config=None) -> None:
        """Registers adapter `name` and writes it into a slot.

        Args:
          name: the adapter's name in `mod(x, adapter=name)`.
          source: a PEFT adapter directory, or a dict of named tensors.
          config: for a dict, PEFT's config (dict or LoraConfig) to scale by.
        Loading a registered name replaces that adapter."""
        if not isinstance(name, str) or not name:
            raise AdapterError(f"adapter name {name!r} is not a non-empty string: name adapters with strings")
        tensors, config = peft_adapter.read(source, config)
        inputs = peft_adapter.prepare(tensors, config, self._sites, self._max_rank, self._unread)
        if isinstance(source, dict):
            source = inputs
        with self._lock:
            self._check_budget(name)
            adapter = _Adapter(source, config, inputs)
            measured = self._measure_merge(adapter)
            self._make_resident(adapter, busy={name})
            self._count_routing()  # calls so far routed the replaced adapter's rows, not this one's
            old = self._adapters.pop(name, None)
            if old is not None:
                self._evict(old)
            self._adapters[name] = adapter
            adapter.last_used = next(self._clock)
            self._replan(measured={name: measured})

    def _measure_merge(self, adapter: _Adapter) -> list | None:
        """Sets `adapter.merge_error`, how far re-quantizing its merge moves it relative to its update
        (the largest sqrt(error² / update²) of the module's measured sites), and returns the merged
        state that measured it; None where the module re-quantizes nothing."""
        if not self._measures:
            return None
        try:
            state = self._run_adapter(self._arguments(adapter))
        except Exception as e:
            raise AdapterError(f"merging the adapter to measure its re-quantization failed ({e}): check its "
                               "tensors") from None
        worst = 0.0
        for index in self._measures:
            error, update = (float(v) for v in np.asarray(state[index].to_host()))
            worst = max(worst, math.sqrt(error / update) if update > 0 else math.inf if error > 0 else 0.0)
        adapter.merge_error = worst
        return state

    def _check_budget(self, name: str) -> None:
        """Raises if loading adapter `name` would leave the budget unable to hold
        every resident adapter's factors (and, with policy "merged", its merged weights)."""
        if self._budget is None:
            return
        others = [a for n, a in self._adapters.items() if n != name and a.slot is not None]
        resident = min(len(others) + 1, self.tenants["max_adapters"])
        per_adapter = self._profile.factorized_bytes + (self._profile.merged_bytes if self._policy == "merged" else 0)
        if resident * per_adapter > self._budget:
            raise AdapterError(f"adapter {name!r} does not fit the adapter memory budget of {self._budget} bytes "
                               f"({resident} resident adapters need {resident * per_adapter}): raise "
                               "adapter_memory_budget or unload adapters")

    def unload_adapter(self, name: str) -> None:
        """Forgets adapter `name`; its slot is reused."""
        with self._lock:
            self._evict(self._known(name))
            self._count_routing()  # (so that a later adapter of this name starts from zero)
            del self._adapters[name]

    def _known(self, name) -> _Adapter:
        if not isinstance(name, str) or name not in self._adapters:
            raise AdapterError(f"unknown adapter {name!r}: load it with mod.load_adapter({name!r}, ...) first")
        return self._adapters[name]

    def _make_resident(self, adapter: _Adapter, busy: set) -> None:
        """Writes `adapter` into a free slot, evicting the least recently used one if needed."""
        if adapter.inputs is None:  # evicted: reload from its directory
            tensors, _ = peft_adapter.read(adapter.source)
            adapter.inputs = peft_adapter.prepare(tensors, adapter.config, self._sites, self._max_rank, self._unread)
        if not self._free:
            self._count_calls()
            resident = [(a.last_used, n) for n, a in self._adapters.items() if a.slot is not None and n not in busy]
            if not resident:
                raise AdapterError(f"all {self.tenants['max_adapters']} adapter slots are in use by this call: "
                                   "compile with a larger max_adapters or send fewer adapters per batch")
            self._evict(self._adapters[min(resident)[1]])
        slot = self._free.pop()
        try:
            self._call(self.entry("adapter", FACTORIZED), {**self._arguments(adapter, FACTORIZED),
                                                          "slot": slot})
        except Exception as e:
            self._free.append(slot)
            raise AdapterError(f"writing the adapter into slot {slot} failed ({e}): check its tensors") from None
        adapter.slot = slot
        self._residency += 1

    def _arguments(self, adapter: _Adapter, program: str = MAIN) -> dict:
        """`adapter`'s prepared inputs in the element types `program`'s adapter stage takes them."""
        return {s["name"]: adapter.inputs[s["name"]].astype(numpy_dtype(s["dtype"]), copy=False)
                for s in self.entry("adapter", program)["arguments"] if s["kind"] == "input"}

    def _evict(self, adapter: _Adapter) -> None:
        if adapter.slot is not None:
            self._free.append(adapter.slot)
        adapter.slot, adapter.merged = None, None
        self._residency += 1
        if not isinstance(adapter.source, dict):
            adapter.inputs = None

    # -- policy ---------------------------------------------------------------

    def _bytes_of(self, adapter) -> int:
        if adapter is None or adapter.slot is None:
            return 0
        return self._profile.factorized_bytes + (self._profile.merged_bytes if adapter.merged else 0)

    def _bytes_held(self) -> int:
        return sum(self._bytes_of(a) for a in self._adapters.values())

    def replan(self) -> dict:
        """Re-runs the cost policy now; returns {adapter: form}."""
        with self._lock:
            self._replan()
            return {n: f["form"] for n, f in self.stats()["adapters"].items()}

    def _replan(self, decay: bool = False, measured: dict | None = None) -> None:
        """Applies the policy to the resident adapters; `decay` then halves their
        traffic counts (the periodic re-plan), so that recent traffic counts most.
        `measured`: {name: merged state} an adapter's load already computed."""
        self._count_routing()
        self._count_calls()
        resident = {n: a for n, a in self._adapters.items() if a.slot is not None}
        if self._policy == "auto":
            profiles = [dataclasses.replace(self._profile, name=n, requests=a.requests, merge_error=a.merge_error or 0.0)
                        for n, a in resident.items()]
            budget = self._budget if self._budget is not None else float("inf")
            chosen = plan(profiles, budget, self._error_bound)
            forms, reasons = chosen.forms, chosen.reasons
        else:
            forms = {n: self._policy for n in resident}
            reasons = {n: f"policy {self._policy!r}" for n in resident}
            for name, adapter in resident.items():
                if self._policy == "merged" and (adapter.merge_error or 0.0) > self._error_bound:
                    forms[name] = "factorized"
                    reasons[name] = f"policy 'merged', but {requantization_reason(adapter.merge_error, self._error_bound)}"
        for name, adapter in resident.items():
            adapter.reason = reasons[name]
            if forms[name] == "merged" and adapter.merged is None:
                adapter.merged = (measured or {}).get(name) or self._run_adapter(self._arguments(adapter))
            elif forms[name] == "factorized":
                adapter.merged = None
            if decay:
                adapter.requests /= 2

    @staticmethod
    def _form(adapter: _Adapter) -> str:
        return "evicted" if adapter.slot is None else "merged" if adapter.merged else "factorized"

    def stats(self) -> dict:
        """Per adapter: form (merged, factorized or evicted), slot, bytes held and
        rows served; plus the totals, the budget and the (tenant, expert) plan."""
        with self._lock:
            self._count_calls()
            adapters = {n: {"form": self._form(a), "slot": a.slot, "bytes_held": self._bytes_of(a),
                            "requests": a.total, "reason": a.reason,
                            **({"merge_error": a.merge_error} if self._measures else {})}
                        for n, a in sorted(self._adapters.items())}
            return {"adapters": adapters, "bytes_held": self._bytes_held(), "budget": self._budget,
                    "policy": self._policy, "slots": self.tenants["max_adapters"],
                    "slots_free": len(self._free), "plan": self.plan()}

    def plan(self, form: str = "json"):
        """The current plan per MoE layer, tenant and expert: JSON-ready data, or with
        `form="mlir"` the same as verified MLIR text (the plan dialect, dialects/plan.py):

            {"policy": "auto", "budget": ..., "bytes_held": ...,
             "layers": [{"layer": 0, "sites": [lora_A names], "experts": E, "factorized_bytes": ...,
                         "merged_bytes": ..., "lora_flops": ...}],     // per tenant and expert
             "pairs": [{"layer": 0, "tenant": "a", "expert": 3, "form": "factorized",
                        "bytes": ..., "tokens": 17, "reason": "..."}]}

        `tokens` counts the rows routed to the pair since the adapter was loaded, in
        factorized and merged calls alike (each program returns its counts). A pair's
        form is its tenant's (the policy decides per tenant; a pair of its own, a
        "virtual expert", is not served yet) and its `bytes` are what the tenant holds
        for that expert on the layer's sites."""
        if form not in ("json", "mlir"):
            raise InputError(f"plan form {form!r} is unknown: pass 'json' or 'mlir'")
        with self._lock:
            self._count_routing()
            pairs = []
            for layer in self._layers:
                for name, adapter in sorted(self._adapters.items()):
                    state = self._form(adapter)
                    held = 0 if state == "evicted" else layer["factorized_bytes"] + (
                        layer["merged_bytes"] if state == "merged" else 0)
                    routed = adapter.routed.get(layer["layer"], np.zeros(layer["experts"], np.int64))
                    reason = ("evicted (least recently used): reloaded when next used" if state == "evicted"
                              else adapter.reason)
                    pairs.extend({"layer": layer["layer"], "tenant": name, "expert": e, "form": state,
                                  "bytes": held, "tokens": int(routed[e]), "reason": reason}
                                 for e in range(layer["experts"]))
            found = {"policy": self._policy, "budget": self._budget, "bytes_held": self._bytes_held(),
                     "layers": [dict(layer) for layer in self._layers], "pairs": pairs}
        if form == "mlir":
            from stageml.dialects.plan import plan_mlir
            return plan_mlir(found)
        return found

    def _count_routing(self) -> None:
        """Adds the routing counts of the calls since the last count to their adapters."""
        pending, self._routed = self._routed, []
        for owners, results in pending:
            for layer, result in enumerate(results):
                counts = np.asarray(result.to_host())
                for slot, name in owners.items():
                    adapter = self._adapters.get(name)
                    if adapter is not None:
                        adapter.routed[layer] = adapter.routed.get(layer, 0) + counts[slot]

    def _count_calls(self, batches=None) -> None:
        """Adds the rows of the calls since the last count (of `batches`, default every kept
        batch) to their adapters' counts and times of last use: a call only counts its batch."""
        for batch in self._batches.values() if batches is None else batches:
            if batch.calls:
                for name, adapter in batch.named.items():
                    adapter.requests += batch.rows_of[name] * batch.calls
                    adapter.total += batch.rows_of[name] * batch.calls
                    adapter.last_used = max(adapter.last_used, batch.last_call)
                batch.calls = 0

    # -- requests -------------------------------------------------------------

    def _routing_split(self, results, program: str, owners: dict) -> list:
        """The outputs of a call of `program`; its routing counts are kept for `owners` (the
        counts' row -> adapter name) and read at the next count."""
        results = list(results) if isinstance(results, (tuple, list)) else [results]
        routing = self._routing[program]
        counts = [r for r, is_routing in zip(results, routing) if is_routing]
        if counts:
            self._routed.append((owners, counts))
            if len(self._routed) > self._replan_every:
                self._count_routing()
        return [r for r, is_routing in zip(results, routing) if not is_routing]

    def __call__(self, *inputs, adapter=None):
        """The residual with one adapter (None: the base model) for every row."""
        request = self._check_inputs(inputs)
        return self._run_batch(request, [adapter] * (request.rows[0] if request.rows else 0))

    def run_batch(self, inputs, adapters: list):
        """One call for a batch whose row i uses `adapters[i]` (None: the base model).

        `inputs` is the forward input (or a tuple of them), rows leading."""
        request = self._check_inputs(inputs if isinstance(inputs, (tuple, list)) else (inputs,))
        if isinstance(adapters, (str, bytes)) or not hasattr(adapters, "__iter__"):
            raise InputError(f"run_batch takes a list of adapter names (one per row), not {type(adapters).__name__}: "
                             "pass e.g. ['tenant-a', None]")
        return self._run_batch(request, list(adapters))

    def _batch(self, adapters: list) -> _Batch:
        """`adapters` (a name or None per row) checked, each adapter made resident; under the
        lock. The last _BATCHES_KEPT compositions are kept (a decode loop sends the same one at
        every step), each until a slot changes hands."""
        key = tuple(adapters)
        try:
            hash(key)
        except TypeError:  # an unhashable name: refused below
            key = None
        batch = None if key is None else self._batches.pop(key, None)
        if batch is not None and batch.residency != self._residency:
            self._count_calls([batch])
            batch = None
        if batch is None:
            for name in adapters if key is None else set(key):
                if name is not None and not isinstance(name, str):
                    raise AdapterError(f"adapter {name!r} is not a name: pass adapter names (strings) or None "
                                       "for the base model")
            rows_of = collections.Counter(key)
            named = {n: self._known(n) for n in rows_of if n is not None}
            for adapter in named.values():
                if adapter.slot is None:
                    self._make_resident(adapter, set(named))
            slot_of = {name: adapter.slot for name, adapter in named.items()}
            slot_of[None] = 0
            batch = _Batch(named, rows_of, np.fromiter(map(slot_of.__getitem__, key), np.int64, len(key)),
                           self._residency)
            if len(self._batches) >= _BATCHES_KEPT:
                self._count_calls([self._batches.pop(next(iter(self._batches)))])  # the least recently used
        self._batches[key] = batch
        return batch

    def _run_batch(self, request, adapters: list):
        if any(shape == () or rows != len(adapters) for shape, rows in zip(request.shapes, request.rows)):
            raise InputError(f"run_batch got {len(adapters)} adapter names for inputs of "
                             f"{request.rows} rows: pass one name (or None) per row")
        with self._lock:
            batch = self._batch(adapters)
            batch.calls += 1
            batch.last_call = next(self._clock)
            values = request.values
            only = next(iter(batch.named.values())) if len(batch.named) == 1 and None not in batch.rows_of else None
            if only is not None and only.merged is not None:
                results = self._call(self.entry("dynamic"), values, only.merged)
                if self._layers:
                    results = self._routing_split(results, MAIN, {0: next(iter(batch.named))})
            else:
                if batch.ids is None:
                    batch.ids = iree_rt.asdevicearray(self._config.device, batch.slots)
                values[IDS] = batch.ids
                results = self._call(self.entry("dynamic", FACTORIZED), values)
                if self._layers:
                    results = self._routing_split(results, FACTORIZED, {a.slot: n for n, a in batch.named.items()})
            self._calls += 1
            if self._calls % self._replan_every == 0:
                self._replan(decay=True)
            return request.outputs(results)
