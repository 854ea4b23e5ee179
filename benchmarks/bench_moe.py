"""MoE multi-tenant benchmark: mixed-tenant batches of a Mixtral-shaped model, StageML against PyTorch.

    .venv/bin/python benchmarks/bench_moe.py        # a few minutes on 2 cores, if idle

Workload (float32, CPU): MixtralForCausalLM(vocab 128, hidden 128, intermediate
256, 2 layers, 4 heads, 2 KV heads, 8 experts, top-2), 16 PEFT adapters
(r=8 on q_proj / v_proj and on the expert stacks through target_parameters,
random factors), saved with save_pretrained and loaded into StageML from those
directories. Each batch is 16 rows of 16 tokens spread round-robin over 1, 4
or 16 distinct tenants.

Implementations, timed side by side (benchmarks/harness.py):
  peft          transformers eager + PEFT, one adapter active (1-tenant batch
                only: PEFT refuses mixed batches with expert LoRA)
  peft loop     PEFT per tenant: set_adapter, then that tenant's rows
  base          the StageML residual of the base model (no adapters)
  merged        StageML, policy "merged" (a 1-tenant batch runs @forward on
                the tenant's merged expert stacks; a mixed one is factorized)
  factorized    StageML, policy "factorized": one @forward_factorized call
  per-tenant    StageML, one merged call per distinct tenant
Every StageML result is checked against PEFT's (rel. err <= 1e-4) first.
"""

import argparse
import os
import sys
import tempfile
import time

import torch

import stageml
from harness import add_timing_options, fmt_ms, fmt_pct, loadavg, rel_err, start, timed, verdict
from workloads import EXPERT_LORA, Logits, random_factors, small_mixtral

TENANTS = 16
ROWS, TOKENS = 16, 16
MAX_REL_ERR = 1e-4


def build(base, workdir):
    """A PeftModel holding TENANTS expert-LoRA adapters with random factors, each saved to workdir/<name>."""
    from peft import LoraConfig, get_peft_model
    names = [f"t{i:02d}" for i in range(TENANTS)]
    lora = LoraConfig(**EXPERT_LORA)
    model = get_peft_model(base, lora, adapter_name=names[0])
    for name in names[1:]:
        model.add_adapter(name, lora)
    random_factors(model, 0.05)
    model.save_pretrained(workdir)
    return model.eval(), names, {n: os.path.join(workdir, n) for n in names}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_timing_options(parser)
    args = parser.parse_args()
    start("StageML MoE multi-tenant benchmark", args,
          [f"batches     {ROWS} rows x {TOKENS} tokens, {TENANTS} adapters loaded, 1 / 4 / {TENANTS} tenants"])
    spec = ({0: torch.export.Dim("batch", max=64), 1: torch.export.Dim("seq", max=127)},)
    base = small_mixtral()
    rows = []
    with tempfile.TemporaryDirectory(prefix="stageml-moe-") as workdir:
        began = time.perf_counter()
        example = (torch.randint(0, 128, (2, TOKENS)),)
        base_art = stageml.compile(Logits(base).eval(), example, dynamic_shapes=spec)
        base_mod = base_art.load(os.path.join(workdir, "base", "residual.vmfb"))
        model, names, dirs = build(base, os.path.join(workdir, "adapters"))
        model.set_adapter(names[0])
        art = stageml.compile(Logits(model).eval(), example, dynamic_shapes=spec, max_adapters=TENANTS,
                              max_rank=EXPERT_LORA["r"])
        path = art.save(os.path.join(workdir, "tenants", "residual.vmfb"))
        print(f"compile: base + multi-tenant {time.perf_counter() - began:.1f} s", flush=True)
        mods = {"merged": stageml.load(path, policy="merged"), "factorized": stageml.load(path, policy="factorized")}
        for mod in mods.values():
            for name in names:
                mod.load_adapter(name, dirs[name])

        def peft(x, tenant):
            model.set_adapter(tenant)
            return model(input_ids=x, use_cache=False).logits

        for distinct in (1, 4, TENANTS):
            label = f"{distinct} tenant" + ("s" if distinct > 1 else "")
            tenants = [names[i % distinct] for i in range(ROWS)]
            groups = {t: [i for i, n in enumerate(tenants) if n == t] for t in dict.fromkeys(tenants)}
            x = torch.randint(0, 128, (ROWS, TOKENS))
            with torch.no_grad():
                ref = torch.empty(ROWS, TOKENS, 128)
                for t, g in groups.items():
                    ref[g] = peft(x[g], t)
            errors = {form: rel_err(mod.run_batch(x, tenants), ref.numpy()) for form, mod in mods.items()}
            worst = max(errors.values())
            print(f"[{label}] rel. err vs PEFT: " + ", ".join(f"{k} {v:.1e}" for k, v in errors.items()), flush=True)
            if not worst <= MAX_REL_ERR:
                sys.exit(f"StageML's output differs from PEFT's [{label}]: rel. err {worst:.2e}")
            fns = {}
            with torch.no_grad():
                if distinct == 1:
                    fns["peft"] = lambda: peft(x, tenants[0])
                fns["peft loop"] = lambda: [peft(x[g], t) for t, g in groups.items()]
            fns["base"] = lambda: base_mod(x)
            for form, mod in mods.items():
                fns[form] = lambda mod=mod: mod.run_batch(x, tenants)
            if distinct > 1:
                fns["per-tenant"] = lambda: [mods["merged"].run_batch(x[g], [t] * len(g)) for t, g in groups.items()]
            with torch.no_grad():
                t, others = timed(fns, args, label)
            rows.append((label, t, worst, others))
            print(f"[{label}] " + "  ".join(f"{k} {v * 1e3:.2f} ms" for k, v in t.items())
                  + f"; others used {fmt_pct(others)} of the CPUs", flush=True)
    print(f"\nloadavg     {loadavg()} (end)")

    print(f"\n## Results (ms: median per call of a {ROWS}x{TOKENS} batch; x: that loop's time / StageML's)\n")
    keys = ["peft", "peft loop", "base", "merged", "factorized", "per-tenant"]
    print("| batch | " + " | ".join(f"{k} ms" for k in keys)
          + " | peft loop / factorized | per-tenant / factorized | merged / base | rel. err | others' CPU |")
    print("|---|" + "---:|" * (len(keys) + 5))
    for label, t, err, others in rows:
        per_tenant = f"{t['per-tenant'] / t['factorized']:.2f}x" if "per-tenant" in t else "n/a"
        print(f"| {label} | " + " | ".join(fmt_ms(t, k) for k in keys)
              + f" | {t['peft loop'] / t['factorized']:.2f}x | {per_tenant} | {t['merged'] / t['base']:.2f}x"
              + f" | {err:.1e} | {fmt_pct(others)} |")
    print("\n## Targets")
    for label, t, _, _ in rows:
        if label == f"{TENANTS} tenants":
            for loop in ("peft loop", "per-tenant"):
                speedup = t[loop] / t["factorized"]
                print(f"  {label}: factorized {speedup:.2f}x faster than the {loop}, target >= 2x: "
                      + verdict(speedup, 2, at_least=True))
        if label == "1 tenant":
            ratio = t["merged"] / t["base"]
            print(f"  {label}: the merged plan {ratio:.2f}x the base model's residual, target <= 1.1x: "
                  + verdict(ratio, 1.1, at_least=False))


if __name__ == "__main__":
    main()
