"""The models the benchmarks time (a 4096x4096 linear layer, a stack of LoRA layers, a small Llama
and a small Mixtral), and the inputs an MoE check can trust."""

import torch
from torch import nn

LINEAR_LORA = dict(r=16, lora_alpha=32, target_modules=["fc"], init_lora_weights=False)
LLAMA_LORA = dict(r=8, target_modules=["q_proj", "v_proj", "o_proj", "gate_proj"], init_lora_weights=False)
EXPERT_LORA = dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                   target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])


class Linear(nn.Module):
    """nn.Linear(d, d, bias=False) as `fc`, the layer LoRA targets."""

    def __init__(self, d=4096):
        super().__init__()
        self.fc = nn.Linear(d, d, bias=False)

    def forward(self, x):
        return self.fc(x)


class Logits(nn.Module):
    """A causal LM whose forward(ids) returns the logits."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, ids):
        return self.m(input_ids=ids, use_cache=False).logits


def small_llama() -> nn.Module:
    """LlamaForCausalLM(vocab 128, hidden 128, intermediate 256, 2 layers, 4 heads, 2 KV heads)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(config).eval()


def small_mixtral() -> nn.Module:
    """MixtralForCausalLM(vocab 128, hidden 128, intermediate 256, 2 layers, 4 heads, 2 KV heads,
    8 experts, top-2)."""
    from transformers import MixtralConfig, MixtralForCausalLM
    config = MixtralConfig(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, num_local_experts=8,
                           num_experts_per_tok=2, max_position_embeddings=128, use_cache=False)
    return MixtralForCausalLM(config).eval()


def random_factors(peft_model: nn.Module, std: float = 0.05) -> nn.Module:
    """`peft_model` with every LoRA factor drawn from N(0, std^2) (PEFT starts B at zero)."""
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.normal_(0, std)
    return peft_model


def llama_tenants(names, seed: int) -> dict:
    """{name: small_llama() (the weights of seed 0) with its own PEFT LoRA (LLAMA_LORA), the
    factors random from seed + the name's index}."""
    from peft import LoraConfig, get_peft_model
    models = {}
    for i, name in enumerate(names):
        torch.manual_seed(0)
        base = small_llama()
        torch.manual_seed(seed + i)
        models[name] = random_factors(get_peft_model(base, LoraConfig(**LLAMA_LORA)), 0.3).eval()
    return models


def greedy(model, prompt: list, new: int, base: bool = False) -> list:
    """transformers' greedy `generate` of `new` tokens after `prompt` (a PEFT model's with its
    adapter disabled where `base`)."""
    import contextlib
    with torch.no_grad(), model.disable_adapter() if base else contextlib.nullcontext():
        out = model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=new, do_sample=False)
    return out[0, len(prompt):].tolist()


def served_llama(root, names, seed: int, max_seq: int, lengths: tuple, new: int) -> tuple:
    """A multi-tenant generation step of llama_tenants(names, seed) saved as root/llama.vmfb (4
    cache slots, 2 adapter slots), each adapter as a PEFT directory root/<name>, prompts of
    `lengths` drawn from `seed`, and each (prompt index, name or None)'s greedy reference of
    `new` tokens: (module path, prompts, references)."""
    import stageml
    models = llama_tenants(names, seed)
    for name, model in models.items():
        model.save_pretrained(root / name)
    art = stageml.compile(models[names[0]], generate=True, max_seq=max_seq, sequences=4, max_adapters=2, max_rank=8)
    path = art.save(str(root / "llama.vmfb"))
    generator = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 128, (n,), generator=generator).tolist() for n in lengths]
    expected = {(i, name): greedy(models[name or names[0]], p, new, base=name is None)
                for i, p in enumerate(prompts) for name in (None, *names)}
    return path, prompts, expected


def _normal(layers: int, shape: tuple, std: float) -> nn.ParameterList:
    return nn.ParameterList([nn.Parameter(nn.init.normal_(torch.empty(*shape), std=std)) for _ in range(layers)])


class LoraStack(nn.Module):
    """`layers` LoRA layers in sequence, each x@W + s*(x@A)@B with W [d, d]
    (input-major, as the residual reads it), A [d, r], B [r, d]: a stack so
    that the weights (layers * d * d elements) outgrow the GPU's L2 cache."""

    peft_layout = False  # A [r, d] and B [d, r], each used transposed (TenantStack)

    def __init__(self, layers=8, d=4096, r=16, scale=0.5):
        super().__init__()
        self.scale = scale
        self.weight = _normal(layers, (d, d), d ** -0.5)
        self.lora_A = _normal(layers, (r, d) if self.peft_layout else (d, r), d ** -0.5)
        self.lora_B = _normal(layers, (d, r) if self.peft_layout else (r, d), r ** -0.5)

    def _layers(self):
        """Each layer's (W, A [d, r], B [r, d])."""
        for w, a, b in zip(self.weight, self.lora_A, self.lora_B):
            yield (w, a.T, b.T) if self.peft_layout else (w, a, b)

    def forward(self, x):
        for w, a, b in self._layers():
            x = x @ w + self.scale * ((x @ a) @ b)
        return x

    def merged(self) -> list:
        """Each layer's W + s*A@B."""
        return [w + self.scale * (a @ b) for w, a, b in self._layers()]


class TenantStack(LoraStack):
    """LoraStack's layers in the form multi-tenant serving compiles: each
    x@W + s*(x@A^T)@B^T with W [d, d] input-major (nothing to fold) and A
    [r, d], B [d, r] in PEFT's layout (lora-sites finds them by their names)."""

    peft_layout = True


def decisively_routed(model: nn.Module, forward, shape: tuple, margin: float, tries: int):
    """Token ids of `shape` (below 128: the small models' vocabulary) and `forward(ids)` for them,
    drawn until, in every router of `model` that `forward` runs, every token's k-th router logit
    beats the next by `margin`. Near a tie,
    the expert a half-precision model picks is a rounding's choice (PyTorch's own fp16 and bf16
    runs differ from float64 there), and one token routed elsewhere moves the logits by more
    than any bound."""
    gaps = []
    routers = [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]
    hooks = [r.register_forward_hook(lambda m, args, out: gaps.append(
        (lambda z: z[..., m.top_k - 1] - z[..., m.top_k])(out[0].sort(-1, descending=True).values)))
        for r in routers]
    try:
        for _ in range(tries):
            gaps.clear()
            ids = torch.randint(0, 128, shape)
            with torch.no_grad():
                expected = forward(ids)
            if min(float(g.min()) for g in gaps) >= margin:
                return ids, expected
    finally:
        for hook in hooks:
            hook.remove()
    raise RuntimeError(f"no input of shape {shape} routed every token by a margin of {margin} in {tries} tries")
