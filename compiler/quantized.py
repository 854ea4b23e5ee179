"""torchao's int8 weight-only linear layers in a form every later pass reads.

A base model quantized with `torchao.quantization.quantize_(model,
Int8WeightOnlyConfig())` holds each Linear's weight as an `Int8Tensor`:
`qdata` [out, in] int8 and a per-row (per output channel) `scale` [out, 1].
Its linear computes

    y = mm(x.reshape(-1, in), qdata.t().to(x.dtype)) * scale.to(x.dtype).flatten()
    y = y.reshape(*x.shape[:-1], out) (+ bias)

For the export each such layer computes the same product on x's own dims (no
reshape, which with dynamic dims leaves sizes no later pass can match to x's):

    y = matmul(x, qdata.t().to(x.dtype)) * scale.to(x.dtype).flatten() (+ bias)

so that bt-improve and lora-sites read `x @ dequant(W)` with a scale per
output column (a linear form), and defer-dequant can keep `qdata` int8 in the
residual. PEFT's LoRA around such a layer (its `TorchaoLoraLinear`) is an
ordinary LoRA branch beside it. Other torchao layouts (dynamic activation
quantization, per-group scales) export as torchao writes them.
"""

import sys

import torch

from stageml.compiler import forwards


def _weight_only_int8(weight) -> bool:
    """Whether `weight` is a torchao Int8Tensor of int8 weight-only, per-row quantization."""
    torchao = sys.modules.get("torchao.quantization")  # a model holding its tensors imported it
    return (torchao is not None and isinstance(weight, torchao.Int8Tensor) and weight.qdata.dim() == 2
            and weight.act_quant_kwargs is None and weight.act_pre_scale is None
            and list(weight.block_size) == [1, weight.qdata.shape[1]])


def _linear(self, x):
    """torchao's weight-only int8 linear on x's own dims."""
    w = self.weight
    y = torch.matmul(x, w.qdata.t().to(x.dtype)) * w.scale.to(x.dtype).flatten()
    return y if self.bias is None else y + self.bias


def staged(model):
    """A block within which `model`'s int8 weight-only Linear layers run `_linear` (restored after)."""
    return forwards.replaced([m for m in model.modules()
                              if isinstance(m, torch.nn.Linear) and _weight_only_int8(m.weight)], _linear)
