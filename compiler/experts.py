"""The experts implementation StageML exports MoE models with.

transformers 5.x MoE experts hold fused 3-D stacks (`gate_up_proj [E, 2I, H]`,
`down_proj [E, H, I]`; GPT-OSS transposed and biased) and pick their forward
by `config._experts_implementation`. None of transformers' own forms suits a
staging compiler: `eager` loops over the experts hit (data-dependent),
`grouped_mm` counts tokens with `histc`, `batched_mm` multiplies the weight
first. `staged_experts` says the same thing as batched_mm in the form the
compiler stages: each (token, choice) row gathers its expert's matrix from the
stack by the routed id and multiplies it, x @ W_e with W_e as [in, out]:

    rows = x.repeat_interleave(k, 0)                   # [T·k, H]
    W_t = gate_up_proj.transpose(1, 2)                 # [E, H, 2I]: static layout, folded
    up = bmm(rows[:, None], W_t.index_select(0, ids))  # the gathered stack is never
                                                       # copied: fuse-gathers reads it in place
so routing stays a request-time value, the stacks earlier-stage values, and
every shape static in E and k.
"""

import contextlib

import torch

NAME = "stageml"


def _product(rows, stack, ids, transposed: bool, bias=None):
    """rows[s] @ stack[ids[s]] (+ bias[ids[s]]), the stack read as [E, in, out]."""
    weights = stack if transposed else stack.transpose(1, 2)
    out = torch.bmm(rows.unsqueeze(1), weights.index_select(0, ids)).squeeze(1)
    return out if bias is None else out + bias.index_select(0, ids)


def staged_experts(self, hidden_states, top_k_index, top_k_weights):
    """An experts forward (transformers' ExpertsInterface signature) with per-row expert gathers."""
    tokens, hidden = hidden_states.shape
    k = top_k_index.shape[-1]
    rows = hidden_states.unsqueeze(1).expand(tokens, k, hidden).reshape(tokens * k, hidden)
    ids = top_k_index.reshape(-1)
    bias = (lambda name: getattr(self, name)) if self.has_bias else (lambda name: None)
    if self.has_gate:
        up = _product(rows, self.gate_up_proj, ids, self.is_transposed, bias("gate_up_proj_bias"))
        up = self._apply_gate(up)
    else:
        up = self.act_fn(_product(rows, self.up_proj, ids, self.is_transposed, bias("up_proj_bias")))
    out = _product(up, self.down_proj, ids, self.is_transposed, bias("down_proj_bias"))
    if self.has_post_expert_norm:
        out = self.post_expert_norm(out)
    out = out * top_k_weights.reshape(-1, 1).to(out.dtype)
    return out.view(tokens, k, hidden).sum(dim=1).to(hidden_states.dtype)


def _configs(model) -> list:
    """The distinct configs of `model`'s experts modules that choose an experts implementation."""
    found = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_experts_implementation") and hasattr(module, "has_gate"):
            found[id(config)] = config
    return list(found.values())


@contextlib.contextmanager
def staged(model):
    """Within the block, `model`'s MoE experts run `staged_experts` (restored after)."""
    configs = _configs(model)
    if not configs:
        yield
        return
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    ALL_EXPERTS_FUNCTIONS.register(NAME, staged_experts)
    before = [config._experts_implementation for config in configs]
    for config in configs:
        config._experts_implementation = NAME
    try:
        yield
    finally:
        for config, value in zip(configs, before):
            config._experts_implementation = value
