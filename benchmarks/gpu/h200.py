"""StageML on an H200: correctness against PyTorch, then device-side timings.

    benchmarks/gpu/run_h200.sh ARTIFACTS_DIR [REPORT.md]      # on the GPU machine

Needs only PyTorch (CUDA), the IREE runtime wheel, transformers + PEFT (for
the Llama reference) and what prepare.py compiled. Three parts:

1. Checks, each on fresh random inputs against a float64 PyTorch reference
   computed from the same (rounded) weights: relative error <= 2e-3 (fp16),
   <= 1e-2 (bf16). The 8-layer LoRA stacks at 1/16/64/256 tokens (their
   weights drawn here from a fresh seed and written to the parameter
   archive); the PEFT Llama's residual; the multi-tenant Llama's mixed
   batches (factorized and merged policies).
2. The stack, per layer (d=4096, r=16): StageML sm90 vs IREE's generic CUDA
   code (--target cuda) vs PyTorch eager vs the HBM floor (bytes read and
   written once / the GPU's HBM peak, kernel_check.hbm_bytes_per_s). IREE residuals are timed by
   iree-benchmark-module (median of 5 repetitions, each the mean of many
   back-to-back calls; a call's time includes its submission and wait);
   PyTorch by CUDA events around each call (median of 200, after 20
   warm-up calls). The stack's 8 layers (256 MiB of weights) outgrow the
   L2, so every call reads its weights from HBM; per layer = per call / 8.
3. The small PEFT-LoRA Llama (fp16): StageML sm90 and cuda residuals vs
   PyTorch eager PEFT, per call, timed the same way.

Exit status 1 when a check fails.
"""

import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import stageml  # noqa: E402
from iree import runtime as iree_rt  # noqa: E402
from kernel_check import hbm_bytes_per_s  # noqa: E402
from stageml.files import write_file  # noqa: E402
from stageml.runtime import manifest as manifests  # noqa: E402
from stageml.runtime.module import CUDA_ALLOCATORS, CUDA_FLAGS, as_numpy  # noqa: E402
from workloads import LINEAR_LORA, LLAMA_LORA, Linear, Logits, LoraStack, small_llama  # noqa: E402

BOUNDS = {"f16": 2e-3, "bf16": 1e-2}
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}
IREE_TYPES = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "int64": "i64"}
TOKENS = (1, 16, 64, 256)
STACK = dict(layers=8, d=4096, r=16)
BENCH = os.path.join(os.path.dirname(iree_rt.__file__), "..", "_runtime_libs", "iree-benchmark-module")
FAILURES = []
PROFILED_CALLS = 20  # kernel_times


def rel_err(actual, expected) -> float:
    actual = torch.as_tensor(np.asarray(actual, dtype=np.float64)) if not torch.is_tensor(actual) else actual
    actual, expected = actual.double().cpu(), expected.double().cpu()
    if not torch.isfinite(actual).all():
        return float("inf")
    return float(torch.linalg.norm(actual - expected) / torch.linalg.norm(expected))


def check(what: str, err: float, bound: float) -> None:
    ok = err <= bound
    print(f"{'PASS' if ok else 'FAIL'} {what}: rel. err {err:.2e} (bound {bound:.0e})", flush=True)
    if not ok:
        FAILURES.append(what)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    return as_numpy(t.detach().cpu())


# --- timing -------------------------------------------------------------------

def input_flags(arrays: list, scratch: str, tag: str) -> list:
    """iree-benchmark-module --input flags for `arrays`, written to raw files in `scratch`."""
    flags = []
    for i, a in enumerate(arrays):
        path = os.path.join(scratch, f"{tag}-{i}.bin")
        a = np.ascontiguousarray(a)
        a.view(np.uint8).tofile(path)
        flags.append(f"--input={'x'.join(map(str, a.shape))}x{IREE_TYPES[a.dtype.name]}=@{path}")
    return flags


def bench_iree(vmfb: str, flags: list, function: str = "forward") -> float:
    """Median µs per call of `vmfb`'s `function` (its .irpa beside it) by iree-benchmark-module,
    with the runtime flags and allocators stageml.load sets, then `flags` (a later flag wins)."""
    done = subprocess.run([BENCH, f"--module={vmfb}", "--device=cuda", f"--parameters=model={vmfb[:-5]}.irpa",
                           f"--function={function}", *CUDA_FLAGS, *(f"--device_allocator={a}" for a in CUDA_ALLOCATORS),
                           *flags, "--benchmark_repetitions=5",
                           "--benchmark_report_aggregates_only=true", "--benchmark_format=json"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"iree-benchmark-module failed on {vmfb}: {done.stderr[-2000:]}")
    runs = json.loads(done.stdout)["benchmarks"]
    median = next(b for b in runs if b.get("aggregate_name") == "median")
    scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3}[median["time_unit"]]
    return median["real_time"] * scale


def bench_torch(fn, calls: int = 200, warmup: int = 20) -> float:
    """Median µs per call of `fn` by CUDA events around each call."""
    with torch.no_grad():
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(calls):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def kernel_times(call) -> dict:
    """The GPU's side of `call`, and the CUDA API calls the host made for it: medians over
    PROFILED_CALLS calls of the summed kernel time, the span from first kernel start to last
    kernel end (µs), the kernels per call, and per API function (runtime or driver, whichever
    thread called it: IREE's included) its calls and summed µs per call, with the host's wall time
    per call (from one marker launch to the next)."""
    marker = torch.zeros(1, device="cuda")
    call()
    torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as scratch:
        trace = os.path.join(scratch, "trace.json")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:  # CUPTI: API calls too
            for i in range(PROFILED_CALLS):
                marker.fill_(i)
                call()
            marker.fill_(-1)
            torch.cuda.synchronize()
        prof.export_chrome_trace(trace)
        with open(trace) as f:
            events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    api = sorted((e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")), key=lambda e: e["ts"])
    markers = {e["args"].get("correlation") for e in kernels if "FillFunctor" in e["name"]}
    calls, current = [], None
    for e in kernels:
        if "FillFunctor" in e["name"]:
            if current:
                calls.append(current)
            current = []
        elif current is not None:
            current.append(e)
    if len(calls) != PROFILED_CALLS or not all(calls):
        print(f"CUPTI saw {len(kernels)} kernels in {len(calls)} calls: no kernel times", flush=True)
        return {"busy": float("nan"), "span": float("nan"), "kernels": 0, "by kernel": {}, "by api": {}}
    by_kernel = {}
    for c in calls:
        for e in c:
            by_kernel.setdefault(e["name"], []).append(e["dur"])
    # the host's side: API calls between one marker's launch and the next
    ends = {}
    for e in api:
        if e["args"].get("correlation") in markers:
            ends[e["args"]["correlation"]] = max(ends.get(e["args"]["correlation"], 0), e["ts"] + e["dur"])
    bounds = sorted(ends.values())
    per_call = [[e for e in api if a <= e["ts"] < b] for a, b in zip(bounds, bounds[1:])]
    by_api, walls = {}, [b - a for a, b in zip(bounds, bounds[1:])]
    if len(per_call) == PROFILED_CALLS:
        for name in {e["name"] for c in per_call for e in c}:
            mine = [[e["dur"] for e in c if e["name"] == name] for c in per_call]
            by_api[name] = (statistics.median(len(m) for m in mine), statistics.median(sum(m) for m in mine))
        by_api["(wall time, marker to marker)"] = (1, statistics.median(walls))
    else:
        print(f"CUPTI saw {len(bounds)} marker launches for {PROFILED_CALLS} calls: no API times", flush=True)
    return {"busy": statistics.median(sum(e["dur"] for e in c) for c in calls),
            "span": statistics.median(c[-1]["ts"] + c[-1]["dur"] - c[0]["ts"] for c in calls),
            "kernels": statistics.median(len(c) for c in calls),
            "by kernel": {name: (len(d) / PROFILED_CALLS, statistics.median(d)) for name, d in by_kernel.items()},
            "by api": by_api}


def state_flags(mod, scratch: str, tag: str) -> list:
    """--input flags for the adapter state @forward takes before its inputs."""
    return input_flags([np.asarray(s.to_host()) for s in mod.state], scratch, tag)


# --- the LoRA stack -------------------------------------------------------------

def stack_model(dtype: str, seed: int) -> LoraStack:
    torch.manual_seed(seed)
    with torch.device("cuda"):
        return LoraStack(**STACK).to(DTYPES[dtype]).eval()


def write_archive(model, keys: dict, path: str) -> None:
    """The parameter archive of `model` (irpa key -> state-dict name in `keys`) at
    `path`, recorded in the manifest beside it (its size and hash), as a save would."""
    state = model.state_dict()
    index = iree_rt.ParameterIndex()
    for key, name in keys.items():
        value = np.ascontiguousarray(to_numpy(state[name]))
        if value.dtype.name == "bfloat16":  # IREE's archive writer has no bfloat16: same bits
            value = value.view(np.uint16)
        iree_rt.parameter_index_add_numpy_ndarray(index, key, value)
    index.create_archive_file(path)
    manifest_path = path[:-5] + ".json"
    with open(manifest_path) as f:
        manifest = json.load(f)
    manifest["files"]["parameters"] = manifests.file_entry(path, os.path.basename(path))
    write_file(manifest_path, json.dumps(manifest, indent=1))


def hbm_floor_us(form: str, tokens: int) -> float:
    d, r = STACK["d"], STACK["r"]
    weights = d * d + (2 * d * r if form == "factorized" else 0)
    return (weights + 2 * tokens * d) * 2 / hbm_bytes_per_s() * 1e6


def stacks(art_dir: str, entries: list, scratch: str) -> list:
    rows = []
    for dtype in DTYPES:
        model = stack_model(dtype, seed=int.from_bytes(os.urandom(4), "little"))
        merged = [w.clone() for w in model.merged()]
        reference = copy.deepcopy(model).double()
        mods, states = {}, {}
        for e in (e for e in entries if e["workload"] == "stack" and e["dtype"] == dtype):
            vmfb = os.path.join(art_dir, e["name"] + ".vmfb")
            write_archive(model, e["irpa"], vmfb[:-5] + ".irpa")
            mods[(e["form"], e["target"])] = mod = stageml.load(vmfb)
            states[(e["form"], e["target"])] = state_flags(mod, scratch, e["name"])
        for tokens in TOKENS:
            x = torch.randn(tokens, STACK["d"], device="cuda", dtype=DTYPES[dtype])
            with torch.no_grad():
                expected = reference(x.double())
                print(f"     stack {dtype} PyTorch eager itself, {tokens} tokens: rel. err {rel_err(model(x), expected):.2e}")
            for (form, target), mod in mods.items():
                check(f"stack {dtype} {form} {target}, {tokens} tokens", rel_err(mod(to_numpy(x)), expected),
                      BOUNDS[dtype])

            def eager_merged(x=x):
                for w in merged:
                    x = x @ w
                return x

            row = {"dtype": dtype, "tokens": tokens}
            for form in ("merged", "factorized"):
                for target in ("sm90", "cuda"):
                    vmfb = os.path.join(art_dir, f"stack-{dtype}-{form}-{target}.vmfb")
                    flags = states[(form, target)] + input_flags([to_numpy(x)], scratch, "x")
                    row[f"{form} {target}"] = bench_iree(vmfb, flags) / STACK["layers"]
                eager = eager_merged if form == "merged" else (lambda x=x: model(x))
                row[f"{form} eager"] = bench_torch(eager) / STACK["layers"]
                row[f"{form} floor"] = hbm_floor_us(form, tokens)
            rows.append(row)
            print(row, flush=True)
    return rows


# --- the Llama -------------------------------------------------------------------

def peft_llama(art_dir: str):
    from peft import LoraConfig, get_peft_model

    model = Logits(get_peft_model(small_llama(), LoraConfig(**LLAMA_LORA))).half().eval()
    model.load_state_dict(torch.load(os.path.join(art_dir, "llama.pt")))
    return model.cuda()


def llama(art_dir: str, scratch: str) -> list:
    model = peft_llama(art_dir)
    reference = copy.deepcopy(model).double()
    rows = []
    for batch, seq in ((1, 16), (4, 64)):
        ids = torch.randint(0, 128, (batch, seq), device="cuda")
        with torch.no_grad():
            expected = reference(ids)
        row = {"shape": f"{batch}x{seq}"}
        for target in ("sm90", "cuda"):
            vmfb = os.path.join(art_dir, f"llama-f16-{target}.vmfb")
            mod = stageml.load(vmfb)
            check(f"llama f16 {target} {batch}x{seq}", rel_err(mod(to_numpy(ids)), expected), BOUNDS["f16"])
            flags = state_flags(mod, scratch, f"llama-{target}") + input_flags([to_numpy(ids)], scratch, "ids")
            row[target] = bench_iree(vmfb, flags)
        row["eager"] = bench_torch(lambda: model(ids))
        rows.append(row)
        print(row, flush=True)
    staged_modules(art_dir, reference)
    tenants(art_dir, model)
    return rows


def staged_modules(art_dir: str, reference) -> None:
    """stageml.torch on the GPU: a StagedModule takes and returns CUDA tensors, eagerly and
    inside a torch.compile'd program; a multi-tenant one serves an adapter."""
    StagedModule = stageml.torch.StagedModule
    ids = torch.randint(0, 128, (2, 16), device="cuda")
    with torch.no_grad():
        expected = reference(ids)
    staged = StagedModule(os.path.join(art_dir, "llama-f16-sm90.vmfb"))
    logits = staged(ids)
    check(f"stageml.torch StagedModule sm90, CUDA ids in, a {logits.device.type} tensor out",
          rel_err(logits, expected) if logits.device.type == "cuda" else float("inf"), BOUNDS["f16"])
    program = torch.compile(lambda ids: staged(ids).float().log_softmax(-1), fullgraph=True)
    check("stageml.torch StagedModule sm90 inside torch.compile (fullgraph)",
          rel_err(program(ids), expected.log_softmax(-1)), BOUNDS["f16"])
    peft = copy.deepcopy(reference.m)
    peft.load_adapter(os.path.join(art_dir, "adapters", "t1"), adapter_name="t1")
    peft.set_adapter("t1")
    peft.double()
    with torch.no_grad():
        expected = peft(input_ids=ids, use_cache=False).logits
    tenant = StagedModule(tenant_module(art_dir, "llama-tenants-f16-sm90", "factorized", ["t1"]), adapter="t1")
    check("stageml.torch StagedModule sm90, multi-tenant residual, adapter t1 on CUDA ids",
          rel_err(tenant(ids), expected), BOUNDS["f16"])


def linear_tenants(art_dir: str) -> dict:
    """Mixed one-token rows over 8 PEFT adapters and the base model (the BGMV
    kernel's form), both policies; the factorized call timed against PEFT's
    mixed batch (`adapter_names=`), each per call on the host clock, synchronized.
    Then rows of 12 tokens, one adapter each (the site's kernels on their tokens)."""
    from peft import LoraConfig, get_peft_model

    peft = get_peft_model(Linear(1024), LoraConfig(**LINEAR_LORA)).half().eval()
    peft.load_state_dict(torch.load(os.path.join(art_dir, "linear.pt")))
    names = [f"l{i}" for i in range(8)]
    for name in names:
        peft.load_adapter(os.path.join(art_dir, "adapters", name), adapter_name=name)
    peft = peft.cuda()
    rows = [None] + names * 4  # 33 rows, one token each
    x = torch.randn(len(rows), 1024, device="cuda", dtype=torch.float16)
    reference = copy.deepcopy(peft).double()
    with torch.no_grad():
        expected = reference(x.double(), adapter_names=[r or "__base__" for r in rows])
    timings = {}
    for policy in ("factorized", "merged"):
        mod = tenant_module(art_dir, "linear-tenants-f16-sm90", policy, names)
        check(f"linear tenants f16 sm90 {policy}, 33 one-token rows of 8 adapters + base",
              rel_err(mod.run_batch(to_numpy(x), rows), expected), BOUNDS["f16"])
        if policy == "factorized":
            timings["stageml"] = bench_host(lambda: mod.run_batch(to_numpy(x), rows))
    with torch.no_grad():
        timings["peft"] = bench_host(lambda: peft(x, adapter_names=[r or "__base__" for r in rows]).cpu())
    prompts = [None] + names  # rows of 12 tokens, one adapter each
    x = torch.randn(len(prompts), 12, 1024, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        expected = reference(x.double(), adapter_names=[r or "__base__" for r in prompts])
    mod = tenant_module(art_dir, "linear-tenants-tokens-f16-sm90", "factorized", names)
    check("linear tenants f16 sm90 factorized, 9 rows of 12 tokens of 8 adapters + base",
          rel_err(mod.run_batch(x, prompts), expected), BOUNDS["f16"])
    print(timings, flush=True)
    return timings


def bench_host(fn, calls: int = 100, warmup: int = 10) -> float:
    """Median µs per call of `fn`, which returns host data, on the host clock."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def round_medians(fns: dict, rounds: int = 8, calls: int = 100, warmup: int = 10) -> dict:
    """{name: [each round's median µs per call]} of each of `fns` (which return host data or
    device results left where they are), taken in turns: `rounds` rounds, each timing every
    function over `calls` calls after `warmup`. Functions compared with each other this way
    share the host's slow and fast spells."""
    medians = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            medians[name].append(bench_host(fn, calls, warmup))
    return medians


def bench_rounds(fns: dict, rounds: int = 8, calls: int = 100, warmup: int = 10) -> dict:
    """{name: the median of its rounds' medians} of round_medians(fns, ...)."""
    return {name: statistics.median(values) for name, values in round_medians(fns, rounds, calls, warmup).items()}


def tenant_module(art_dir: str, name: str, policy: str, adapters: list):
    """The multi-tenant artifact `name` with `adapters` loaded from their PEFT directories."""
    mod = stageml.load(os.path.join(art_dir, name + ".vmfb"), policy=policy)
    for adapter in adapters:
        mod.load_adapter(adapter, os.path.join(art_dir, "adapters", adapter))
    return mod


def tenants(art_dir: str, model) -> None:
    """Mixed batches of three PEFT adapters and the base model, both policies."""
    peft = model.m
    names = ["t0", "t1", "t2"]
    for name in names:
        peft.load_adapter(os.path.join(art_dir, "adapters", name), adapter_name=name)
    rows = [None, "t0", "t1", "t2", "t0", None, "t2", "t1"]
    ids = torch.randint(0, 128, (len(rows), 12), device="cuda")
    with torch.no_grad():
        expected = peft.double()(input_ids=ids, adapter_names=[r or "__base__" for r in rows], use_cache=False).logits
    for policy in ("factorized", "merged"):
        mod = tenant_module(art_dir, "llama-tenants-f16-sm90", policy, names)
        check(f"llama tenants f16 sm90 {policy}, mixed batch of 8",
              rel_err(mod.run_batch(to_numpy(ids), rows), expected), BOUNDS["f16"])
        check(f"llama tenants f16 sm90 {policy}, one tenant",
              rel_err(mod.run_batch(to_numpy(ids[1:2]), ["t0"]), expected[1:2]), BOUNDS["f16"])


# --- report ---------------------------------------------------------------------

def report(stack_rows: list, llama_rows: list, tenant_times: dict, entries: list) -> str:
    lines = ["## LoRA stack, µs per layer (d=4096, r=16; 8 layers per call)", "",
             "StageML and IREE generic: iree-benchmark-module, median of 5 repetitions (a call's time includes "
             "its submission and wait), / 8. PyTorch eager: CUDA events around each call, median of 200, / 8. "
             "256 MiB of weights per call: every call reads them from HBM.", "",
             "| dtype | tokens | form | StageML sm90 | IREE generic | PyTorch eager | HBM floor | sm90 / eager | sm90 / floor |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in stack_rows:
        for form in ("merged", "factorized"):
            sm90, eager, floor = r[f"{form} sm90"], r[f"{form} eager"], r[f"{form} floor"]
            lines.append(f"| {r['dtype']} | {r['tokens']} | {form} | {sm90:.1f} | {r[f'{form} cuda']:.1f} | "
                         f"{eager:.1f} | {floor:.1f} | {sm90 / eager:.2f}x | {sm90 / floor:.2f}x |")
    lines += ["", "Fused factorized vs merged (sm90), per layer:", ""]
    for r in stack_rows:
        lines.append(f"- {r['dtype']}, {r['tokens']} tokens: {r['factorized sm90'] / r['merged sm90']:.2f}x")
    lines += ["", "## Small PEFT-LoRA Llama (fp16), µs per call", "",
              "LlamaForCausalLM (vocab 128, hidden 128, 2 layers) with PEFT LoRA r=8 on q/v/o/gate; timed as above.",
              "",
              "| ids | StageML sm90 | StageML cuda | PyTorch eager PEFT | eager / sm90 |", "|---|---:|---:|---:|---:|"]
    for r in llama_rows:
        lines.append(f"| {r['shape']} | {r['sm90']:.1f} | {r['cuda']:.1f} | {r['eager']:.1f} | {r['eager'] / r['sm90']:.2f}x |")
    lines += ["", "## Multi-tenant LoRA linear (fp16, d=1024, r=16), 33 one-token rows over 8 adapters + base", "",
              f"StageML sm90 factorized (`run_batch`, numpy in and out): {tenant_times['stageml']:.1f} µs per call; "
              f"PEFT mixed batch (`adapter_names=`, GPU tensors, `.cpu()`): {tenant_times['peft']:.1f} µs per call "
              f"(host clock, median of 100)."]
    lines += ["", "Custom kernels per artifact: " + "; ".join(f"{e['name']}: {e['kernels']}" for e in entries
                                                              if e["target"] == "sm90")]
    return "\n".join(lines)


def main() -> int:
    art_dir = sys.argv[1]
    with open(os.path.join(art_dir, "artifacts.json")) as f:
        entries = json.load(f)
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        llama_rows = llama(art_dir, scratch)
        tenant_times = linear_tenants(art_dir)
        stack_rows = stacks(art_dir, entries, scratch)
    return finish(report(stack_rows, llama_rows, tenant_times, entries))


def finish(text: str) -> int:
    """Prints the report `text` (and writes it to argv[2]); the exit status: 1 if a check failed."""
    print(text)
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as f:
            f.write(text + "\n")
    print("checks failed: " + ", ".join(FAILURES) if FAILURES else "all checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
