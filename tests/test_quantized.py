"""Quantized bases: a Llama with torchao int8 weight-only linear layers, with and
without PEFT LoRA, against the quantized model run by PyTorch (and PEFT)."""

import copy
import json

import numpy as np
import pytest
import torch
from torch.export import Dim

import stageml
from models import CausalLM, rel_err
from stageml.errors import AdapterError

TARGETS = ["q_proj", "v_proj", "o_proj", "gate_proj"]
SHAPES = ((2, 7), (3, 16))  # two (batch, sequence) shapes from one .vmfb


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """A 2-layer Llama quantized with torchao's Int8WeightOnlyConfig (every Linear, the LM head
    too) and two PEFT adapters on it: "big" (PEFT's random init) and "small" (its B scaled by
    1/100, an update below int8's resolution)."""
    from peft import LoraConfig, get_peft_model
    from torchao.quantization import Int8WeightOnlyConfig, quantize_
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    base = LlamaForCausalLM(config).eval()
    quantize_(base, Int8WeightOnlyConfig())
    root = tmp_path_factory.mktemp("quantized")
    peft = {}
    for name, factor in (("big", 1.0), ("small", 0.01)):
        torch.manual_seed(1)
        peft[name] = get_peft_model(copy.deepcopy(base), LoraConfig(
            r=8, lora_alpha=16, target_modules=TARGETS, init_lora_weights=False)).eval()
        with torch.no_grad():
            for key, value in peft[name].named_parameters():
                if "lora_B" in key:
                    value.mul_(factor)
        peft[name].save_pretrained(str(root / name))
    return {"base": base, "peft": peft, "root": root}


def _ids(seed, shape):
    return torch.randint(0, 128, shape, generator=torch.Generator().manual_seed(seed))


def _compile(model, root, name, **options):
    ids = _ids(0, SHAPES[0])
    art = stageml.compile(CausalLM(model).eval(), (ids,), **options,
                          dynamic_shapes={"ids": {0: Dim("batch", max=8), 1: Dim("seq", max=32)}})
    return art, art.save(str(root / f"{name}.vmfb"))


def _parameter_types(art) -> list:
    """The element types of the residual's parameters (its IREE input's parameter globals)."""
    from iree.compiler import ir
    from stageml.compiler.lowering import iree_context

    module = ir.Module.parse(art.mlir["iree"], iree_context())
    return [str(ir.RankedTensorType(ir.TypeAttr(op.attributes["type"]).value).element_type)
            for op in module.body.operations
            if op.operation.name == "util.global" and "bt.kind" in op.operation.attributes
            and ir.StringAttr(op.operation.attributes["bt.kind"]).value == "parameter"]


def _quantized_layers(model) -> int:
    return sum(1 for m in model.modules() if isinstance(m, torch.nn.Linear) and type(m.weight).__name__ == "Int8Tensor")


def _merged_by_peft(peft_model):
    """PEFT's own merge of the adapter into the int8 layers: dequantize, add, re-quantize (torchao)."""
    from torchao.quantization import Int8WeightOnlyConfig
    model = copy.deepcopy(peft_model)
    for module in model.modules():
        if hasattr(module, "get_apply_tensor_subclass"):  # (set where a quantization config loaded the model)
            module.get_apply_tensor_subclass = Int8WeightOnlyConfig
    return model.merge_and_unload().eval()


def test_int8_base_compiles_with_its_dequantization_folded(quantized):
    """By default the int8 weights' dequantization is static work: the residual holds float
    weights and matches torchao's model."""
    art, path = _compile(quantized["base"], quantized["root"], "folded")
    mod = stageml.load(path)
    assert "i8" not in _parameter_types(art)
    seed = torch.seed()
    print(f"seed {seed}")
    for shape in SHAPES:
        ids = _ids(seed, shape)
        with torch.no_grad():
            expected = quantized["base"](input_ids=ids).logits
        assert rel_err(mod(ids), expected) <= 1e-4


def test_int8_base_with_lora_kept_int8(quantized):
    """--keep-quantized: every int8 layer reaches the residual as an int8 parameter (its products
    read it as it is: fuse-dequant), PEFT's LoRA stays factorized beside it, and the result is
    PEFT's on the quantized model."""
    model = quantized["peft"]["big"]
    art, path = _compile(model, quantized["root"], "kept", keep_quantized=True)
    assert art.report.rewrites.get("lora-merge", 0) == 0
    assert art.report.rewrites["fuse-dequant"] == _quantized_layers(model)
    mod = stageml.load(path)
    assert _parameter_types(art).count("i8") == _quantized_layers(model) == 15
    seed = torch.seed()
    print(f"seed {seed}")
    for shape in SHAPES:
        ids = _ids(seed, shape)
        with torch.no_grad():
            expected = model(input_ids=ids).logits
        assert rel_err(mod(ids), expected) <= 1e-4


@pytest.fixture(scope="module")
def tenants(quantized):
    _, path = _compile(quantized["peft"]["big"], quantized["root"], "tenants", keep_quantized=True,
                       max_adapters=2, max_rank=8)
    return path


def _load(path, quantized, **serving):
    mod = stageml.load(path, **serving)
    for name in ("big", "small"):
        mod.load_adapter(name, str(quantized["root"] / name))
    return mod


def test_int8_tenants_merge_only_under_the_error_bound(quantized, tenants):
    """Multi-tenant with --keep-quantized: a merged adapter is re-quantized to int8 as PEFT's own
    merge does (torchao); the policy serves it merged only where that changes its update by at
    most quantization_error_bound. "small"'s update is mostly lost to re-quantization: it stays
    factorized (exact) and says why."""
    mod = _load(tenants, quantized, policy="merged")
    stats = mod.stats()["adapters"]
    big, small = stats["big"], stats["small"]
    assert big["form"] == "merged" and big["merge_error"] <= 0.05
    assert small["form"] == "factorized" and small["merge_error"] > 0.05
    assert "above quantization_error_bound 0.05" in small["reason"]
    # the merged copy is int8 with a float32 scale per output: what the policy counts
    assert big["bytes_held"] - small["bytes_held"] == sum((s["in_features"] + 4) * s["out_features"]
                                                          for s in mod.tenants["sites"])
    seed = torch.seed()
    print(f"seed {seed}")
    for shape in SHAPES:
        ids = _ids(seed, shape)
        with torch.no_grad():
            merged = _merged_by_peft(quantized["peft"]["big"])(input_ids=ids).logits
            factorized = {n: quantized["peft"][n](input_ids=ids).logits for n in ("big", "small")}
            with quantized["peft"]["big"].disable_adapter():
                base = quantized["peft"]["big"](input_ids=ids).logits
        assert rel_err(mod(ids, adapter="big"), merged) <= 1e-4  # re-quantized as torchao does
        assert rel_err(mod(ids, adapter="small"), factorized["small"]) <= 1e-4
        # a batch of several tenants is served factorized: each row as PEFT computes it
        names = [("big", "small", None)[row % 3] for row in range(shape[0])]
        ys = np.asarray(mod.run_batch(ids, adapters=names))
        for row, name in enumerate(names):
            expected = (base if name is None else factorized[name])[row]
            assert rel_err(ys[row], expected) <= 1e-4, (row, name)


def test_int8_tenants_error_bound_is_the_users(quantized, tenants):
    """A looser bound lets "small" merge too; a bad one is refused before anything loads."""
    mod = _load(tenants, quantized, policy="merged", quantization_error_bound=1.0)
    assert {n: a["form"] for n, a in mod.stats()["adapters"].items()} == {"big": "merged", "small": "merged"}
    for bad in (-0.1, "0.05", True, float("nan")):
        with pytest.raises(AdapterError, match="quantization_error_bound is"):
            stageml.load(tenants, quantization_error_bound=bad)


def test_stagemlc_keeps_int8(quantized, tmp_path, capsys):
    """stagemlc --keep-quantized on a .pt2 of the int8 model (exported inside quantized.staged;
    torchao's int8 tensors are pickled, so the file needs --trust-model)."""
    from stageml.compiler import quantized as forms
    from stageml.tools import stagemlc

    model = CausalLM(quantized["base"]).eval()
    with forms.staged(model):
        program = torch.export.export(model, (_ids(0, SHAPES[0]),), strict=False,
                                      dynamic_shapes={"ids": {0: Dim("batch", max=8), 1: Dim("seq", max=32)}})
    torch.export.save(program, str(tmp_path / "int8.pt2"))
    out = str(tmp_path / "int8.vmfb")
    assert stagemlc.main([str(tmp_path / "int8.pt2"), "-o", out, "--keep-quantized", "-q"]) == 1
    assert "--trust-model" in capsys.readouterr().err
    assert stagemlc.main([str(tmp_path / "int8.pt2"), "-o", out, "--keep-quantized", "--trust-model", "-q"]) == 0
    with open(out.removesuffix(".vmfb") + ".json") as f:  # the manifest's compile report
        assert json.load(f)["report"]["rewrites"]["fuse-dequant"] == _quantized_layers(model) == 15
    mod = stageml.load(out)
    seed = torch.seed()
    print(f"seed {seed}")
    ids = _ids(seed, SHAPES[1])
    with torch.no_grad():
        assert rel_err(mod(ids), model(ids)) <= 1e-4


def test_generation_over_an_int8_base(quantized, tmp_path):
    """A generation step of the int8 model (compile(model, generate=True)) with its weights kept
    int8 generates transformers' greedy tokens on the torchao model."""
    art = stageml.compile(quantized["base"], generate=True, max_seq=64, sequences=2, keep_quantized=True)
    assert art.report.rewrites["fuse-dequant"] == _quantized_layers(quantized["base"])
    generator = stageml.load(art.save(str(tmp_path / "step.vmfb")))
    seed = torch.seed()
    print(f"seed {seed}")
    prompts = [_ids(seed, (1, 5))[0].tolist(), _ids(seed + 1, (1, 3))[0].tolist()]
    got = generator.generate(prompts, max_new_tokens=6)
    for prompt, tokens in zip(prompts, got):
        with torch.no_grad():
            expected = quantized["base"].generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)
        assert tokens == expected[0, len(prompt):].tolist()
