"""Small models the tests compile, built from configs with random weights."""

import numpy as np
import torch


class MLP(torch.nn.Module):
    """A 2-layer MLP: every weight static."""

    def __init__(self, d_in=32, d_hidden=64, d_out=16):
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, d_hidden)
        self.fc2 = torch.nn.Linear(d_hidden, d_out)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class LoraLinear(torch.nn.Module):
    """loralib's form: x @ W.T + s * (x @ A.T) @ B.T, factors named like PEFT's."""

    def __init__(self, d_in=48, d_out=40, rank=4, scale=2.0):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(d_out, d_in) / d_in**0.5)
        self.lora_A = torch.nn.Parameter(torch.randn(rank, d_in) / d_in**0.5)
        self.lora_B = torch.nn.Parameter(torch.randn(d_out, rank) / rank**0.5)
        self.scale = scale

    def forward(self, x):
        return x @ self.weight.T + self.scale * (x @ self.lora_A.T) @ self.lora_B.T


class CausalLM(torch.nn.Module):
    """Wraps a (PEFT) causal LM so that forward(ids) returns the logits."""

    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, ids):
        return self.m(input_ids=ids, use_cache=False).logits


def peft_llama(hidden=64, vocab=128, seed=0) -> torch.nn.Module:
    """A 2-layer LlamaForCausalLM with a random PEFT LoRA (r=8) on top."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128)
    model = get_peft_model(LlamaForCausalLM(config).eval(), LoraConfig(
        r=8, target_modules=["q_proj", "v_proj", "o_proj", "gate_proj"], init_lora_weights=False))
    return CausalLM(model).eval()


def rel_err(actual, expected) -> float:
    """||actual - expected|| / ||expected||, in float64 (inputs: torch or numpy, bfloat16 too)."""
    def as_f64(v):
        return v.detach().double() if torch.is_tensor(v) else torch.from_numpy(np.asarray(v, dtype=np.float64))
    actual, expected = as_f64(actual), as_f64(expected)
    return float((actual - expected).norm() / expected.norm())


def submissions(art, symbol: str) -> int:
    """The queue submissions a call of entry point `symbol` makes: the execution regions
    (stream.cmd.execute) of the residual's IREE input lowered to IREE's stream dialect with
    the flags the residual was compiled with."""
    from iree import compiler as iree_compiler
    from iree.compiler import ir

    backend = {"local-task": "llvm-cpu", "cuda": "cuda"}[art.target["device"]]
    text = iree_compiler.compile_str(art.mlir["iree"], target_backends=[backend],
                                     extra_args=[*art.report.iree_flags, "--compile-to=stream"])
    regions = []

    def visit(op):
        if op.name == "util.func" and ir.StringAttr(op.attributes["sym_name"]).value == symbol:
            op.walk(lambda inner: regions.append(inner.name == "stream.cmd.execute") or ir.WalkResult.ADVANCE)
            return ir.WalkResult.SKIP
        return ir.WalkResult.ADVANCE

    with ir.Context():
        ir.Module.parse(text).operation.walk(visit)
    return sum(regions)
