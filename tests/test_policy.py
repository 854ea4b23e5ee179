import pytest

import stageml
from stageml.policy import AdapterProfile, LoraSite, plan

SITE = LoraSite(in_features=64, out_features=64)


def _adapter(name, sites, requests, rank=8):
    return AdapterProfile(name, rank, tuple([SITE] * sites), requests)


def test_costs_in_real_units():
    a = AdapterProfile("a", 16, (LoraSite(4096, 4096),), requests=10)
    assert a.merged_bytes == 4096 * 4096 * 4
    assert a.factorized_bytes == 16 * (4096 + 4096) * 4
    assert a.factorized_flops_per_token == 2 * 16 * 8192


def test_unlimited_budget_merges_every_used_adapter():
    adapters = [_adapter("hot", 1, 100), _adapter("cold", 1, 0)]
    result = plan(adapters, budget_bytes=1 << 30)
    assert result.forms == {"hot": "merged", "cold": "factorized"}


def test_a_merge_that_errs_above_the_bound_stays_factorized():
    # An int8 base's merge is re-quantized: "lossy" would lose 30% of its update, so even the
    # hottest adapter with room to spare stays factorized, and says why; the budget's room
    # goes to the others.
    hot, lossy = _adapter("hot", 1, 10), _adapter("lossy", 1, 100)
    lossy.merge_error, hot.merge_error = 0.3, 0.01
    result = plan([hot, lossy], budget_bytes=1 << 30, error_bound=0.05)
    assert result.forms == {"hot": "merged", "lossy": "factorized"}
    assert "error of 0.3 of its update, above quantization_error_bound 0.05" in result.reasons["lossy"]
    assert plan([hot, lossy], budget_bytes=1 << 30).forms == {"hot": "merged", "lossy": "merged"}  # no bound


def test_exact_choice_beats_ratio_greedy():
    # Merging costs 6 sites' merged bytes for "big" and 5 for "p" and "q";
    # there is room for 10. Greedy by saved FLOPs per byte takes "big" first
    # (210/6 > 150/5) and then nothing else fits: 210. The optimum merges
    # "p" and "q": 300.
    extra = SITE.in_features * SITE.out_features * 4
    per_site = 2 * 8 * (64 + 64)
    adapters = [_adapter("big", 6, 35), _adapter("p", 5, 30), _adapter("q", 5, 30)]
    budget = sum(a.factorized_bytes for a in adapters) + 10 * extra
    result = plan(adapters, budget)
    assert result.forms == {"big": "factorized", "p": "merged", "q": "merged"}
    assert result.flops_saved == 300 * per_site
    assert result.bytes_held == budget


def test_budget_below_factorized_floor_is_an_error():
    with pytest.raises(stageml.StageMLError, match="cannot hold even the factorized adapters"):
        plan([_adapter("a", 1, 1)], budget_bytes=10)


def test_plan_matches_exhaustive_search_on_random_cases():
    import itertools
    import random

    rng = random.Random()
    for _ in range(30):
        adapters = [AdapterProfile(f"a{i}", rng.choice([4, 8, 16]),
                                   tuple(LoraSite(rng.choice([32, 64, 128]), rng.choice([32, 64, 128]))
                                         for _ in range(rng.randint(1, 3))), rng.randint(0, 50))
                    for i in range(rng.randint(1, 7))]
        floor = sum(a.factorized_bytes for a in adapters)
        budget = floor + rng.randint(0, sum(a.merged_bytes for a in adapters))
        best = 0
        for choice in itertools.product([False, True], repeat=len(adapters)):
            held = sum(a.factorized_bytes + (a.merged_bytes if m else 0) for a, m in zip(adapters, choice))
            if held <= budget:
                best = max(best, sum(a.requests * a.factorized_flops_per_token
                                     for a, m in zip(adapters, choice) if m))
        result = plan(adapters, budget)
        assert result.flops_saved == best and result.bytes_held <= budget
