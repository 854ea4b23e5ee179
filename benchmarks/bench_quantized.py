"""Quantized-base benchmark: an int8 (torchao) Llama with PEFT LoRA against its float32 base, memory and speed.

    .venv/bin/python benchmarks/bench_quantized.py [--report out.md]   # ~5 minutes on 2 cores, if idle

Workload (CPU): LlamaForCausalLM(vocab 4096, hidden 1024, intermediate 2816,
2 layers, 16 heads, 4 KV heads) under PEFT LoRA r=16 on q/v/o/gate_proj; the
int8 base is the same model after torchao's `quantize_(model,
Int8WeightOnlyConfig())` (every Linear, the LM head too: int8 weights, a float32
scale per output channel). forward(ids) -> logits, exported once with dynamic
batch and sequence, timed at ids [1, 1], [1, 16] and [4, 64].

Implementations, compiled single-tenant, timed side by side (harness.py):
  fp32          StageML, the float32 model (LoRA merged)
  int8 folded   StageML, the int8 model, default flags: the dequantization is
                static work, folded into float32 weights (LoRA merged)
  int8 kept     StageML, the int8 model with keep_quantized=True: int8 weights
                in the residual (fuse-dequant), LoRA factorized beside them
  eager fp32 / eager int8   PyTorch eager PEFT on each model (torchao's own
                int8 weight-only kernels for the int8 one)
Memory: the parameter archive (.irpa) StageML writes, and how much a process's
resident memory grows by loading the build and making one call (in a fresh
process; the runtime's own start-up, the same for every build, included).
Every StageML output is checked against its PyTorch model first (1e-4).
"""

import argparse
import copy
import os
import subprocess
import sys
import tempfile
import time

import torch

import stageml
from harness import add_timing_options, cpu_model, fmt_ms, fmt_pct, loadavg, rel_err, report, start, timed
from workloads import Logits

MAX_REL_ERR = 1e-4
CASES = ((1, 1), (1, 16), (4, 64))


def models():
    from peft import LoraConfig, get_peft_model
    from torchao.quantization import Int8WeightOnlyConfig, quantize_
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=4096, hidden_size=1024, intermediate_size=2816, num_hidden_layers=2,
                         num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=256)
    base = LlamaForCausalLM(config).eval()
    quantized = copy.deepcopy(base)
    quantize_(quantized, Int8WeightOnlyConfig())
    lora = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj", "o_proj", "gate_proj"],
                      init_lora_weights=False)
    out = {}
    for name, model in (("fp32", base), ("int8", quantized)):
        torch.manual_seed(1)  # the same adapter on both
        out[name] = Logits(get_peft_model(model, lora)).eval()
    return out


def rss_mib() -> float:
    """The process's resident memory now, MiB (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def resident_growth(path: str) -> float:
    """MiB a fresh process's resident memory grows by loading `path` and making one call (the
    runtime's own start-up included: the same for every build)."""
    code = ("import sys, torch, stageml; from bench_quantized import rss_mib; "
            "ids = torch.randint(0, 4096, (1, 16)); before = rss_mib(); "
            "m = stageml.load(sys.argv[1]); m(ids); print(rss_mib() - before)")
    out = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.abspath(__file__)))
    return float(out.stdout.split()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_timing_options(parser)
    parser.add_argument("--report", help="also write the Markdown results to this file")
    args = parser.parse_args()
    start("StageML quantized-base benchmark", args)
    eager = models()
    spec = {"ids": {0: torch.export.Dim("batch", max=8), 1: torch.export.Dim("seq", max=128)}}
    example = (torch.randint(0, 4096, (2, 16)),)
    builds = (("fp32", "fp32", {}), ("int8 folded", "int8", {}), ("int8 kept", "int8", {"keep_quantized": True}))
    mods, memory = {}, {}
    with tempfile.TemporaryDirectory(prefix="stageml-bench-") as workdir:
        for label, model, options in builds:
            started = time.perf_counter()
            art = stageml.compile(eager[model], example, dynamic_shapes=spec, **options)
            path = art.save(os.path.join(workdir, label.replace(" ", "-") + ".vmfb"))
            mods[label] = stageml.load(path)
            memory[label] = (os.path.getsize(path.removesuffix(".vmfb") + ".irpa") / 2**20, resident_growth(path))
            print(f"{label}: compile {time.perf_counter() - started:.0f} s; archive {memory[label][0]:.1f} MiB, "
                  f"resident +{memory[label][1]:.1f} MiB; {art.report.rewrites}", flush=True)
        rows = []
        for batch, seq in CASES:
            ids = torch.randint(0, 4096, (batch, seq))
            with torch.no_grad():
                refs = {m: eager[m](ids) for m in eager}
            for label, model, _ in builds:
                err = rel_err(mods[label](ids), refs[model].numpy())
                if not err < MAX_REL_ERR:
                    sys.exit(f"StageML's {label} output differs from PyTorch's at ids [{batch}, {seq}]: rel. err "
                             f"{err:.2e} >= {MAX_REL_ERR:g}; not timing a wrong result")
            fns = {label: (lambda m=mods[label]: m(ids)) for label, _, _ in builds}
            with torch.no_grad():
                fns.update({f"eager {m}": (lambda m=m: eager[m](ids)) for m in eager})
                t, others = timed(fns, args, f"{batch}x{seq}")
            rows.append((f"{batch}x{seq}", t, others))
            print(f"[{batch}x{seq}] " + "  ".join(f"{k} {v * 1e3:.2f} ms" for k, v in t.items()), flush=True)

    lines = [f"# Quantized base (int8 weight-only, torchao) against float32, {time.strftime('%Y-%m-%d')}", "",
             f"CPU: {cpu_model()}, {len(os.sched_getaffinity(0))} threads; loadavg {loadavg()} (end). "
             "Medians of benchmarks/harness.py's timed blocks (ms per call).", "",
             "| build | parameter archive | resident after load + 1 call |", "|---|---:|---:|"]
    lines += [f"| {label} | {a:.1f} MiB | +{r:.1f} MiB |" for label, (a, r) in memory.items()]
    lines += ["", "| ids | fp32 | int8 folded | int8 kept | int8 kept / fp32 | eager fp32 | eager int8 | others' CPU |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for label, t, others in rows:
        lines.append(f"| {label} | {fmt_ms(t, 'fp32')} | {fmt_ms(t, 'int8 folded')} | {fmt_ms(t, 'int8 kept')} | "
                     f"{t['int8 kept'] / t['fp32']:.2f}x | {fmt_ms(t, 'eager fp32')} | {fmt_ms(t, 'eager int8')} | "
                     f"{fmt_pct(others)} |")
    report(lines, args.report)


if __name__ == "__main__":
    main()
