"""GPT-2's Conv1D layers in a form torch.export takes.

transformers' `Conv1D` (GPT-2, GPT-SW3, OpenAI GPT; a linear layer with its
weight stored [in, out]) flattens its input with `x.view(-1, in)`. With
dynamic batch and sequence dims torch.export cannot prove the attention's
output contiguous there and stops ("Cannot view a tensor with shape [s0, s1,
64] and strides (64, 64*s0, 1)"), although it always is when the model runs.
For the export, each Conv1D computes the same product as `x @ W + b` on x's
own dims (no view), which every later pass reads as a linear layer; PEFT's
LoRA around it (`fan_in_fan_out=True`) is an ordinary LoRA branch beside it.
"""

import torch

from stageml.compiler import forwards


def _linear(self, x):
    """Conv1D.forward without the view: x [..., in] @ weight [in, out] + bias."""
    return torch.matmul(x, self.weight) + self.bias


def staged(model):
    """A block within which `model`'s Conv1D layers run `_linear` (restored after)."""
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # (a transformers without it has no such layers)
        return forwards.replaced([], _linear)
    return forwards.replaced([m for m in model.modules() if isinstance(m, Conv1D)], _linear)
