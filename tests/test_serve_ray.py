"""stageml.serve.ray: two replicas on a local Ray instance, adapters multiplexed over them. Mixed-
adapter requests come back as transformers + PEFT greedy-generate them (prompts drawn fresh: the
seed is printed), and an adapter's requests land on the replica that loaded it."""

import asyncio
import os
import socket
import time

import httpx
import pytest
import torch

from workloads import served_llama

NEW = 6
TENANTS = "abc"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray import serve

    from stageml.serve.ray import app

    seed = torch.seed() % 2 ** 31
    print(f"seed {seed}")
    root = tmp_path_factory.mktemp("ray")
    path, prompts, expected = served_llama(root, TENANTS, seed, 64, (2, 5, 9), NEW)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(app(path, {n: str(root / n) for n in TENANTS}, replicas=2,
                                        adapters_per_replica=2), route_prefix="/")
        yield f"http://127.0.0.1:{port}", prompts, expected
    finally:
        serve.shutdown()
        ray.shutdown()


def _ask(client, url, model: str | None, prompt: list):
    headers = {} if model is None else {"serve_multiplexed_model_id": model}
    return client.post(f"{url}/v1/completions", headers=headers, timeout=120,
                       json={"model": model or "llama", "prompt": prompt, "max_tokens": NEW, "temperature": 0})


def test_an_adapter_lands_on_the_replica_that_loaded_it(cluster):
    url, prompts, expected = cluster
    with httpx.Client() as client:
        where = {}
        for name in "ab":  # each loaded once, by the replica its first request reached
            first = _ask(client, url, name, prompts[0])
            assert first.status_code == 200, first.text
            assert first.headers["x-stageml-adapter-loaded"] == "1"
            where[name] = first.headers["x-stageml-replica"]
        time.sleep(2)  # Ray's router learns where an adapter is loaded within about a second
        for _ in range(3):
            for name in "ab":
                again = _ask(client, url, name, prompts[1])
                assert (again.headers["x-stageml-replica"], again.headers["x-stageml-adapter-loaded"]) == (where[name], "0")
                assert again.json()["choices"][0]["token_ids"] == expected[1, name]


def test_mixed_adapter_requests_are_correct(cluster):
    url, prompts, expected = cluster
    plan = [(i % len(prompts), name) for i, name in enumerate([None, *TENANTS] * 6)]

    async def run():
        async with httpx.AsyncClient() as client:
            return await asyncio.gather(*(_ask(client, url, name, prompts[i]) for i, name in plan))

    responses = asyncio.run(run())
    assert [r.status_code for r in responses] == [200] * len(plan)
    assert [r.json()["choices"][0]["token_ids"] for r in responses] == [expected[p] for p in plan]
    assert len({r.headers["x-stageml-replica"] for r in responses}) == 2  # both replicas served
