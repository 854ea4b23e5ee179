"""`stageml serve` as a client sees it: a server process on localhost, called through a real
HTTP client (httpx) and once through the `openai` package. Every completion is checked token for
token against transformers' greedy `generate` with PEFT (prompts drawn fresh: the seed is
printed); errors are 4xx with one line and leave other requests alone; a client that disconnects
frees its sequence; a load test runs 8 clients x 50 requests over mixed adapters while another
adapter is loaded and unloaded."""

import asyncio
import json
import random
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
import torch

import stageml
from workloads import served_llama

NEW = 8  # tokens a completion
MAX_SEQ = 512  # long enough that a 500-token stream is still running when its client leaves
TENANTS = "abc"  # a and b loaded at start, c loaded and unloaded by the tests
BASE = "llama"


def _tokenizer(path: Path) -> None:
    """A word-level tokenizer.json over the model's 128 ids: 'w5' is token 5."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    tokenizer = Tokenizer(WordLevel({f"w{i}": i for i in range(128)}, unk_token="w0"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.save(str(path))


class Server:
    def __init__(self, url, root, prompts, expected):
        self.url, self.root, self.prompts, self.expected = url, root, prompts, expected

    def metric(self, name: str, **labels) -> float:
        """The value of one sample of /metrics (0 if absent)."""
        text = httpx.get(f"{self.url}/metrics").text
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in text.splitlines():
            sample, _, value = line.rpartition(" ")
            if sample == (f"{name}{{{want}}}" if want else name):
                return float(value)
        return 0.0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    seed = torch.seed() % 2 ** 31
    print(f"seed {seed}")
    root = tmp_path_factory.mktemp("serve")
    path, prompts, expected = served_llama(root, TENANTS, seed, MAX_SEQ, (1, 4, 7, 12), NEW)
    _tokenizer(root / "tokenizer.json")
    command = [str(Path(sys.executable).parent / "stageml"), "serve", path, "--port", "0",
               "--adapter", f"a={root / 'a'}", "--adapter", f"b={root / 'b'}", "--tokenizer", str(root / "tokenizer.json")]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = process.stdout.readline()  # printed once it listens
    found = re.search(r"on (http://\S+)", line)
    if found is None:
        process.kill()
        pytest.fail(f"stageml serve did not start: {line!r} {process.stderr.read()}")
    yield Server(found.group(1), root, prompts, expected)
    process.terminate()  # SIGTERM: a clean shutdown
    assert process.wait(timeout=30) == 0, process.stderr.read()


def _complete(server, model: str | None, index: int, **fields) -> dict:
    response = httpx.post(f"{server.url}/v1/completions", timeout=60, json={
        "model": model or BASE, "prompt": server.prompts[index], "max_tokens": NEW, "temperature": 0, **fields})
    assert response.status_code == 200, response.text
    return response.json()


def test_completions_match_peft(server):
    """The base model and each adapter, one prompt a request and several in one request."""
    for name in (None, "a", "b"):
        for i in range(len(server.prompts)):
            choice = _complete(server, name, i)["choices"][0]
            assert choice["token_ids"] == server.expected[i, name], (name, i)
            assert choice["finish_reason"] in ("length", "stop")
    body = httpx.post(f"{server.url}/v1/completions", timeout=60, json={
        "model": "b", "prompt": server.prompts, "max_tokens": NEW, "temperature": 0}).json()
    assert [c["index"] for c in body["choices"]] == list(range(len(server.prompts)))
    assert [c["token_ids"] for c in body["choices"]] == [server.expected[i, "b"] for i in range(len(server.prompts))]
    assert body["usage"]["prompt_tokens"] == sum(map(len, server.prompts))
    assert body["usage"]["completion_tokens"] == sum(len(server.expected[i, "b"]) for i in range(len(server.prompts)))


def test_text_prompts_through_the_tokenizer(server):
    words = " ".join(f"w{t}" for t in server.prompts[2])
    choice = httpx.post(f"{server.url}/v1/completions", timeout=60, json={
        "model": "a", "prompt": words, "max_tokens": NEW, "temperature": 0}).json()["choices"][0]
    assert choice["token_ids"] == server.expected[2, "a"]
    assert choice["text"] == " ".join(f"w{t}" for t in server.expected[2, "a"])


def test_streaming_sends_each_step(server):
    with httpx.stream("POST", f"{server.url}/v1/completions", timeout=60, json={
            "model": "a", "prompt": server.prompts[1], "max_tokens": NEW, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    tokens = [t for c in chunks for choice in c["choices"] for t in choice["token_ids"]]
    assert tokens == server.expected[1, "a"]
    assert len(chunks) - 1 >= 2  # the tokens came in more than one event
    assert [choice["finish_reason"] for c in chunks[:-2] for choice in c["choices"]] == [None] * (len(chunks) - 2)
    assert chunks[-2]["choices"][0]["finish_reason"] in ("length", "stop")
    assert chunks[-1]["usage"]["completion_tokens"] == len(tokens)


def test_openai_client(server):
    from openai import OpenAI

    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list()] == [BASE, "a", "b"]
    done = client.completions.create(model="b", prompt=server.prompts[3], max_tokens=NEW, temperature=0)
    assert done.choices[0].model_extra["token_ids"] == server.expected[3, "b"]
    assert done.choices[0].text == " ".join(f"w{t}" for t in server.expected[3, "b"])
    streamed = client.completions.create(model=BASE, prompt=server.prompts[0], max_tokens=NEW, temperature=0,
                                         stream=True)
    assert [t for c in streamed for t in c.choices[0].model_extra["token_ids"]] == server.expected[0, None]


def test_adapters_load_and_unload(server):
    url = server.url
    models = httpx.get(f"{url}/v1/models").json()["data"]
    assert [(m["id"], m["parent"]) for m in models] == [(BASE, None), ("a", BASE), ("b", BASE)]
    assert models[1]["root"] == str(server.root / "a")
    response = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "c", "lora_path": str(server.root / "c")})
    assert response.status_code == 200, response.text
    assert ("c", BASE) in [(m["id"], m["parent"]) for m in httpx.get(f"{url}/v1/models").json()["data"]]
    assert _complete(server, "c", 2)["choices"][0]["token_ids"] == server.expected[2, "c"]
    again = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "c", "lora_path": str(server.root / "c")})
    assert again.status_code == 400 and "already loaded" in again.json()["error"]["message"]
    assert httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "c"}).status_code == 200
    gone = httpx.post(f"{url}/v1/completions", json={"model": "c", "prompt": [1]})
    assert gone.status_code == 404
    assert httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "c"}).status_code == 404
    missing = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "d", "lora_path": str(server.root / "no")})
    assert missing.status_code == 400
    assert "d" not in [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]]


BAD = [  # (body, status, the message's start)
    ('{"model": "nope", "prompt": [1]}', 404, "the model 'nope' does not exist"),
    ('{"model": "a", "prompt": [1, 2', 400, "the body is not valid JSON"),
    ('[1, 2]', 400, "the body: input should be an object"),
    ('{"prompt": [1]}', 400, "model: field required"),
    ('{"model": "a", "prompt": [1], "max_tokens": 0}', 400, "max_tokens: input should be greater than or equal to 1"),
    ('{"model": "a", "prompt": [1], "max_tokens": 512}', 400, "the prompt has 1 tokens, and 512 more do not fit"),
    ('{"model": "a", "prompt": [1, 999]}', 400, "the prompt holds token id 999, outside 0..127"),
    ('{"model": "a", "prompt": []}', 400, "prompt is empty"),
    ('{"model": "a", "prompt": [1, "x"]}', 400, "prompt: pass token ids, text, or a list of either"),
    ('{"model": "a", "prompt": [1], "temperature": -1}', 400, "temperature: input should be greater than or equal"),
    ('{"model": "a", "prompt": [1], "n": 3}', 400, "n: StageML does not implement it"),
    ('{"model": "a", "prompt": [[1], [2, -1]]}', 400, "prompt 1 holds token id -1"),
]


@pytest.mark.parametrize("body,status,message", BAD, ids=[b[2][:24] for b in BAD])
def test_bad_requests_are_4xx_with_one_line(server, body, status, message):
    response = httpx.post(f"{server.url}/v1/completions", content=body)  # no content type: as curl -d sends it
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"].startswith(message) and "\n" not in error["message"], error
    assert error["code"] == status


def test_a_disconnect_frees_the_sequence(server):
    aborted = server.metric("stageml:request_success_total", model_name="a", finished_reason="abort")
    with httpx.stream("POST", f"{server.url}/v1/completions", timeout=60, json={
            "model": "a", "prompt": [1], "max_tokens": 500, "ignore_eos": True, "temperature": 0,
            "stream": True}) as response:
        next(response.iter_lines())
    for _ in range(100):
        if server.metric("stageml:num_requests_running") == 0:
            break
        threading.Event().wait(0.05)
    assert server.metric("stageml:num_requests_running") == 0
    assert server.metric("stageml:request_success_total", model_name="a", finished_reason="abort") == aborted + 1
    assert _complete(server, "a", 1)["choices"][0]["token_ids"] == server.expected[1, "a"]


def test_metrics(server):
    _complete(server, "b", 0)
    text = httpx.get(f"{server.url}/metrics").text
    for name in ("stageml:prompt_tokens_total", "stageml:generation_tokens_total",
                 "stageml:time_to_first_token_seconds_count", "stageml:e2e_request_latency_seconds_count",
                 "stageml:inter_token_latency_seconds_count", "stageml:step_duration_seconds_count",
                 "stageml:num_requests_waiting", "stageml:cache_slots", "stageml:adapter_bytes_held"):
        assert name in text, name
    assert server.metric("stageml:generation_tokens_total", model_name="b") >= NEW
    assert server.metric("stageml:cache_slots") == 4
    # keys and values of 2 layers, 4 slots of MAX_SEQ positions, 2 KV heads of 32, float32
    assert server.metric("stageml:cache_bytes") == 2 * 2 * 4 * MAX_SEQ * 2 * 32 * 4
    assert re.search(r'stageml:lora_requests_info\{max_lora="2",running_lora_adapters="[^"]*",'
                     r'waiting_lora_adapters="[^"]*"\} \d', text)
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_load_8_clients_x_50_requests(server):
    """Mixed adapters and the base model, some streamed, while adapter c is loaded under a new name,
    called and unloaded over and over: every completion matches the reference, none fails."""
    rng = random.Random(0)
    plan = [[(rng.randrange(len(server.prompts)), rng.choice([None, "a", "b"]), rng.random() < 0.25)
             for _ in range(50)] for _ in range(8)]
    failures, churns = [], []

    async def ask(client, index: int, name: str | None, stream: bool, model: str | None = None) -> list:
        body = {"model": model or name or BASE, "prompt": server.prompts[index], "max_tokens": NEW,
                "temperature": 0, "stream": stream}
        if not stream:
            response = await client.post("/v1/completions", json=body)
            if response.status_code != 200:
                return [f"{response.status_code} {response.text}"]
            return response.json()["choices"][0]["token_ids"]
        tokens = []
        async with client.stream("POST", "/v1/completions", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    tokens += json.loads(line[6:])["choices"][0]["token_ids"]
        return tokens

    async def client_run(requests):
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            for index, name, stream in requests:
                got = await ask(client, index, name, stream)
                if got != server.expected[index, name]:
                    failures.append((index, name, stream, got))

    async def churn(stop: asyncio.Event):
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            while not stop.is_set():
                name = f"c{len(churns)}"
                loaded = await client.post("/v1/load_lora_adapter", json={"lora_name": name,
                                                                         "lora_path": str(server.root / "c")})
                got = await ask(client, len(churns) % len(server.prompts), "c", False, model=name)
                unloaded = await client.post("/v1/unload_lora_adapter", json={"lora_name": name})
                churns.append((loaded.status_code, got == server.expected[len(churns) % len(server.prompts), "c"],
                               unloaded.status_code))

    async def main():
        stop = asyncio.Event()
        churner = asyncio.create_task(churn(stop))
        await asyncio.gather(*(client_run(p) for p in plan))
        stop.set()
        await churner

    asyncio.run(main())
    assert failures == []
    assert len(churns) >= 2 and all(c == (200, True, 200) for c in churns), churns
    assert server.metric("stageml:num_requests_running") == 0


def test_cli_errors_are_one_line(tmp_path, capsys):
    from stageml.tools import stageml_cli

    assert stageml_cli.main(["serve", str(tmp_path / "missing.vmfb"), "--port", "0"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("stageml: error: "), err
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        assert stageml_cli.main(["serve", str(tmp_path / "missing.vmfb"), "--port", str(port)]) == 1
        assert capsys.readouterr().err.strip() .startswith(f"stageml: error: cannot listen on 127.0.0.1:{port}")
    finally:
        taken.close()
    assert stageml_cli.main(["serve", "x.vmfb", "--adapter", "no-equals-sign"]) == 2
    assert stageml_cli.main(["serve", "x.vmfb", "--adapter", "a=d1", "--adapter", "a=d2"]) == 1
    assert capsys.readouterr().err.strip().endswith("adapter 'a' is given twice: give each name once")


def test_serving_a_module_that_does_not_generate(tmp_path, capsys):
    from stageml.tools import stageml_cli
    from workloads import Linear

    art = stageml.compile(Linear(8), (torch.randn(2, 8),))
    path = art.save(str(tmp_path / "linear.vmfb"))
    assert stageml_cli.main(["serve", path, "--port", "0"]) == 1
    assert capsys.readouterr().err.strip() == (f"stageml: error: {path!r} is no generation step: compile the model "
                                               "with stagemlc --generate to serve it")
