"""Compiles the artifacts the H200 run checks and times (run here, not there).

    .venv/bin/python benchmarks/gpu/prepare.py [OUT_DIR]     # default out/gpu; about 5 minutes

The GPU machine has the IREE runtime but no compiler, so every residual is
compiled here; h200.py checks and times them there. Written to OUT_DIR:
  stack-{f16,bf16}-{merged,factorized}-{sm90,cuda}.vmfb/.json
      workloads.LoraStack(8 layers, d=4096, r=16): merged (one product per
      layer) and unmerged (--no-lora-merge: the fused LoRA kernel), for
      StageML's Hopper pipeline and IREE's generic CUDA code. Their weights
      (512 MiB a stack) stay out of the files: nothing is folded at compile
      time (checked), so the parameter archive holds the model's own weights
      and h200.py writes it there from a freshly seeded model.
  llama-f16-sm90.vmfb/.json/.irpa, llama-f16-cuda.*, llama.pt
      workloads.small_llama() with workloads.LLAMA_LORA (PEFT), fp16; llama.pt
      holds its state dict for the PyTorch reference.
  llama-tenants-f16-sm90.* and adapters/t{0,1,2}/
      the same Llama for 4 tenants (max_adapters=4) and three PEFT adapters.
  linear-tenants-f16-sm90.*, linear.pt and adapters/l{0..7}/
      a PEFT LoRA nn.Linear(1024, 1024) (workloads.LINEAR_LORA) for 8 tenants,
      fed one token per row: its per-row products are the BGMV kernel's.
  linear-tenants-tokens-f16-sm90.*
      the same for rows of several tokens ([rows, tokens, 1024]): the site's
      kernels on the rows' tokens.
  stack-tenants-{f16,bf16}-sm90.vmfb/.json
      workloads.TenantStack(8 layers, d=4096, r=16) for 32 tenants
      (max_adapters=32, max_rank=16), its archive rebuilt there like the
      stacks': the multi-tenant request path peer.py sets against vLLM.
  stack-tenants-{f16,bf16}-sm90-decode.vmfb/.json
      the same exported for at most 128 rows (a decode residual): each LoRA
      site is one kernel (stageml_gemm_lora), 9 dispatches a call, not 17.
  stack-tenants-f16-sm90-rows32.vmfb/.json
      the f16 one for exactly 32 rows (no dynamic dimension): call_path.py
      times IREE's reuse of a call's command buffer on it.
  mixtral-f16-{sm90,cuda}.*, mixtral.pt, mixtral-tenants-f16-sm90.* and adapters/m{0,1}/
      workloads.small_mixtral() with workloads.EXPERT_LORA (PEFT, expert LoRA
      through target_parameters, random factors), fp16, for each GPU target;
      the same for 2 tenants on sm90 and two more such adapters: moe.py's.
  vllm_peer/       vLLM 0.33's Triton LoRA ops (lora_shrink, lora_expand and
      the three modules they share), taken from the vllm==0.33.0 wheel
      (pip download --no-deps) and set beside vllm_stubs/'s stand-ins for
      the vLLM modules they import: peer.py's peer. Never committed.
  stageml_sm90.ptx the kernels (as embedded), for kernel_check.py
  stream_floor.cubin stream_floor.cu (its probes and kernels.cu) as sm_90a code, for
      stream_floor.py: what streaming a weight costs under the kernels' timer.
  artifacts.json   what each artifact is, and the irpa keys of the stacks.
"""

import json
import os
import shutil
import subprocess
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import stageml  # noqa: E402
from stageml.compiler.sm90 import build  # noqa: E402
from workloads import (EXPERT_LORA, LINEAR_LORA, LLAMA_LORA, Linear, Logits, LoraStack, TenantStack,  # noqa: E402
                       random_factors, small_llama, small_mixtral)

TOKENS = torch.export.Dim("tokens", min=1, max=4096)
STACK = dict(layers=8, d=4096, r=16)
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}


def stack_artifacts(out: str) -> list:
    entries = []
    for tag, dtype in DTYPES.items():
        torch.manual_seed(0)
        model = LoraStack(**STACK).to(dtype).eval()
        x = torch.randn(2, STACK["d"], dtype=dtype)
        for form in ("merged", "factorized"):
            for target in ("sm90", "cuda"):
                name = f"stack-{tag}-{form}-{target}"
                art = stageml.compile(model, (x,), dynamic_shapes={"x": {0: TOKENS}}, target=target,
                                      merge_lora=form == "merged", verbose=True)
                if art.report.folded_values:
                    raise SystemExit(f"{name}: {art.report.folded_values} values were folded; "
                                     "h200.py rebuilds the archive from the model's weights only")
                vmfb = art.save(os.path.join(out, name + ".vmfb"))
                os.remove(vmfb[:-5] + ".irpa")  # rebuilt on the GPU machine
                keys = {**{k: k for k in art.parameters},
                        **{"default_adapter/" + k: k for k in art.default_adapter}}
                entries.append(dict(name=name, workload="stack", dtype=tag, form=form, target=target,
                                    irpa=keys, kernels=art.report.custom_kernels))
                print(name, art.report.custom_kernels, flush=True)
        del model
    return entries


def llama_artifacts(out: str) -> list:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = Logits(get_peft_model(small_llama(), LoraConfig(**LLAMA_LORA))).half().eval()
    torch.save(model.state_dict(), os.path.join(out, "llama.pt"))
    ids = torch.randint(0, 128, (2, 16))
    dims = {"ids": {0: torch.export.Dim("batch", min=1, max=64), 1: torch.export.Dim("seq", min=2, max=128)}}
    entries = []
    for target in ("sm90", "cuda"):
        art = stageml.compile(model, (ids,), dynamic_shapes=dims, target=target, verbose=True)
        art.save(os.path.join(out, f"llama-f16-{target}.vmfb"))
        entries.append(dict(name=f"llama-f16-{target}", workload="llama", dtype="f16", target=target,
                            kernels=art.report.custom_kernels))
    art = stageml.compile(model, (ids,), dynamic_shapes=dims, target="sm90", max_adapters=4, max_rank=8,
                          verbose=True)
    art.save(os.path.join(out, "llama-tenants-f16-sm90.vmfb"))
    entries.append(dict(name="llama-tenants-f16-sm90", workload="llama-tenants", dtype="f16", target="sm90",
                        kernels=art.report.custom_kernels))
    for i in range(3):
        torch.manual_seed(100 + i)
        tenant = get_peft_model(small_llama(), LoraConfig(**{**LLAMA_LORA, "r": 8 - 2 * i})).half()
        tenant.save_pretrained(os.path.join(out, "adapters", f"t{i}"))
    return entries


def linear_tenants(out: str) -> list:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = get_peft_model(Linear(1024), LoraConfig(**LINEAR_LORA)).half().eval()
    torch.save(model.state_dict(), os.path.join(out, "linear.pt"))
    art = stageml.compile(model, (torch.randn(4, 1024).half(),), dynamic_shapes=({0: torch.export.Dim("rows", max=256)},),
                          target="sm90", max_adapters=8, max_rank=16, verbose=True)
    art.save(os.path.join(out, "linear-tenants-f16-sm90.vmfb"))
    dims = ({0: torch.export.Dim("rows", max=64), 1: torch.export.Dim("tokens", max=128)},)
    tokens = stageml.compile(model, (torch.randn(4, 6, 1024).half(),), dynamic_shapes=dims, target="sm90",
                             max_adapters=8, max_rank=16, verbose=True)
    tokens.save(os.path.join(out, "linear-tenants-tokens-f16-sm90.vmfb"))
    for i in range(8):
        torch.manual_seed(200 + i)
        get_peft_model(Linear(1024), LoraConfig(**LINEAR_LORA)).half().save_pretrained(
            os.path.join(out, "adapters", f"l{i}"))
    return [dict(name="linear-tenants-f16-sm90", workload="linear-tenants", dtype="f16", target="sm90",
                 kernels=art.report.custom_kernels),
            dict(name="linear-tenants-tokens-f16-sm90", workload="linear-tenants", dtype="f16", target="sm90",
                 kernels=tokens.report.custom_kernels)]


def moe_artifacts(out: str) -> list:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = Logits(random_factors(get_peft_model(small_mixtral(), LoraConfig(**EXPERT_LORA)))).half().eval()
    torch.save(model.state_dict(), os.path.join(out, "mixtral.pt"))
    ids = torch.randint(0, 128, (2, 8))
    dims = {"ids": {0: torch.export.Dim("batch", min=1, max=8), 1: torch.export.Dim("seq", min=2, max=64)}}
    entries = []
    for target, tenants in (("sm90", None), ("cuda", None), ("sm90", 2)):
        name = f"mixtral{'-tenants' if tenants else ''}-f16-{target}"
        art = stageml.compile(model, (ids,), dynamic_shapes=dims, target=target, verbose=True,
                              **(dict(max_adapters=tenants, max_rank=EXPERT_LORA["r"]) if tenants else {}))
        art.save(os.path.join(out, name + ".vmfb"))
        entries.append(dict(name=name, workload="mixtral", dtype="f16", target=target,
                            kernels=art.report.custom_kernels))
    for i in range(2):
        torch.manual_seed(300 + i)
        random_factors(get_peft_model(small_mixtral(), LoraConfig(**EXPERT_LORA))).half().save_pretrained(
            os.path.join(out, "adapters", f"m{i}"))
    return entries


VLLM = "vllm==0.33.0"
VLLM_OPS = ("lora_shrink_op", "lora_expand_op", "kernel_utils", "utils", "lora_kernel_metadata")


def tenant_stack_artifacts(out: str) -> list:
    entries = []
    decode = torch.export.Dim("rows", min=1, max=128)
    for tag, form, rows in (("f16", "", TOKENS), ("bf16", "", TOKENS), ("f16", "-rows32", 32),
                            ("f16", "-decode", decode), ("bf16", "-decode", decode)):
        torch.manual_seed(0)
        model = TenantStack(**STACK).to(DTYPES[tag]).eval()
        name = f"stack-tenants-{tag}-sm90{form}"
        example = torch.randn(rows if isinstance(rows, int) else 2, STACK["d"], dtype=DTYPES[tag])
        art = stageml.compile(model, (example,), dynamic_shapes=None if isinstance(rows, int) else {"x": {0: rows}},
                              target="sm90", max_adapters=32, max_rank=STACK["r"], verbose=True)
        if art.report.folded_values:
            raise SystemExit(f"{name}: {art.report.folded_values} values were folded; "
                             "peer.py rebuilds the archive from the model's weights only")
        vmfb = art.save(os.path.join(out, name + ".vmfb"))
        os.remove(vmfb[:-5] + ".irpa")  # rebuilt on the GPU machine
        entries.append(dict(name=name, workload="tenant-stack", dtype=tag, target="sm90",
                            irpa={k: k for k in art.parameters}, kernels=art.report.custom_kernels))
        del model
    return entries


def vllm_peer(out: str) -> None:
    """vLLM's Triton LoRA ops from its wheel, beside the stubs, in OUT/vllm_peer."""
    import subprocess
    import tempfile
    import zipfile

    peer = os.path.join(out, "vllm_peer")
    shutil.rmtree(peer, ignore_errors=True)
    shutil.copytree(os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_stubs"), peer)
    with tempfile.TemporaryDirectory() as wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", VLLM, "-d", wheels], check=True)
        wheel = next(os.path.join(wheels, w) for w in os.listdir(wheels) if w.endswith(".whl"))
        with zipfile.ZipFile(wheel) as archive:
            for op in VLLM_OPS:
                archive.extract(f"vllm/lora/ops/triton_ops/{op}.py", peer)


def stream_floor(out: str) -> None:
    """stream_floor.cu built as OUT/stream_floor.cubin (sm_90a code: its probes need no PTX JIT)."""
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stream_floor.cu")
    subprocess.run([build.nvcc() or "nvcc", "-cubin", "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-std=c++17",
                    "-o", os.path.join(out, "stream_floor.cubin"), source], check=True)


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join("out", "gpu")
    os.makedirs(out, exist_ok=True)
    warnings.simplefilter("ignore")
    entries = (llama_artifacts(out) + linear_tenants(out) + stack_artifacts(out) + tenant_stack_artifacts(out)
               + moe_artifacts(out))
    vllm_peer(out)
    shutil.copy(build.build() / build.PTX, out)
    stream_floor(out)
    with open(os.path.join(out, "artifacts.json"), "w") as f:
        json.dump(entries, f, indent=1)
    print(f"wrote {len(entries)} artifacts to {out}")


if __name__ == "__main__":
    main()
