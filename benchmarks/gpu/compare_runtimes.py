"""Two versions of StageML's runtime side by side in one process on one GPU: the call path of the
multi-tenant stack and the small Llama, every result checked against float64 first.

    (here)   mkdir -p BASE && for f in module tenants; do git show REV:runtime/$f.py > BASE/$f.py; done
    (there)  python3 benchmarks/gpu/compare_runtimes.py ARTIFACTS_DIR BASE [--rounds 8] [--calls 200]

BASE's `module.py` and `tenants.py` (another revision's runtime) are loaded under other module names
beside the working tree's, on the one IREE device of the process; each loads its own copy of
the residuals prepare.py compiled (the stack's archive written from a freshly seeded
peer.Weights, its 32 tenants loaded into both). Per round the two runtimes take turns, `calls`
calls each after a warm-up of 20; a table cell is the median of the round medians (µs per call),
and the last column counts the rounds the working tree's runtime was faster. Exits 1 if a result
is off float64 by more than 2e-3 (fp16).
"""
import argparse
import importlib.util
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from h200 import BOUNDS, peft_llama, rel_err, round_medians, write_archive  # noqa: E402
from peer import STACK, TENANTS, Weights, mapping  # noqa: E402

from stageml.runtime import module as this_module, tenants as this_tenants  # noqa: E402

CALLS = [("decode", 1, 1, "-decode"), ("decode", 32, 32, "-decode"), ("prefill", 256, 4, "")]


def baseline(directory: str) -> tuple:
    """(module, tenants) of the runtime in `directory`, as modules of their own that share this
    process's IREE device (one per process: see module._runtime_config)."""
    loaded = {}
    for name in ("module", "tenants"):
        path = os.path.join(directory, f"{name}.py")
        source = open(path).read().replace("stageml.runtime.module", "stageml.runtime.baseline_module")
        module = importlib.util.module_from_spec(importlib.util.spec_from_loader(f"stageml.runtime.baseline_{name}",
                                                                                 loader=None))
        sys.modules[module.__name__] = module
        exec(compile(source, path, "exec"), module.__dict__)
        if name == "module":
            module._runtime_config = this_module._runtime_config
        loaded[name] = module
    return loaded["module"], loaded["tenants"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("artifacts")
    parser.add_argument("base")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    base_module, base_tenants = baseline(args.base)
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"GPU: {torch.cuda.get_device_name()}, weights seed {seed}", flush=True)
    weights = Weights(torch.float16, seed=seed)
    stacks = {}
    for suffix in {c[3] for c in CALLS}:
        vmfb = os.path.join(args.artifacts, f"stack-tenants-f16-sm90{suffix}.vmfb")
        write_archive(weights.model, {f"weight.{l}": f"weight.{l}" for l in range(STACK["layers"])},
                      vmfb[:-5] + ".irpa")
        stacks[suffix] = []
        for runtime in (base_tenants, this_tenants):
            mod = runtime.TenantModule(vmfb, None, policy="factorized")
            for t in range(TENANTS):
                mod.load_adapter(f"t{t}", {k: v.cpu().numpy() for k, v in weights.adapter(t).items()})
            stacks[suffix].append(mod)
    rows, failed = [], False
    for kind, count, tenants, suffix in CALLS:
        assigned = mapping(kind, count, tenants)
        names = [f"t{t}" for t in assigned]
        x = torch.randn(count, STACK["d"], device="cuda", dtype=torch.float16)
        expected = weights.reference(x, assigned)
        calls = {label: (lambda mod=mod, x=x, names=names: mod.run_batch(x, names))
                 for label, mod in zip(("base", "this"), stacks[suffix])}
        rows.append((f"stack, {kind} {count} rows / {tenants} tenants, `run_batch`", calls, expected))
    llama = os.path.join(args.artifacts, "llama-f16-sm90.vmfb")
    ids = torch.randint(0, 128, (1, 16), device="cuda")
    with torch.no_grad():
        expected = peft_llama(args.artifacts).double()(ids)
    calls = {label: runtime.ResidualModule(llama) for label, runtime in (("base", base_module), ("this", this_module))}
    rows.append(("small Llama, 1 x 16 ids, `mod(ids)`", {k: (lambda m=m: m(ids)) for k, m in calls.items()}, expected))
    lines = ["| call | base | this | rounds this was faster |", "|---|---:|---:|---:|"]
    for label, calls, expected in rows:
        for name, call in calls.items():
            error = rel_err(call(), expected)
            failed |= not error <= BOUNDS["f16"]
            print(f"{'PASS' if error <= BOUNDS['f16'] else 'FAIL'} {label}, {name}: rel. err {error:.2e}", flush=True)
        medians = round_medians(calls, args.rounds, args.calls, warmup=20)
        faster = sum(t < b for b, t in zip(medians["base"], medians["this"]))
        lines.append(f"| {label} | {statistics.median(medians['base']):.1f} | {statistics.median(medians['this']):.1f} | "
                     f"{faster} of {args.rounds} |")
        print(lines[-1], flush=True)
    print("\n".join(lines))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
