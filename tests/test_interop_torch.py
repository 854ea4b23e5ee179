"""stageml.torch: a residual as an nn.Module over the custom op stageml::residual (eager, in a
larger program, under torch.compile), and PEFT LoRA layers swapped for staged ones, each
against PyTorch on fresh random inputs (the seed is printed)."""

import copy

import pytest
import torch
from torch.export import Dim

import stageml
from models import rel_err
from stageml.errors import InputError
from stageml.interop.torch import StagedModule, residual_op


def test_stageml_torch_imports_as_a_module():
    """`stageml.torch` is interop/torch.py by attribute and by import statement alike."""
    from stageml.torch import StagedModule as imported

    import stageml.torch as module
    assert imported is StagedModule and module is stageml.torch and module.residual_op is residual_op


def _seeded() -> int:
    seed = torch.seed()
    print(f"seed {seed}")
    return seed


class Block(torch.nn.Module):
    """Two outputs whose sizes follow from x's ([b, s, 16] → [b·s, 8] and [b, s])."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 8)

    def forward(self, x):
        return torch.relu(self.fc(x)).flatten(0, 1), x.sum(-1)


@pytest.fixture(scope="module")
def block(tmp_path_factory):
    torch.manual_seed(0)
    model = Block().eval()
    art = stageml.compile(model, (torch.randn(2, 3, 16),), dynamic_shapes=({0: Dim("b", max=16), 1: Dim("s", max=32)},))
    return model, StagedModule(art.save(str(tmp_path_factory.mktemp("block") / "block.vmfb")))


def test_staged_module_matches_pytorch_at_two_shapes(block):
    _seeded()
    model, staged = block
    for shape in [(1, 1, 16), (5, 7, 16)]:
        x = torch.randn(shape)
        for got, expected in zip(staged(x), model(x)):
            assert got.shape == expected.shape and got.dtype == expected.dtype
            assert rel_err(got, expected) <= 1e-5, shape


def test_fake_implementation_agrees_with_the_residual(block):
    """torch.library.opcheck: the op's schema, its fake (meta) shapes and dtypes against a real call."""
    _seeded()
    _, staged = block
    torch.library.opcheck(residual_op, (staged.handle, [torch.randn(3, 4, 16)], None))


def test_staged_module_inside_a_compiled_program(block):
    """One graph around the op (fullgraph), dynamic batch and sequence, against eager PyTorch."""
    _seeded()
    model, staged = block

    def program(module):
        def run(x):
            y, s = module(x * 2.0)
            return y.sum(-1) + s.flatten()
        return run

    compiled = torch.compile(program(staged), fullgraph=True, dynamic=True)
    for shape in [(2, 3, 16), (4, 9, 16)]:
        x = torch.randn(shape)
        assert rel_err(compiled(x), program(model)(x)) <= 1e-5, shape


def test_staged_module_refuses_what_it_cannot_call(block):
    _, staged = block
    with pytest.raises(InputError, match="not a tensor"):
        staged([1.0])
    with pytest.raises(InputError, match="compiled without adapter slots"):
        StagedModule(staged.residual, adapter="a")


def _peft_model(seed: int):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    base = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8),
                               torch.nn.Embedding(10, 8))
    config = LoraConfig(r=4, target_modules=["0", "2", "3"], init_lora_weights=False)
    return get_peft_model(base, config).eval()


def test_replace_lora_layers_keeps_the_outputs(tmp_path):
    """Each LoRA Linear becomes a staged residual with its merged weight folded at compile time
    (no adapter stage left); the LoRA Embedding stays, with its reason; the model's outputs are
    unchanged, eagerly and under torch.compile."""
    seed = _seeded()
    model = _peft_model(seed % 2 ** 31)
    reference = copy.deepcopy(model)
    report = stageml.torch.replace_lora_layers(model, str(tmp_path))
    assert report.replaced == ["base_model.model.0", "base_model.model.2"]
    assert list(report.skipped) == ["base_model.model.3"] and "Embedding" in report.skipped["base_model.model.3"]
    layers = [model.get_submodule(name) for name in report.replaced]
    assert all(isinstance(layer, stageml.torch.StagedLinear) for layer in layers)
    assert all(layer.staged.residual.entry("adapter") is None for layer in layers)  # W + s·B·A folded

    def mlp(module, x):
        return module.base_model.model[2](module.base_model.model[1](module.base_model.model[0](x)))

    compiled = torch.compile(lambda x: mlp(model, x), fullgraph=True)
    with torch.no_grad():
        for shape in [(3, 16), (2, 5, 16)]:
            x = torch.randn(shape)
            assert rel_err(mlp(model, x), mlp(reference, x)) <= 1e-5, shape
            assert rel_err(compiled(x), mlp(reference, x)) <= 1e-5, shape


def test_replace_lora_layers_wants_eval_mode():
    model = _peft_model(0).train()
    with pytest.raises(InputError, match="training mode"):
        stageml.torch.replace_lora_layers(model)


def test_staged_module_serves_an_adapter_of_a_multi_tenant_residual(tmp_path):
    """StagedModule(adapter=...) on a multi-tenant residual: every row with that adapter, or the
    base model (None), against PEFT."""
    from test_target_sm90 import _tenant_model

    seed = _seeded()
    model = _tenant_model(seed % 2 ** 31).float()
    art = stageml.compile(model, (torch.randn(3, 256),), dynamic_shapes=({0: Dim("rows", max=64)},),
                          max_adapters=2, max_rank=8)
    residual = art.load(str(tmp_path / "tenants.vmfb"))
    residual.load_adapter("a", {k: v for k, v in model.state_dict().items() if "lora_" in k},
                          config=model.peft_config["default"])
    x = torch.randn(5, 256)
    with torch.no_grad():
        expected = model(x)
        with model.disable_adapter():
            base = model(x)
    assert rel_err(StagedModule(residual, adapter="a")(x), expected) <= 1e-5
    assert rel_err(StagedModule(residual)(x), base) <= 1e-5
