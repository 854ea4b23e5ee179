"""Serving benchmark: `stageml serve` over HTTP against transformers + PEFT `generate`, on one machine.

    .venv/bin/python benchmarks/bench_serve.py [--report FILE] [--runs N]    # about 5 minutes on 2 cores

The model: bench_generate's (workloads.small_llama(), vocab 128, hidden 128, 2 layers, with 8
random PEFT LoRA adapters a0..a7, r=8 on q/v/o/gate_proj), float32, on the CPU. Each workload
sends 1, 8 or 32 prompts of 8-15 tokens at once over 1 adapter or 8 (round-robin), each asking
for 32 new tokens (greedy, end-of-sequence ignored).

  stageml  `stageml serve` in a process of its own (generate=True, max_seq 64, 32 cache slots,
           max_adapters 8, policy "auto"), the adapters loaded from PEFT save_pretrained
           directories; one streaming /v1/completions request a prompt, all sent at once by
           an aiohttp client in this process
  peft     transformers' generate on the PEFT model, the prompts in one left-padded batch with
           adapter_names (PEFT's mixed-adapter batch), in this process

tokens/s: all prompts' generated tokens over the wall time from the first request sent to the
last token received (HTTP, streamed; token ids in and out), the median of --runs runs after
one warm-up, StageML's and PEFT's runs alternating; the client is aiohttp, its connections kept open between runs (as vLLM's
serving benchmark does). Time to first token: StageML's median over the run's requests
(send to first streamed token); PEFT's is a generate of one new token for the whole batch.
Before timing, every streamed completion is checked against PEFT's generate of its prompt alone.
Both sides share the machine's cores: the server process, this client and PyTorch.
"""

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import aiohttp  # noqa: E402

import stageml  # noqa: E402
from bench_generate import ADAPTERS, NEW, _model, _peft_generate  # noqa: E402
from harness import cpu_model, git_head, report, verdict  # noqa: E402

WORKLOADS = ((1, 1), (8, 1), (8, 8), (32, 1), (32, 8))  # (concurrent sequences, adapters)
TARGET = (8, 8, 3.0)  # the bar: >= 3x PEFT's tokens/s at 8 sequences over 8 adapters


async def _stream(session, url: str, model: str, prompt: list) -> tuple:
    """(tokens, seconds to the first token) of one streamed completion."""
    started, first, tokens = time.perf_counter(), None, []
    body = {"model": model, "prompt": prompt, "max_tokens": NEW, "temperature": 0, "ignore_eos": True,
            "stream": True}
    async with session.post(f"{url}/v1/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {await response.text()}")
        async for line in response.content:
            if line.startswith(b"data: {"):
                first = first or time.perf_counter() - started
                tokens += json.loads(line[6:])["choices"][0]["token_ids"]
    return tokens, first


async def _serve_run(session, url: str, prompts: list, adapters: list) -> tuple:
    """(each prompt's tokens, wall seconds, median time to first token) of all prompts sent at once."""
    started = time.perf_counter()
    results = await asyncio.gather(*(_stream(session, url, a, p) for p, a in zip(prompts, adapters)))
    wall = time.perf_counter() - started
    return [r[0] for r in results], wall, statistics.median(r[1] for r in results)


def _server(out: str, model, tensors) -> tuple:
    """(the `stageml serve` process, its URL), with every adapter loaded from a PEFT directory."""
    art = stageml.compile(model, generate=True, max_seq=64, sequences=32, max_adapters=ADAPTERS, max_rank=8)
    path = art.save(os.path.join(out, "llama.vmfb"))
    model.save_pretrained(os.path.join(out, "adapters"))  # adapter aN in adapters/aN
    command = [os.path.join(os.path.dirname(sys.executable), "stageml"), "serve", path, "--port", "0"]
    for name in tensors:
        command += ["--adapter", f"{name}={os.path.join(out, 'adapters', name)}"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    found = re.search(r"on (http://\S+)", process.stdout.readline())
    if found is None:
        raise SystemExit(f"stageml serve did not start: {process.stderr.read()}")
    return process, found.group(1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", help="also write the table (Markdown) to this file")
    parser.add_argument("--runs", type=int, default=5, help="timed runs a workload (default 5), after one warm-up")
    args = parser.parse_args()
    model, tensors = _model()
    model.generation_config.eos_token_id = None
    with tempfile.TemporaryDirectory() as out:
        process, url = _server(out, model, tensors)
        try:
            rows = asyncio.run(_measure(url, model, args.runs))
        finally:
            process.terminate()
            process.wait(timeout=30)
    if rows is None:
        return 1
    lines = [f"# Serving on the CPU ({cpu_model()}, {os.cpu_count()} cores), torch {torch.__version__}, "
             f"at {git_head()}", "",
             f"{NEW} new tokens a prompt, greedy, streamed; tokens/s over all prompts, median of {args.runs} runs.",
             "", "| sequences | adapters | stageml serve tok/s | transformers+PEFT tok/s | ratio | "
             "serve first token ms (median) | PEFT first token ms |", "|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {count} | {distinct} | {count * NEW / served:.0f} | {count * NEW / peft:.0f} | {peft / served:.2f}x | "
              f"{first * 1e3:.1f} | {peft_first * 1e3:.1f} |" for count, distinct, served, peft, first, peft_first in rows]
    count, distinct, bound = TARGET
    ratio = next(peft / served for c, d, served, peft, _, _ in rows if (c, d) == (count, distinct))
    lines += ["", f"Target: >= {bound:.0f}x transformers+PEFT at {count} sequences over {distinct} adapters: "
                  f"{ratio:.2f}x, {verdict(ratio, bound, at_least=True)}."]
    report(lines, args.report)
    return 0


async def _measure(url: str, model, runs: int) -> list | None:
    """Per workload (sequences, adapters, StageML's seconds, PEFT's seconds, StageML's and PEFT's
    first-token seconds); None if StageML's tokens differ from PEFT's."""
    generator = torch.Generator().manual_seed(1)
    rows = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
        for count, distinct in WORKLOADS:
            prompts = [torch.randint(0, 128, (8 + i % 8,), generator=generator).tolist() for i in range(count)]
            adapters = [f"a{i % distinct}" for i in range(count)]
            got = (await _serve_run(session, url, prompts, adapters))[0]  # also the warm-up
            if got != [_peft_generate(model, [p], [a])[0] for p, a in zip(prompts, adapters)]:
                print(f"stageml serve's tokens differ from PEFT's ({count} sequences, {distinct} adapters)",
                      file=sys.stderr)
                return None
            _peft_generate(model, prompts, adapters)
            served, peft = [], []
            for _ in range(runs):  # alternately, so that a slow stretch of the machine hits both
                served.append(await _serve_run(session, url, prompts, adapters))
                peft.append(_timed_peft(model, prompts, adapters))
            rows.append((count, distinct, statistics.median(r[1] for r in served), statistics.median(peft),
                         statistics.median(r[2] for r in served), _timed_peft(model, prompts, adapters, new=1)))
            print(rows[-1], flush=True)
    return rows


def _timed_peft(model, prompts: list, adapters: list, new: int = NEW) -> float:
    started = time.perf_counter()
    _peft_generate(model, prompts, adapters, new)
    return time.perf_counter() - started


if __name__ == "__main__":
    sys.exit(main())
