"""The adapter cost policy: which adapters to serve merged, which factorized.

Per LoRA site (a linear layer `in -> out` with rank r, elements of b bytes:
4 for f32, 2 for f16 / bf16, from the site's dtype):

    form        bytes held per adapter           extra request-time work per token
    factorized  r*(in+out)*b (its factors)       2*r*(in+out) FLOPs, r*(in+out)*b bytes read
    merged      out*in*b more (its W + sBA)      none (one GEMM, as the base model)
                (re-quantized to int8: out*in + 4*out)

A merged adapter keeps its factors, so that its rows can still join mixed
batches. Merging therefore buys `requests * extra FLOPs` for `merged_bytes`.
Under a memory budget the choice is a 0/1 knapsack; `plan` solves it exactly
with a Pareto-frontier dynamic program (a ratio-greedy rule is suboptimal,
see tests/test_policy.py).

On an int8 base kept int8 (--keep-quantized), a merge is re-quantized, which
changes the merged weights' values: `merge_error` is how much, relative to the
adapter's own update (requantize-merged's measure). An adapter whose merge
errs above `error_bound` stays factorized, whatever the budget.
"""

import dataclasses
import math

from stageml.errors import StageMLError

_ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclasses.dataclass(frozen=True)
class LoraSite:
    """One adapted linear layer, or an MoE layer's stack of `experts` of them (each
    routed row reads one expert's: its FLOPs below are per routed row)."""

    in_features: int
    out_features: int
    element_bytes: int = 4
    experts: int = 1
    requantized: bool = False  # merged as int8 with a float32 scale per output (requantize-merged)

    @property
    def merged_bytes(self) -> int:
        if self.requantized:
            return self.experts * (self.in_features + 4) * self.out_features
        return self.experts * self.in_features * self.out_features * self.element_bytes


@dataclasses.dataclass
class AdapterProfile:
    """What the policy knows of one adapter: its shapes and its traffic."""

    name: str
    rank: int
    sites: tuple
    requests: int = 0  # tokens served recently
    merge_error: float = 0.0  # the merged form's error relative to its update (0: exact)

    @property
    def merged_bytes(self) -> int:
        return sum(s.merged_bytes for s in self.sites)

    @property
    def factorized_bytes(self) -> int:
        return sum(s.experts * self.rank * (s.in_features + s.out_features) * s.element_bytes for s in self.sites)

    @property
    def factorized_flops_per_token(self) -> int:
        return sum(2 * self.rank * (s.in_features + s.out_features) for s in self.sites)


@dataclasses.dataclass
class Plan:
    forms: dict            # adapter name -> "merged" | "factorized"
    bytes_held: int
    flops_saved: int       # request-time FLOPs the merged adapters avoid
    reasons: dict = dataclasses.field(default_factory=dict)  # adapter name -> why its form


def plan(adapters: list, budget_bytes: int, error_bound: float = math.inf) -> Plan:
    """The merged/factorized choice that saves the most request-time FLOPs
    while the bytes held stay within `budget_bytes` (exact), merging no adapter
    whose merge errs above `error_bound`."""
    floor = sum(a.factorized_bytes for a in adapters)
    if floor > budget_bytes:
        raise StageMLError(f"the adapter memory budget of {budget_bytes} bytes cannot hold even the factorized "
                           f"adapters ({floor} bytes): raise adapter_memory_budget or load fewer adapters")
    capacity = budget_bytes - floor
    # frontier: extra bytes -> (flops saved, merged names); only non-dominated states are kept
    frontier = {0: (0, frozenset())}
    for adapter in adapters:
        cost = adapter.merged_bytes
        gain = adapter.requests * adapter.factorized_flops_per_token
        if gain <= 0 or cost > capacity or adapter.merge_error > error_bound:
            continue
        grown = dict(frontier)
        for used, (saved, names) in frontier.items():
            if used + cost <= capacity and grown.get(used + cost, (-1,))[0] < saved + gain:
                grown[used + cost] = (saved + gain, names | {adapter.name})
        frontier, best = {}, -1
        for used in sorted(grown):  # drop states that use more bytes for no more savings
            if grown[used][0] > best:
                frontier[used], best = grown[used], grown[used][0]
    used, (saved, merged) = max(frontier.items(), key=lambda kv: (kv[1][0], -kv[0]))
    forms = {a.name: "merged" if a.name in merged else "factorized" for a in adapters}
    return Plan(forms, floor + used, saved,
                {a.name: _reason(a, a.name in merged, capacity, error_bound) for a in adapters})


def requantization_reason(merge_error: float, error_bound: float) -> str:
    """Why an adapter whose re-quantized merge errs above the bound is not served merged."""
    return (f"merging re-quantizes its weights with an error of {merge_error:.3g} of its update, "
            f"above quantization_error_bound {error_bound:g}")


def _reason(adapter: AdapterProfile, merged: bool, capacity: int, error_bound: float = math.inf) -> str:
    """Why `plan` gave `adapter` its form, in one phrase."""
    gain = adapter.requests * adapter.factorized_flops_per_token
    if merged:
        return f"merging saves {gain:.0f} request-time FLOPs for {adapter.merged_bytes} bytes"
    if adapter.merge_error > error_bound:
        return requantization_reason(adapter.merge_error, error_bound)
    if gain <= 0:
        return "no traffic since the last re-plan"
    if adapter.merged_bytes > capacity:
        return f"its merged copy ({adapter.merged_bytes} bytes) exceeds the budget's room ({capacity} bytes)"
    return "the budget's room saves more FLOPs merging other adapters"


def expert_layers(sites: list, routing: list, max_rank: int) -> list:
    """Each MoE layer of a multi-tenant residual with its costs per (tenant, expert):

        {"layer": i, "sites": [lora_A names], "experts": E,
         "factorized_bytes": R·(in+out)·b summed over its sites (a tenant's factors of one expert),
         "merged_bytes": in·out·b summed over its sites (a merged copy of one expert),
         "lora_flops": 2·R·(in+out) summed over its sites (per routed row, factorized)}

    `sites` are the manifest's LoRA sites, `routing` the sites of each routing result."""
    layers = []
    for index, names in enumerate(routing):
        mine = [s for s in sites if s["lora_A"] in names]
        layers.append({"layer": index, "sites": list(names), "experts": mine[0]["experts"],
                       "factorized_bytes": sum(max_rank * (s["in_features"] + s["out_features"])
                                               * _ELEMENT_BYTES[s["dtype"]] for s in mine),
                       "merged_bytes": sum(s["in_features"] * s["out_features"] * _ELEMENT_BYTES[s["dtype"]]
                                           for s in mine),
                       "lora_flops": sum(2 * max_rank * (s["in_features"] + s["out_features"]) for s in mine)})
    return layers
