"""make demo: a small PEFT-LoRA Llama, compiled by stagemlc and run.

    1. build a 2-layer LlamaForCausalLM with a random LoRA (r=8) from a config
    2. export it with dynamic batch and sequence dims, torch.export.save
    3. stagemlc model.pt2 -o out/residual.vmfb     (static work folded now)
    4. stageml.load(...) and compare with PyTorch at two shapes
    5. the same model with --max-adapters: two PEFT adapters in one mixed batch
"""

import os
import subprocess
import sys
import warnings

import torch
from torch.export import Dim

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from models import peft_llama, rel_err  # noqa: E402

import stageml  # noqa: E402

warnings.simplefilter("ignore")
OUT = "out/demo"
os.makedirs(OUT, exist_ok=True)

model = peft_llama(hidden=128)
program = torch.export.export(model, (torch.randint(0, 128, (2, 7)),), strict=False,
                              dynamic_shapes=({0: Dim("batch", max=64), 1: Dim("seq", max=127)},))
torch.export.save(program, f"{OUT}/llama.pt2")
print(f"$ stagemlc {OUT}/llama.pt2 -o {OUT}/residual.vmfb", flush=True)
subprocess.run([sys.executable, "-m", "stageml.tools.stagemlc", f"{OUT}/llama.pt2",
                "-o", f"{OUT}/residual.vmfb"], check=True)

mod = stageml.load(f"{OUT}/residual.vmfb")
for shape in [(1, 5), (3, 17)]:
    ids = torch.randint(0, 128, shape)
    with torch.no_grad():
        expected = model(ids)
    print(f"tokens {shape}: logits {tuple(expected.shape)}, rel. error vs PyTorch {rel_err(mod(ids), expected):.1e}")

# Multi-tenant: the same model compiled with adapter slots; two more PEFT
# adapters, saved with save_pretrained, served in one mixed batch.
import copy  # noqa: E402

from peft import LoraConfig, get_peft_model  # noqa: E402

print(f"$ stagemlc {OUT}/llama.pt2 -o {OUT}/tenants.vmfb --max-adapters 4 --max-rank 8", flush=True)
subprocess.run([sys.executable, "-m", "stageml.tools.stagemlc", f"{OUT}/llama.pt2", "-o", f"{OUT}/tenants.vmfb",
                "--max-adapters", "4", "--max-rank", "8", "-q"], check=True)
base = copy.deepcopy(model.m).unload()  # the Llama without its LoRA layers
tenants = {}
for seed, rank in ((1, 8), (2, 4)):
    torch.manual_seed(seed)
    peft = get_peft_model(copy.deepcopy(base), LoraConfig(r=rank, target_modules=["q_proj", "v_proj"],
                                                          init_lora_weights=False)).eval()
    peft.save_pretrained(f"{OUT}/adapter-{seed}")
    tenants[f"tenant-{seed}"] = (f"{OUT}/adapter-{seed}", peft)
mod = stageml.load(f"{OUT}/tenants.vmfb")
for name, (path, _) in tenants.items():
    mod.load_adapter(name, path)
names = ["tenant-1", "tenant-2", None, "tenant-1"]
ids = torch.randint(0, 128, (len(names), 9))
rows = mod.run_batch(ids, names)
for i, name in enumerate(names):
    with torch.no_grad():
        if name is None:
            with tenants["tenant-1"][1].disable_adapter():
                expected = tenants["tenant-1"][1](input_ids=ids[i:i + 1]).logits
        else:
            expected = tenants[name][1](input_ids=ids[i:i + 1]).logits
    print(f"row {i} ({name or 'base model'}): rel. error vs PEFT {rel_err(rows[i:i + 1], expected):.1e}")
print("stats:", {n: (s["form"], s["bytes_held"]) for n, s in mod.stats()["adapters"].items()})
