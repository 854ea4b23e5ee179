"""make demo: a small PEFT-LoRA Llama, compiled by stagemlc and run.

    1. build a 2-layer LlamaForCausalLM with a random LoRA (r=8) from a config
    2. export it with dynamic batch and sequence dims, torch.export.save
    3. stagemlc model.pt2 -o out/residual.vmfb     (static work folded now)
    4. stageml.load(...) and compare with PyTorch at two shapes
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
