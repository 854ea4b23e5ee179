"""The models the benchmarks time: a 4096x4096 linear layer and a small Llama."""

from torch import nn

LINEAR_LORA = dict(r=16, lora_alpha=32, target_modules=["fc"], init_lora_weights=False)
LLAMA_LORA = dict(r=8, target_modules=["q_proj", "v_proj", "o_proj", "gate_proj"], init_lora_weights=False)


class Linear4096(nn.Module):
    """nn.Linear(4096, 4096, bias=False) as `fc`, the layer LoRA targets."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4096, 4096, bias=False)

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
