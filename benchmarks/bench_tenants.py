"""Multi-tenant benchmark: mixed-tenant batches, StageML against PyTorch, in one process.

    .venv/bin/python benchmarks/bench_tenants.py      # about 5 minutes on 2 cores, if idle

Workloads (float32, CPU), each with 32 random PEFT LoRA adapters saved with
save_pretrained and loaded into StageML from those directories:
  (a) LoRA linear: nn.Linear(4096, 4096, bias=False), adapters r=16 alpha=32,
      input [32, 4096]: 32 rows of one token.
  (b) small Llama: LlamaForCausalLM(vocab 128, hidden 128, intermediate 256,
      2 layers, 4 heads, 2 KV heads), adapters r=8 on q/v/o/gate_proj,
      input ids [32, 16]: 32 rows of 16 tokens.
Each batch has 32 rows spread round-robin over 1, 4 or 32 distinct tenants.

Implementations, all timed side by side (benchmarks/harness.py):
  peft loop     PEFT's mixed batch, model(x, adapter_names=[...]): the base
                layer once, then a Python loop over the batch's tenants
  bgmv einsum   (linear only) x@W^T + einsum over the rows' gathered A, B
  base          the StageML single-tenant residual of the same model
                (compiled without max_adapters): one merged GEMM per layer
  merged        StageML, policy "merged": a one-tenant batch runs @forward
                with that tenant's merged weights; a mixed batch runs one
                factorized call
  factorized    StageML, policy "factorized": one @forward_factorized call
  policy        StageML, policy "auto" under a memory budget of 4 merged
                adapters, after 64 warm-up batches of the same traffic
  per-tenant    StageML, one merged call per distinct tenant (the design
                StageML does not use for mixed batches; shown for the reason)
Every StageML result is checked against PEFT's (rel. err <= 1e-4) before
timing. Adapter load time per tenant is the median of the 32 load_adapter
calls (from the PEFT directory); bytes held per tenant come from stats().
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

import stageml
from harness import add_timing_options, fmt_ms, fmt_pct, loadavg, rel_err, start, timed, verdict
from workloads import LINEAR_LORA, LLAMA_LORA, Linear, Logits, small_llama

TENANTS = 32
ROWS = 32
MAX_REL_ERR = 1e-4
MERGED_IN_BUDGET = 4


def lora_linear():
    from peft import LoraConfig
    spec = {"args": ({0: torch.export.Dim("rows", max=4096)},)}
    return Linear(), LoraConfig(**LINEAR_LORA), spec, lambda: torch.randn(ROWS, 4096)


def llama():
    from peft import LoraConfig
    spec = {"ids": {0: torch.export.Dim("batch", max=64), 1: torch.export.Dim("seq", max=127)}}
    return small_llama(), LoraConfig(**LLAMA_LORA), spec, lambda: torch.randint(0, 128, (ROWS, 16))


def build(base, lora, workdir):
    """A PeftModel holding TENANTS adapters, each saved to workdir/<name>."""
    from peft import get_peft_model
    names = [f"t{i:02d}" for i in range(TENANTS)]
    model = get_peft_model(base, lora, adapter_name=names[0]).eval()
    for name in names[1:]:
        model.add_adapter(name, lora)
    model.save_pretrained(workdir)  # each adapter in workdir/<name>
    dirs = {n: os.path.join(workdir, n) for n in names}
    return model.eval(), names, dirs


def bgmv(model, names):
    """x@W^T + per-row s·(x@A_t^T)@B_t^T, factors gathered by row (linear only)."""
    layer = model.base_model.model.fc
    a = torch.stack([layer.lora_A[n].weight for n in names]).detach()                      # [T, r, in]
    b = torch.stack([layer.lora_B[n].weight * layer.scaling[n] for n in names]).detach()   # [T, out, r]
    weight = layer.base_layer.weight.detach()
    index = {n: i for i, n in enumerate(names)}

    def run(x, rows):
        ids = torch.tensor([index[n] for n in rows])
        low = torch.einsum("bi,bri->br", x, a[ids])
        return x @ weight.T + torch.einsum("br,bor->bo", low, b[ids])
    return run


def bench_workload(title, make, args, rows_out, loads_out):
    print(f"\n## {title}", flush=True)
    base, lora, spec, make_input = make()
    with tempfile.TemporaryDirectory(prefix="stageml-tenants-") as workdir:
        model, names, dirs = build(base, lora, os.path.join(workdir, "adapters"))
        is_linear = title.startswith("lora-linear")
        wrapped = model if is_linear else Logits(model).eval()
        example = (make_input()[:2],)
        model.set_adapter(names[0])
        start = time.perf_counter()
        single = stageml.compile(wrapped, example, dynamic_shapes=spec)
        art = stageml.compile(wrapped, example, dynamic_shapes=spec, max_adapters=TENANTS,
                              max_rank=lora.r)
        print(f"compile: single-tenant + multi-tenant {time.perf_counter() - start:.1f} s")
        base_mod = single.load(os.path.join(workdir, "single", "residual.vmfb"))
        path = art.save(os.path.join(workdir, "tenants", "residual.vmfb"))
        site_bytes = art.tenants["sites"]
        merged_bytes = sum(s["in_features"] * s["out_features"] * 4 for s in site_bytes)
        factor_bytes = sum(lora.r * (s["in_features"] + s["out_features"]) * 4 for s in site_bytes)
        budget = TENANTS * factor_bytes + MERGED_IN_BUDGET * merged_bytes
        mods = {"merged": stageml.load(path, policy="merged"),
                "factorized": stageml.load(path, policy="factorized"),
                "policy": stageml.load(path, adapter_memory_budget=budget, replan_every=16)}
        for form, mod in mods.items():
            seconds = []
            for name in names:
                start = time.perf_counter()
                mod.load_adapter(name, dirs[name])
                seconds.append(time.perf_counter() - start)
            stats = mod.stats()["adapters"][names[0]]
            loads_out.append((title.split()[0], form, statistics.median(seconds), stats["bytes_held"]))
            print(f"load_adapter ({form}): median {statistics.median(seconds) * 1e3:.1f} ms per tenant, "
                  f"{stats['bytes_held'] / 2**20:.2f} MiB held per tenant", flush=True)
        einsum = bgmv(model, names) if is_linear else None

        for distinct in (1, 4, TENANTS):
            label = f"{distinct} tenant" + ("s" if distinct > 1 else "")
            tenants = [names[i % distinct] for i in range(ROWS)]
            x = make_input()
            with torch.no_grad():
                ref = wrapped(x, adapter_names=tenants) if is_linear else model(
                    input_ids=x, adapter_names=tenants, use_cache=False).logits
            for _ in range(64):  # the policy learns this traffic (re-plans every 16 calls)
                mods["policy"].run_batch(x, tenants)
            fns = {}
            with torch.no_grad():
                if is_linear:
                    fns["peft loop"] = lambda: wrapped(x, adapter_names=tenants)
                    fns["bgmv einsum"] = lambda: einsum(x, tenants)
                else:
                    fns["peft loop"] = lambda: model(input_ids=x, adapter_names=tenants, use_cache=False)
            fns["base"] = lambda: base_mod(x)
            for form, mod in mods.items():
                fns[form] = lambda mod=mod: mod.run_batch(x, tenants)
            if distinct > 1:
                groups = {t: [i for i, n in enumerate(tenants) if n == t] for t in dict.fromkeys(tenants)}
                fns["per-tenant"] = lambda: [mods["merged"].run_batch(x[g], [t] * len(g)) for t, g in groups.items()]
            errors = {form: rel_err(mod.run_batch(x, tenants), ref.numpy()) for form, mod in mods.items()}
            if is_linear:
                errors["bgmv einsum"] = rel_err(einsum(x, tenants).numpy(), ref.numpy())
            worst = max(errors.values())
            print(f"[{label}] rel. err vs PEFT: " + ", ".join(f"{k} {v:.1e}" for k, v in errors.items()), flush=True)
            if not worst <= MAX_REL_ERR:
                sys.exit(f"StageML's output differs from PEFT's on {title} [{label}]: rel. err {worst:.2e}")
            merged = mods["policy"].stats()["adapters"][tenants[0]]["form"] == "merged"
            path = "@forward (merged)" if distinct == 1 and merged else "@forward_factorized"
            with torch.no_grad():
                t, others = timed(fns, args, label)
            rows_out.append((title.split()[0], label, t, worst, others, path))
            print(f"[{label}] " + "  ".join(f"{k} {v * 1e3:.2f} ms" for k, v in t.items())
                  + f"; the policy's call: {path}; others used {fmt_pct(others)} of the CPUs", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_timing_options(parser)
    args = parser.parse_args()
    start("StageML multi-tenant benchmark", args,
          [f"batches     {ROWS} rows, {TENANTS} adapters loaded, 1 / 4 / {TENANTS} distinct tenants per batch"])

    rows, loads = [], []
    started = time.perf_counter()
    bench_workload("lora-linear 4096x4096 r=16", lora_linear, args, rows, loads)
    bench_workload("llama 2 layers hidden 128 r=8", llama, args, rows, loads)
    print(f"\nloadavg     {loadavg()} (end); total {time.perf_counter() - started:.0f} s")

    print("\n## Results (ms: median per call of a 32-row batch; x: PEFT loop time / that time, > 1 means faster)\n")
    keys = ["peft loop", "bgmv einsum", "base", "merged", "factorized", "policy", "per-tenant"]
    print("| model | batch | " + " | ".join(f"{k} ms" for k in keys) + " | factorized x | policy x "
          "| policy / base | policy's call | rel. err | others' CPU |")
    print("|---|---|" + "---:|" * (len(keys) + 6))
    for model, label, t, err, others, path in rows:
        print(f"| {model} | {label} | " + " | ".join(fmt_ms(t, k) for k in keys)
              + f" | {t['peft loop'] / t['factorized']:.2f}x | {t['peft loop'] / t['policy']:.2f}x"
              + f" | {t['policy'] / t['base']:.2f}x | {path} | {err:.1e} | {fmt_pct(others)} |")
    print("\n## Adapter load time and bytes held per tenant\n")
    print("| model | policy | load_adapter ms | MiB held per tenant |")
    print("|---|---|---:|---:|")
    for model, form, seconds, held in loads:
        print(f"| {model} | {form} | {seconds * 1e3:.1f} | {held / 2**20:.2f} |")

    print("\n## Targets")
    for model, label, t, _, _, _ in rows:
        if label == f"{TENANTS} tenants":
            speedup = t["peft loop"] / t["factorized"]
            print(f"  {model}, {label}: factorized {speedup:.2f}x faster than the PEFT loop, target >= 2x: "
                  + verdict(speedup, 2, at_least=True))
        if label == "1 tenant":
            ratio = t["policy"] / t["base"]
            print(f"  {model}, {label}: policy {ratio:.2f}x the merged base-model residual, target <= 1.1x: "
                  + verdict(ratio, 1.1, at_least=False))


if __name__ == "__main__":
    main()
