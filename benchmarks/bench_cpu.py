"""CPU benchmark: a StageML residual against PyTorch, side by side in one process.

    .venv/bin/python benchmarks/bench_cpu.py          # about 1-2 minutes on 2 cores, if idle

Workloads (float32, CPU):
  (a) LoRA linear: nn.Linear(4096, 4096, bias=False) under PEFT LoRA r=16,
      alpha=32, input [tokens, 4096] at 1, 16 and 64 tokens; exported once with
      a dynamic token dim (Dim("tokens", max=4096)), so one .vmfb serves all three.
  (b) small Llama: LlamaForCausalLM(vocab 128, hidden 128, intermediate 256,
      2 layers, 4 heads, 2 KV heads) under PEFT LoRA r=8 on q/v/o/gate_proj,
      forward(ids) -> logits, exported once with dynamic batch (max 64) and seq
      (max 127) dims, timed at ids [1, 16] and [4, 64].

Each is compared with PyTorch eager PEFT (unmerged), eager after
merge_and_unload() (on a deepcopy), and torch.compile of the merged model
(compiled before timing; "n/a" with the reason if it fails). StageML's output
is checked against eager PEFT before anything is timed.

Timing and the shared-machine guard: benchmarks/harness.py (blocks of
warm-up + timed calls, medians, retimed while other processes use the CPUs).
torch.set_num_threads is set to the core count. The shipped compiler is
measured as is (flags: the CPU target's, stageml.compiler.targets.cpu).
"""

import argparse
import copy
import os
import sys
import tempfile
import time

import torch

import stageml
from harness import add_timing_options, fmt_ms, fmt_pct, loadavg, rel_err, start, timed, verdict
from workloads import LINEAR_LORA, LLAMA_LORA, Linear, Logits, small_llama
from stageml.compiler.targets.cpu import CpuTarget

MAX_REL_ERR = 1e-4
TARGETS = {1: 1.2, 16: 1.0, 64: 1.0}  # LoRA linear: tokens -> max StageML / eager merged


def try_torch_compile(model, inputs: list):
    """(compiled model, seconds spent compiling on `inputs`) or (None, reason)."""
    start = time.perf_counter()
    try:
        compiled = torch.compile(model)
        with torch.no_grad():
            for x in inputs:        # every shape compiles (and recompiles) here, not in timing
                compiled(x)
                compiled(x)
        return compiled, time.perf_counter() - start
    except Exception as e:
        torch._dynamo.reset()
        return None, f"{type(e).__name__}: {str(e).strip().splitlines()[0][:120] if str(e).strip() else ''}"


# ----------------------------------------------------------------------------- models


def lora_linear():
    from peft import LoraConfig, get_peft_model
    model = get_peft_model(Linear(), LoraConfig(**LINEAR_LORA)).eval()
    merged = copy.deepcopy(model).merge_and_unload().eval()
    tokens = torch.export.Dim("tokens", max=4096)
    # PeftModel.forward(*args, **kwargs): dynamic shapes are given for "args".
    spec = {"args": ({0: tokens},)}
    example = (torch.randn(16, 4096),)
    cases = [(f"{n}", n, torch.randn(n, 4096)) for n in (1, 16, 64)]
    return model, merged, example, spec, cases


def peft_llama():
    from peft import LoraConfig, get_peft_model
    peft_model = get_peft_model(small_llama(), LoraConfig(**LLAMA_LORA)).eval()
    model = Logits(peft_model).eval()
    merged = Logits(copy.deepcopy(peft_model).merge_and_unload()).eval()
    spec = {"ids": {0: torch.export.Dim("batch", max=64), 1: torch.export.Dim("seq", max=127)}}
    example = (torch.randint(0, 128, (2, 16)),)
    cases = [(f"{b}x{s}", b * s, torch.randint(0, 128, (b, s))) for b, s in ((1, 16), (4, 64))]
    return model, merged, example, spec, cases


# ----------------------------------------------------------------------------- benchmark


def bench_workload(title, build, workdir, args, rows, notes):
    print(f"\n## {title}", flush=True)
    model, merged, example, spec, cases = build()

    start = time.perf_counter()
    art = stageml.compile(model, example, dynamic_shapes=spec)
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    mod = art.load(os.path.join(workdir, title.split()[0].lower(), "residual.vmfb"))
    load_s = time.perf_counter() - start
    print(f"StageML compile {compile_s:.1f} s (once, all shapes), save+load+adapter stage {load_s:.2f} s")
    print("\n".join("    " + line for line in str(art.report).splitlines()))

    compiled, compiled_info = try_torch_compile(merged, [x for _, _, x in cases])
    if compiled is None:
        print(f"torch.compile: n/a ({compiled_info})")
        notes.append(f"{title}: torch.compile n/a ({compiled_info})")
    else:
        print(f"torch.compile (merged) compiled all shapes in {compiled_info:.1f} s (not timed)")

    for label, tokens, x in cases:
        with torch.no_grad():
            ref = model(x).numpy()
            err = rel_err(mod(x), ref)
            err_merged = rel_err(merged(x).numpy(), ref)
            err_compiled = rel_err(compiled(x).numpy(), ref) if compiled is not None else None
        print(f"[{label}] rel. err vs eager PEFT: StageML {err:.1e}, eager merged {err_merged:.1e}"
              + (f", torch.compile merged {err_compiled:.1e}" if err_compiled is not None else ""), flush=True)
        if not err < MAX_REL_ERR:
            sys.exit(f"StageML's output differs from PyTorch's on {title} [{label}]: rel. err {err:.2e} "
                     f">= {MAX_REL_ERR:g}; not timing a wrong result")
        fns = {"stageml": lambda: mod(x)}
        with torch.no_grad():
            fns["eager"] = lambda: model(x)
            fns["merged"] = lambda: merged(x)
            if compiled is not None:
                fns["compiled"] = lambda: compiled(x)
            t, others = timed(fns, args, label)
        rows.append((title.split()[0], label, tokens, t, err, others))
        shown = "  ".join(f"{k} {v * 1e3:.2f} ms" for k, v in t.items())
        print(f"[{label}] {shown}; others used {fmt_pct(others)} of the CPUs", flush=True)


def fmt_ratio(t, base):
    return f"{t['stageml'] / t[base]:.2f}x" if base in t else "n/a"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_timing_options(parser)
    args = parser.parse_args()

    host = CpuTarget("host")
    start("StageML CPU benchmark", args, [f"IREE flags  {' '.join(host.flags())}",
                                          f"vector      {', '.join(host.describe()['features']) or 'baseline x86-64'}",
                                          f"mmt4d f32 tiles (max rows, M0, N0, K0)  {host.mmt4d_tiles('f32')}"])

    rows, notes = [], []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="stageml-bench-") as workdir:
        bench_workload("lora-linear 4096x4096 r=16", lora_linear, workdir, args, rows, notes)
        bench_workload("llama 2 layers hidden 128 r=8", peft_llama, workdir, args, rows, notes)

    print(f"\nloadavg     {loadavg()} (end); total {time.perf_counter() - started:.0f} s")
    print("\n## Results (ms: median per call; ratio = StageML time / baseline time, < 1 means StageML is faster)\n")
    print("| model | input | tokens | StageML ms | eager PEFT ms | eager merged ms | torch.compile merged ms "
          "| S/eager | S/merged | S/compiled | rel. err | others' CPU |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for model, label, tokens, t, err, others in rows:
        print(f"| {model} | {label} | {tokens} | {fmt_ms(t, 'stageml')} | {fmt_ms(t, 'eager')} | "
              f"{fmt_ms(t, 'merged')} | {fmt_ms(t, 'compiled')} | {fmt_ratio(t, 'eager')} | "
              f"{fmt_ratio(t, 'merged')} | {fmt_ratio(t, 'compiled')} | {err:.1e} | {fmt_pct(others)} |")
    for note in notes:
        print(f"\nnote: {note}")

    print("\n## Targets (lora-linear, StageML / eager merged)")
    for model, label, tokens, t, _, _ in rows:
        if model == "lora-linear" and tokens in TARGETS:
            ratio = t["stageml"] / t["merged"]
            print(f"  {tokens:>2} token(s): {ratio:.2f}x, target <= {TARGETS[tokens]:.1f}x: "
                  + verdict(ratio, TARGETS[tokens], at_least=False))


if __name__ == "__main__":
    main()
