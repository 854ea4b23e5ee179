"""The program StageML compiles for generation: one step of a causal LM over a KV cache in
fixed per-sequence slots, which the module keeps on the device.

    step(ids [B, T], slots [B], positions [B]) -> logits [B, T, V]

Row b's T tokens (a prompt, or one token of a decode step) sit at positions
positions[b] .. positions[b] + T - 1 of sequence slot slots[b]: each layer writes
their keys and values there (index_put into its cache buffers
[sequences·max_seq, kv_heads, head_dim]) and attends over that slot's cache,
masked to the positions up to each token's own. So prefill and decode are the
same program (T tokens or one), and rows of one batch may be at different
positions (continuous batching). The cache buffers are buffers the model
mutates: request-time state that resident-state keeps in device globals and
IREE updates in place, shared by every program of the module.

A step attends over all max_seq positions: attending over only the batch's
furthest position (a dynamic key length) gave wrong logits, as torch-mlir
lowers the attention's views of tensors with three dynamic dimensions (batch,
tokens, keys) as if all but one were 1 (llvm/torch-mlir#3852), and
collapse-views cannot tell which of them a view's sizes name.

Fixed slots, not paged blocks: a slot holds a whole sequence, so a step needs
no block table (one index per row), and the cache's size is fixed when
compiling (sequences x max_seq), which a module global needs anyway.
"""

import json
import os
import sys

import torch
from transformers import AttentionInterface

from stageml.errors import CompileError, ModelLoadError

INPUTS = ("ids", "slots", "positions")  # the step's inputs, in order (facts.GENERATION names their roles)


class SlotCache:
    """transformers' cache interface (`update`) over each layer's buffers of a Step: a buffer
    [sequences·max_seq, kv_heads, head_dim] holds slot s's position p at row s·max_seq + p."""

    def __init__(self, keys: dict, values: dict, slots, positions, max_seq: int):
        self.keys, self.values, self.slots, self.positions, self.max_seq = keys, values, slots, positions, max_seq

    def update(self, key_states, value_states, layer_idx: int, cache_kwargs=None):
        """Writes the rows' keys and values [B, heads, T, dim] at their slots and positions;
        returns each row's whole cache [B, heads, max_seq, dim].

        The write is one index per token into the buffer's rows, of the tokens' [B·T, heads,
        dim]: indexed by (slot, position) into [sequences, max_seq, heads, dim], a model with one
        KV head (multi-query attention) failed at run time for prompts of two tokens or more, as
        torch-mlir lowers that index_put of [B, T, 1, dim] values as if T were 1 too; and
        [B, T, heads·dim] values, a view of two dynamic dims, came out wrong (llvm/torch-mlir#3852)."""
        rows = (self.slots[:, None] * self.max_seq + self.positions).reshape(-1)
        sequences = self.keys[layer_idx].shape[0] // self.max_seq
        out = []
        for cache, states in ((self.keys[layer_idx], key_states), (self.values[layer_idx], value_states)):
            cache.index_put_((rows,), states.transpose(1, 2).reshape(-1, *cache.shape[1:]).to(cache.dtype))
            out.append(cache.view(sequences, self.max_seq, *cache.shape[1:])[self.slots].transpose(1, 2))
        return tuple(out)


def slot_attention(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0, **kwargs):
    """transformers' attention (as registered with AttentionInterface) over a slot cache's keys and
    values, each KV head shared by its query heads without copying it: query [B, H, T, D], key and
    value [B, KVH, S, D] (S = max_seq) -> [B, T, H, D].

    The model's own eager attention copies each KV head for every query head of its group and
    scales the keys, all over the S cache positions of every row (repeat_kv, torch's
    scaled-dot-product decomposition): most of a decode step's time (a 32-row step of the tiny
    Llama at max_seq 64 took 4.9 ms with it, 1.9 ms with this, on a 2-vCPU EPYC). Here each
    group's query heads meet their one KV head in one product ([B, KVH, G, T, D] by
    [B, KVH, S, D]), and the scale applies to the scores. Logit soft-capping (Gemma 2) and
    attention sinks (GPT-OSS) take the model's own eager attention."""
    if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
        eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward")
        return eager(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    rows, heads, tokens, dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    scores = torch.einsum("bkgtd,bksd->bkgts", query.view(rows, kv_heads, groups, tokens, dim), key) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, None]  # [B, 1, T, S] -> [B, 1, 1, T, S]
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.einsum("bkgts,bksd->btkgd", weights, value)
    return out.reshape(rows, tokens, heads, dim), None


SLOT_ATTENTION = "stageml_slots"
AttentionInterface.register(SLOT_ATTENTION, slot_attention)


class _CacheShapes:
    """A cache that records the [heads, dim] of the keys and of the values each layer writes."""

    def __init__(self):
        self.layers = {}

    def update(self, key_states, value_states, layer_idx: int, cache_kwargs=None):
        self.layers[layer_idx] = tuple((s.shape[1], s.shape[3]) for s in (key_states, value_states))
        return key_states, value_states


def cache_shapes(model) -> dict:
    """{layer: ((key heads, key dim), (value heads, value dim))} of the layers of `model` that
    cache keys and values, as one token through the model writes them (so multi-query attention,
    a config's own name for its KV heads, or keys and values of different widths need no rule)."""
    shapes, token = _CacheShapes(), torch.zeros(1, 1, dtype=torch.int64, device=next(model.parameters()).device)
    with torch.no_grad():
        _logits(model, token, token, shapes, 1)
    return shapes.layers


class Step(torch.nn.Module):
    """One generation step of `model` (a transformers causal LM, or a PEFT model of one)."""

    def __init__(self, model, sequences: int, max_seq: int):
        super().__init__()
        config = getattr(model, "config", None)
        if config is None or not hasattr(config, "num_hidden_layers"):
            raise CompileError(f"generate=True needs a transformers causal LM (or a PEFT model of one), not a "
                               f"{type(model).__name__}: pass e.g. AutoModelForCausalLM.from_config(...)")
        try:
            shapes = cache_shapes(model)
        except (AttributeError, TypeError) as e:  # a cache method or argument SlotCache does not have
            raise CompileError(f"generate=True cannot drive {type(model).__name__}'s cache ({type(e).__name__}: "
                               f"{str(e).splitlines()[0]}): compile its forward without generate=True") from None
        dtype = next(model.parameters()).dtype
        self.model, self.layers, self.max_seq = model, sorted(shapes), max_seq
        self.cache = torch.nn.Module()  # buffers cache.k0, cache.v0, ...
        for layer, kinds in shapes.items():
            for kind, (heads, dim) in zip("kv", kinds):
                self.cache.register_buffer(f"{kind}{layer}", torch.zeros(sequences * max_seq, heads, dim, dtype=dtype))

    def forward(self, ids, slots, positions):
        at = positions[:, None] + torch.arange(ids.shape[1], device=ids.device)[None, :]
        cache = SlotCache({layer: getattr(self.cache, f"k{layer}") for layer in self.layers},
                          {layer: getattr(self.cache, f"v{layer}") for layer in self.layers}, slots, at, self.max_seq)
        return _logits(self.model, ids, at, cache, self.max_seq)


def _logits(model, ids, at, cache, keys: int):
    """`model`'s logits for tokens `ids` at positions `at` (both [B, T]) over `cache` of `keys`
    positions per row, each token attending to the positions up to its own (slot_attention)."""
    hidden = torch.arange(keys, device=ids.device)[None, None, None, :] > at[:, None, :, None]  # [B, 1, T, keys]
    dtype = next(model.parameters()).dtype
    mask = torch.zeros(hidden.shape, dtype=dtype, device=ids.device).masked_fill(hidden, torch.finfo(dtype).min)
    config = model.config
    chosen = config._attn_implementation
    config._attn_implementation = SLOT_ATTENTION  # (and its sub-configs') for this call only
    try:
        return model(input_ids=ids, position_ids=at, attention_mask=mask, past_key_values=cache, use_cache=True).logits
    finally:
        config._attn_implementation = chosen


def pretrained(directory: str, lora_config: str | None = None):
    """The causal LM of a transformers `save_pretrained` directory (config.json and safetensors,
    nothing downloaded, no remote code), with the LoRA sites of the PEFT adapter directory
    `lora_config` (its adapter_config.json; its weights, where the directory has them, as the
    model's own adapter)."""
    from transformers import AutoModelForCausalLM

    if not os.path.isfile(os.path.join(directory, "config.json")):
        raise ModelLoadError(f"{directory!r} has no config.json: pass a transformers save_pretrained directory")
    try:
        model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True, use_safetensors=True,
                                                     trust_remote_code=False).eval()
    except (OSError, ValueError, KeyError) as e:
        raise ModelLoadError(f"{directory!r} does not load as a causal LM ({str(e).strip().splitlines()[0]}): "
                             "pass a save_pretrained directory with safetensors weights") from None
    if lora_config is None:
        return model
    from peft import LoraConfig, PeftModel, get_peft_model

    config_file = os.path.join(lora_config, "adapter_config.json")
    try:
        with open(config_file) as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"--lora-config {lora_config!r}: {config_file!r} does not read as JSON ({e}): "
                             "pass a PEFT save_pretrained directory") from None
    if config.get("peft_type") != "LORA":
        raise ModelLoadError(f"--lora-config {lora_config!r} is a {config.get('peft_type')!r} adapter: pass a LoRA one")
    if any(os.path.isfile(os.path.join(lora_config, f)) for f in ("adapter_model.safetensors",)):
        return PeftModel.from_pretrained(model, lora_config).eval()
    return get_peft_model(model, LoraConfig.from_pretrained(lora_config)).eval()


def end_tokens(model) -> list:
    """The token ids that end a sequence (the model's generation config, else its config), as a list."""
    for config in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        eos = getattr(config, "eos_token_id", None)
        if eos is not None:
            return [int(t) for t in (eos if isinstance(eos, (list, tuple)) else [eos])]
    return []


def step_program(model, sequences: int, max_seq: int) -> tuple:
    """(the Step of `model`, example inputs, dynamic shapes) for stageml.compile."""
    step = Step(model, sequences, max_seq).eval()
    rows = torch.export.Dim("rows", min=1, max=sequences)
    tokens = torch.export.Dim("tokens", min=1, max=max_seq)
    example = (torch.zeros(2, 3, dtype=torch.int64), torch.tensor([0, 1]), torch.tensor([0, 0]))
    return step, example, {"ids": {0: rows, 1: tokens}, "slots": {0: rows}, "positions": {0: rows}}
