"""What a request costs the host on an H200, above the GPU's own work.

    python3 benchmarks/gpu/call_path.py ARTIFACTS_DIR [REPORT.md]    # run_h200.sh runs it

The calls: the multi-tenant 8-layer stack (peer.py's workload and weights, fp16,
32 tenants resident) at decode 1 row / 1 tenant, decode 32 / 32 and prefill
256 rows / 4 tenants, through `run_batch`, and its residual for at most 128
rows (one kernel a LoRA site) at the decode shapes; the small PEFT Llama's residual
(1 x 16 token ids) through `mod(ids)`. Each result is checked against float64
first. Per call, medians:

- kernels: the GPU's time in the call's kernels, and the span from its first
  kernel's start to its last one's end, from CUPTI's records (torch.profiler)
  of 20 calls, split at a marker kernel launched between calls (after every
  host timing of the run: see main);
- device: iree-benchmark-module on the same function and inputs, with the
  runtime flags stageml.load sets (median of 5 repetitions of back-to-back
  calls; a call's time includes its submission and wait);
- invoke: the module's VM call with every argument already on the device and
  the result left there (the floor of any Python caller);
- torch / numpy: the whole call with torch CUDA tensors in and out, and with
  numpy in and out.
invoke, torch and numpy are timed in turns (bench_rounds: 8 rounds of 100 calls
each, the median of the rounds' medians). Host overhead = torch - device, and
the Python around the VM call = torch - invoke (both from one process's turns,
so the host's slow and fast spells fall on both).

Where a torch `run_batch`'s host time goes: its steps (checking the input,
waiting for torch's stream and sharing x by DLPack, the batch's slot ids, the
VM call, sharing the result back and releasing it) timed one by one, in a loop
of whole calls as a caller makes them, and each step repeated alone.

Then IREE's options for repeated submissions, each by iree-benchmark-module
on the decode-32 call: command buffers replayed on CUDA streams (IREE's
default) or as CUDA graphs (--cuda_use_streams=false), inline execution
(--cuda_allow_inline_execution=true), stream-ordered allocations on or off,
and the same stack compiled for exactly 32 rows (no dynamic dimension), where
IREE can record the call's command buffer once and reuse it (memoization).
"""

import functools
import gc
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from h200 import (BENCH, BOUNDS, bench_host, bench_iree, bench_rounds, check, finish, input_flags, kernel_times,  # noqa: E402
                  peft_llama, rel_err, state_flags, to_numpy, write_archive)
from peer import STACK, Weights, mapping, stack_module  # noqa: E402

import stageml  # noqa: E402
from iree import runtime as iree_rt  # noqa: E402
from stageml.compiler.facts import IDS  # noqa: E402

SHAPES = [("decode", 1, 1), ("decode", 32, 32), ("prefill", 256, 4)]
# (label, residual stack-tenants-f16-sm90{suffix}, its shapes): the one for any rows (a LoRA site a BGMV and
# the GEMM with its expand) and the one for at most 128 rows (a LoRA site one kernel)
STACKS = [("stack", "", SHAPES), ("stack for <= 128 rows", "-decode", SHAPES[:2])]
OPTIONS = {
    "streams (stageml.load's flags)": [],
    "streams, stream-ordered allocations (IREE's default)": ["--cuda_async_allocations=true"],
    "CUDA graphs": ["--cuda_use_streams=false"],
    "streams, inline execution": ["--cuda_allow_inline_execution=true"],
}


def device_invoke(mod, entry: dict, values: dict):
    """A call of `entry` with `values` (numpy, by name) already on the device, its result left there."""
    on_device = {name: iree_rt.asdevicearray(mod._config.device, v) for name, v in values.items()}
    return lambda: mod._call(entry, on_device, mod.state)


STEPS = ("check x", "torch sync + x shared", "slot ids", "VM call", "result shared + released")


def host_steps(mod, entry: dict, x, names: list) -> dict:
    """Median µs of each of STEPS of `mod.run_batch(x, names)` (torch in and out):
    "in a loop" times them inside 300 whole calls, "alone" repeats each by itself."""
    spec = mod._input_specs[0]

    def steps():
        marks = [time.perf_counter_ns()]
        value = spec.check(x, True)[0]
        marks.append(time.perf_counter_ns())
        view = mod._imported(value, x.device)
        marks.append(time.perf_counter_ns())
        ids = mod._batch(names).ids
        marks.append(time.perf_counter_ns())
        result = mod._call(entry, {spec.name: view, IDS: ids})
        marks.append(time.perf_counter_ns())
        shared = mod._returned(result, x.device)
        del shared, result
        marks.append(time.perf_counter_ns())
        return [(b - a) / 1e3 for a, b in zip(marks, marks[1:])]

    looped = [steps() for _ in range(320)][20:]
    value = spec.check(x, True)[0]
    view, ids = mod._imported(value, x.device), mod._batch(names).ids
    result = mod._call(entry, {spec.name: view, IDS: ids})
    alone = [bench_host(lambda: spec.check(x, True)), bench_host(lambda: mod._imported(value, x.device)),
             bench_host(lambda: mod._batch(names)), bench_host(lambda: mod._call(entry, {spec.name: view, IDS: ids})),
             bench_host(lambda: mod._returned(result, x.device))]
    return {"in a loop": [statistics.median(column) for column in zip(*looped)], "alone": alone}


def stack_rows(art_dir: str, scratch: str) -> tuple[list, dict, list]:
    """(the stack calls' rows, IREE's options on the decode-32 call, [(row, its call)] whose
    kernels CUPTI is still to time: the modules stay loaded until then)."""
    weights = Weights(torch.float16, seed=int.from_bytes(os.urandom(4), "little"))
    rows, options, unprofiled = [], {}, []
    for label, suffix, shapes in STACKS:
        vmfb, mod, slots = stack_module(art_dir, f"f16-sm90{suffix}", weights)
        entry = mod.entry("dynamic", "factorized")
        for kind, count, tenants in shapes:
            assigned = mapping(kind, count, tenants)
            names = [f"t{t}" for t in assigned]
            x = torch.randn(count, STACK["d"], device="cuda", dtype=torch.float16)
            shape = f"{label}, {kind} {count} rows / {tenants} tenants"
            expected = weights.reference(x, assigned)
            check(f"call path {shape}, torch in and out", rel_err(mod.run_batch(x, names), expected), BOUNDS["f16"])
            check(f"call path {shape}, numpy in and out", rel_err(mod.run_batch(to_numpy(x), names), expected),
                  BOUNDS["f16"])
            ids = np.array([slots[n] for n in names], np.int64)
            flags = input_flags([to_numpy(x), ids], scratch, f"stack{count}")
            row = {"call": shape, "device": bench_iree(vmfb, flags, function=entry["symbol"]),
                   **bench_rounds({"invoke": device_invoke(mod, entry, {"x": to_numpy(x), IDS: ids}),
                                   "torch": lambda: mod.run_batch(x, names),
                                   "numpy": lambda: mod.run_batch(to_numpy(x), names)}),
                   "exported": mod._exports, "steps": host_steps(mod, entry, x, names)}
            rows.append(row)
            unprofiled.append((row, functools.partial(mod.run_batch, x, names)))
            print(row, flush=True)
            if count == 32 and not suffix:
                options = {name: bench_iree(vmfb, flags + extra, function=entry["symbol"])
                           for name, extra in OPTIONS.items()}
                static = os.path.join(art_dir, "stack-tenants-f16-sm90-rows32.vmfb")
                if os.path.exists(static):
                    write_archive(weights.model, {f"weight.{l}": f"weight.{l}" for l in range(STACK["layers"])},
                                  static[:-5] + ".irpa")
                    for name, extra in (("streams", []), ("CUDA graphs", ["--cuda_use_streams=false"])):
                        options[f"static 32 rows, {name}"] = bench_iree(static, flags + extra,
                                                                        function=entry["symbol"])
                print(options, flush=True)
    return rows, options, unprofiled


def llama_row(art_dir: str, scratch: str) -> dict:
    model = peft_llama(art_dir).double()
    vmfb = os.path.join(art_dir, "llama-f16-sm90.vmfb")
    mod = stageml.load(vmfb)
    ids = torch.randint(0, 128, (1, 16), device="cuda")
    with torch.no_grad():
        expected = model(ids)
    check("call path llama 1x16, torch in and out", rel_err(mod(ids), expected), BOUNDS["f16"])
    entry = mod.entry("dynamic")
    (name,) = (a["name"] for a in entry["arguments"] if a["kind"] == "input")
    row = {"call": "small Llama, 1 x 16 ids",
           "device": bench_iree(vmfb, state_flags(mod, scratch, "llama") + input_flags([to_numpy(ids)], scratch, "ids")
                               ),
           **bench_rounds({"invoke": device_invoke(mod, entry, {name: to_numpy(ids)}),
                           "torch": lambda: mod(ids), "numpy": lambda: mod(to_numpy(ids))}),
           "exported": mod._exports}
    row.update(kernel_times(lambda: mod(ids)))  # the last host timing of the run is done (see main)
    print(row, flush=True)
    result = mod(ids)
    del mod
    gc.collect()
    check("call path llama 1x16, a result shared with torch outlives its module", rel_err(result, expected),
          BOUNDS["f16"])
    return row


def report(rows: list, options: dict) -> str:
    lines = ["## The call path: host overhead above device time (call_path.py, fp16)", "",
             "µs per call. kernels / span: the GPU's kernel time and first-start to last-end span (CUPTI, median "
             "of 20 calls). device: iree-benchmark-module. invoke: the module's VM call with its arguments on the "
             "device. "
             "torch / numpy: the whole call (torch CUDA tensors in and out; numpy in and out); invoke, torch and "
             "numpy timed in turns (8 rounds of 100 calls, the median of the rounds' medians). Overhead = torch - "
             "device; Python = torch - invoke.", "",
             "| call | kernels | busy | span | device | invoke | torch | numpy | overhead | Python | result shared |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['call']} | {r['kernels']:.0f} | {r['busy']:.0f} | {r['span']:.0f} | {r['device']:.0f} | "
                     f"{r['invoke']:.0f} | {r['torch']:.0f} | {r['numpy']:.0f} | {r['torch'] - r['device']:.0f} | "
                     f"{r['torch'] - r['invoke']:.0f} | {'yes' if r['exported'] else 'no (copied)'} |")
    lines += ["", "Where a torch `run_batch`'s host time goes (µs, medians): its steps inside a loop of whole calls, "
              "and each step repeated alone.", "",
              "| call | timed | " + " | ".join(STEPS) + " | all but the VM call |", "|---|---|" + "---:|" * (len(STEPS) + 1)]
    for r in rows:
        for timed, times in r.get("steps", {}).items():
            above = sum(times) - times[STEPS.index("VM call")]
            lines.append(f"| {r['call']} | {timed} | " + " | ".join(f"{t:.1f}" for t in times) + f" | {above:.1f} |")
    lines += ["", "Each call's kernels (CUPTI): launches per call and median µs per launch.", "",
              "| call | kernel | per call | µs each |", "|---|---|---:|---:|"]
    for r in rows:
        for name, (count, us) in sorted(r["by kernel"].items(), key=lambda item: -item[1][0] * item[1][1]):
            lines.append(f"| {r['call']} | `{name[:60]}` | {count:.0f} | {us:.1f} |")
    lines += ["", "The host's CUDA API calls (CUPTI's runtime and driver records, every thread, IREE's included): calls "
              "and summed µs per call of the module (medians of 20 calls), against the host's wall time per call "
              "(from one marker launch to the next).", "",
              "| call | API function | per call | µs per call |", "|---|---|---:|---:|"]
    for r in rows:
        for name, (count, us) in sorted(r["by api"].items(), key=lambda item: -item[1][1]):
            lines.append(f"| {r['call']} | `{name}` | {count:.0f} | {us:.1f} |")
    lines += ["", "IREE's runtime options on the decode-32 stack call (iree-benchmark-module, µs per call):", "",
              "| option | µs |", "|---|---:|"]
    lines += [f"| {name} | {us:.0f} |" for name, us in options.items()]
    return "\n".join(lines)


def main() -> int:
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        rows, options, unprofiled = stack_rows(sys.argv[1], scratch)
        rows.append(llama_row(sys.argv[1], scratch))
    # CUPTI (torch's profiler) times the kernels only after every host timing: once it has run in a
    # process, that process's CUDA calls cost more (on an H100, the decode stack's run_batch 322 µs
    # against 257 in a process that never profiled, its VM call 265 against 226, two processes in turn).
    for row, call in unprofiled:
        row.update(kernel_times(call))
    return finish(report(rows, options))


if __name__ == "__main__":
    sys.exit(main())
