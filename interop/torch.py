"""`stageml.torch`: a staged residual as a PyTorch module, and PEFT LoRA layers swapped for them.

    layer = stageml.torch.StagedModule("out/residual.vmfb")     # an nn.Module
    y = layer(x)                                                # torch in, torch out
    report = stageml.torch.replace_lora_layers(peft_model)      # each LoRA Linear, staged

`StagedModule.forward` calls the custom op `stageml::residual` (torch.library), so
the module works inside a larger program and under `torch.compile`, which sees one
opaque op: its fake (meta) implementation gives each output's shape from the
inputs' shapes as the export stated them (the manifest's `sizes`) and its dtype
from the manifest. Tensors on the residual's own kind of device cross without a
copy (DLPack); results come back as tensors on the inputs' device.
"""

import dataclasses
import os
import tempfile
import weakref

import torch

from stageml.errors import InputError, StageMLError
from stageml.runtime import ResidualModule, load

# the residuals StagedModules call, by the handle the op takes (an int: a custom op's arguments
# are tensors and scalars); each goes when its last module does
_RESIDUALS = weakref.WeakValueDictionary()


def _residual(handle: int) -> ResidualModule:
    residual = _RESIDUALS.get(handle)
    if residual is None:
        raise StageMLError(f"stageml::residual was called with handle {handle}, which names no loaded residual: "
                           "call it through a live StagedModule")
    return residual


@torch.library.custom_op("stageml::residual", mutates_args=())
def residual_op(handle: int, inputs: list[torch.Tensor], adapter: str | None) -> list[torch.Tensor]:
    """The residual of `handle` on `inputs`, with `adapter` (a multi-tenant residual's adapter
    name, None for the base model) for every row."""
    residual = _residual(handle)
    outputs = residual(*inputs) if adapter is None else residual(*inputs, adapter=adapter)
    return list(outputs) if isinstance(outputs, tuple) else [outputs]


@residual_op.register_fake
def _(handle: int, inputs: list[torch.Tensor], adapter: str | None) -> list[torch.Tensor]:
    residual = _residual(handle)
    shapes = residual.output_shapes([x.shape for x in inputs])
    device = inputs[0].device if inputs else torch.device("cpu")
    for output, shape in zip(residual.outputs, shapes):
        if shape is None:
            raise StageMLError(f"the residual's output {output['name']!r} has dimensions its export did not state "
                               "in terms of its inputs, so torch.compile cannot trace it: call it eagerly, or "
                               "export the model so each output's size follows from its inputs'")
    return [torch.empty(shape, dtype=getattr(torch, output["dtype"]), device=device)
            for output, shape in zip(residual.outputs, shapes)]


class StagedModule(torch.nn.Module):
    """A loaded residual as an nn.Module: `forward(*inputs)` is the custom op `stageml::residual`.

    Args:
      residual: a ResidualModule, or the path of a .vmfb (loaded with `**load_options`).
      adapter: for a multi-tenant residual, the adapter every row uses (None: the base model)."""

    def __init__(self, residual, adapter: str | None = None, **load_options):
        super().__init__()
        self.residual = residual if isinstance(residual, ResidualModule) else load(residual, **load_options)
        if not isinstance(self.residual, ResidualModule):
            raise InputError("this residual is a generation step, which its Generator drives (gen.generate): "
                             "wrap a residual compiled without generate=True")
        if adapter is not None and not hasattr(self.residual, "load_adapter"):
            raise InputError(f"adapter {adapter!r} was given for a residual compiled without adapter slots: "
                             "pass adapter=None, or compile with max_adapters")
        self.adapter = adapter
        self.handle = id(self.residual)
        _RESIDUALS[self.handle] = self.residual

    def forward(self, *inputs):
        for index, value in enumerate(inputs):
            if not isinstance(value, torch.Tensor):
                raise InputError(f"input {index} of a StagedModule is a {type(value).__name__}, not a tensor: "
                                 "pass torch tensors")
        outputs = torch.ops.stageml.residual(self.handle, list(inputs), self.adapter)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


class StagedLinear(torch.nn.Module):
    """A staged residual of one Linear layer ([rows, in] → [rows, out]) that takes any leading
    dimensions, as the layer it replaces did."""

    def __init__(self, staged: StagedModule, in_features: int, out_features: int):
        super().__init__()
        self.staged, self.in_features, self.out_features = staged, in_features, out_features

    def forward(self, x):
        return self.staged(x.reshape(-1, self.in_features)).reshape(*x.shape[:-1], self.out_features)


@dataclasses.dataclass
class Replacement:
    """What replace_lora_layers did: the layers it staged and those it left, with the reason."""
    replaced: list
    skipped: dict
    directory: str  # where their residuals are


def _skip_reason(layer) -> str | None:
    """Why a PEFT LoRA layer stays as it is, or None when it can be staged."""
    base = layer.get_base_layer()
    if not isinstance(base, torch.nn.Linear):
        return f"its base layer is a {type(base).__name__}: only LoRA on nn.Linear is staged"
    if getattr(layer, "merged", False):
        return "its adapter is merged into the base weight already: unmerge it, or leave the layer"
    active = [name for name in layer.active_adapters if name in layer.lora_A]
    if len(active) != 1:
        return f"it has {len(active)} active adapters: stage a layer with exactly one"
    if layer.use_dora.get(active[0], False):
        return "its adapter is DoRA, which StageML does not stage"
    return None


def replace_lora_layers(peft_model, directory: str | None = None, **compile_options) -> Replacement:
    """Compiles each PEFT LoRA Linear layer of `peft_model` (in eval mode) into a residual whose
    merged weight W + s·B·A is folded at compile time, and puts it in the layer's place
    (a StagedLinear). Layers that cannot be staged stay, each with its reason in the result.

    Args:
      peft_model: a PEFT model (or any module holding PEFT LoRA layers), in eval mode.
      directory: where the residuals are written (default: a new temporary directory).
      **compile_options: passed to stageml.compile (e.g. target="cpu")."""
    from peft.tuners.lora import LoraLayer

    import stageml

    if peft_model.training:
        raise InputError("the model is in training mode, where LoRA dropout is active and a staged layer would "
                         "differ: call model.eval() first")
    directory = directory or tempfile.mkdtemp(prefix="stageml-layers-")
    layers = [(name, module) for name, module in peft_model.named_modules() if isinstance(module, LoraLayer)]
    replaced, skipped = [], {}
    for name, layer in layers:
        reason = _skip_reason(layer)
        if reason is not None:
            skipped[name] = reason
            continue
        base = layer.get_base_layer()
        example = torch.randn(2, base.in_features, dtype=base.weight.dtype, device=base.weight.device)
        rows = torch.export.Dim("rows", min=1)
        art = stageml.compile(layer, (example,), dynamic_shapes=({0: rows},),
                              stages={"*lora_*": "static"}, **compile_options)
        path = art.save(os.path.join(directory, f"{name or 'layer'}.vmfb"))
        parent_name, _, child = name.rpartition(".")
        parent = peft_model.get_submodule(parent_name) if parent_name else peft_model
        setattr(parent, child, StagedLinear(StagedModule(path), base.in_features, base.out_features))
        replaced.append(name)
    return Replacement(replaced, skipped, directory)
