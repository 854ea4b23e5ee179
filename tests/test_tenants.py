"""Multi-tenant serving: PEFT adapters against PEFT itself, per-row isolation,
slots and eviction, bad adapters, the cost policy, and threads."""

import copy
import json
import random
import threading

import numpy as np
import pytest
import torch
from torch.export import Dim

import stageml
from models import rel_err
from stageml.errors import AdapterError, InputError
from stageml.runtime import module

TARGETS = ["q_proj", "v_proj", "o_proj", "gate_proj"]


# -- the small PEFT Llama, three adapters saved with save_pretrained ----------

@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from models import CausalLM

    root = tmp_path_factory.mktemp("llama")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    base = LlamaForCausalLM(config).eval()
    configs = {  # rank 8; rank 4 on two of the compiled sites; rsLoRA
        "a": LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS, init_lora_weights=False),
        "b": LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
        "c": LoraConfig(r=8, lora_alpha=8, use_rslora=True, target_modules=TARGETS, init_lora_weights=False),
    }
    peft = {}
    for seed, (name, lora) in enumerate(configs.items()):
        torch.manual_seed(10 + seed)
        peft[name] = get_peft_model(copy.deepcopy(base), lora).eval()
        peft[name].save_pretrained(str(root / name))
    ids = torch.randint(0, 128, (2, 5))
    art = stageml.compile(CausalLM(peft["a"]).eval(), (ids,), max_adapters=4, max_rank=8,
                          dynamic_shapes={"ids": {0: Dim("batch", max=64), 1: Dim("seq", max=64)}})
    path = art.save(str(root / "tenants.vmfb"))
    return {"path": path, "root": root, "peft": peft, "art": art}


def _llama_reference(llama, name, ids):
    model = llama["peft"]["a" if name is None else name]
    with torch.no_grad():
        if name is None:
            with model.disable_adapter():
                return model(input_ids=ids).logits
        return model(input_ids=ids).logits


def _one_merged_budget(art) -> int:
    sites = art.tenants["sites"]
    factorized = sum(8 * (s["in_features"] + s["out_features"]) * 4 for s in sites)
    merged = sum(s["in_features"] * s["out_features"] * 4 for s in sites)
    return 3 * factorized + merged  # room for every adapter's factors and one merged adapter


@pytest.mark.parametrize("policy", ["merged", "factorized", "budget"])
def test_peft_adapters_match_peft(llama, policy):
    if policy == "budget":
        mod = stageml.load(llama["path"], adapter_memory_budget=_one_merged_budget(llama["art"]), replan_every=4)
    else:
        mod = stageml.load(llama["path"], policy=policy)
    for name in "abc":
        mod.load_adapter(name, str(llama["root"] / name))
    for name in ["a", "b", "c", None]:
        ids = torch.randint(0, 128, (2, 6))
        assert rel_err(mod(ids, adapter=name), _llama_reference(llama, name, ids)) <= 1e-4, name
    if policy == "budget":  # "a" and then "c" had the most traffic: one of them is merged
        for _ in range(8):
            mod(torch.randint(0, 128, (1, 3)), adapter="c")
        forms = {n: s["form"] for n, s in mod.stats()["adapters"].items()}
        assert sorted(forms.values()) == ["factorized", "factorized", "merged"]
        assert forms["c"] == "merged"
        assert mod.stats()["bytes_held"] <= mod.stats()["budget"]
    else:
        assert {s["form"] for s in mod.stats()["adapters"].values()} == {policy}
    names = ["a", "b", None, "c", "a", "c"]
    ids = torch.randint(0, 128, (len(names), 7))
    rows = mod.run_batch(ids, adapters=names)
    for i, name in enumerate(names):
        assert rel_err(rows[i:i + 1], _llama_reference(llama, name, ids[i:i + 1])) <= 1e-4, (i, name)


def test_stagemlc_multi_tenant(llama, tmp_path):
    import subprocess
    import sys

    from models import CausalLM

    ids = torch.randint(0, 128, (2, 5))
    program = torch.export.export(CausalLM(llama["peft"]["a"]).eval(), (ids,), strict=False,
                                  dynamic_shapes={"ids": {0: Dim("batch", max=64), 1: Dim("seq", max=64)}})
    torch.export.save(program, str(tmp_path / "model.pt2"))
    out = tmp_path / "residual.vmfb"
    done = subprocess.run([sys.executable, "-m", "stageml.tools.stagemlc", str(tmp_path / "model.pt2"), "-o", str(out),
                           "--max-adapters", "3", "--max-rank", "16", "-q"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((tmp_path / "residual.json").read_text())
    assert (manifest["tenants"]["max_adapters"], manifest["tenants"]["max_rank"]) == (3, 16)
    assert len(manifest["tenants"]["sites"]) == 8
    mod = stageml.load(str(out))
    mod.load_adapter("b", str(llama["root"] / "b"))
    ids = torch.randint(0, 128, (3, 4))
    assert rel_err(mod.run_batch(ids, ["b", None, "b"])[0], _llama_reference(llama, "b", ids[:1])[0]) <= 1e-4


# -- a PEFT linear layer: fast to compile, with a numpy reference ---------------

class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(64, 48)

    def forward(self, x):
        return self.fc(x)


A, B = "base_model.model.fc.lora_A.default.weight", "base_model.model.fc.lora_B.default.weight"


@pytest.fixture(scope="module")
def linear(tmp_path_factory):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(1)
    model = get_peft_model(Linear(), LoraConfig(r=4, target_modules=["fc"], init_lora_weights=False)).eval()
    art = stageml.compile(model, (torch.randn(3, 64),), dynamic_shapes=({0: Dim("rows", max=256)},),
                          max_adapters=2, max_rank=8)
    weight = model.base_model.model.fc.base_layer.weight.detach().numpy()
    bias = model.base_model.model.fc.base_layer.bias.detach().numpy()
    return {"path": art.save(str(tmp_path_factory.mktemp("linear") / "linear.vmfb")), "weight": weight, "bias": bias,
            "iree": art.mlir["iree"]}


class EveryOtherToken(torch.nn.Module):
    """A linear layer on every other token of the batch's flattened [B, S] tokens."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(64, 48)

    def forward(self, x):
        return self.fc(x.reshape(-1, 64)[::2])


def test_site_on_flattened_tokens_serves_each_tokens_row_and_refuses_uneven_rows(tmp_path):
    """A LoRA site whose input rows are the request rows' tokens (a multiple of the rows, in
    their order) gives each token its row's adapter; rows that are no multiple fail the call
    with a clear error instead of reading past the slots, and the module serves on."""
    from peft import LoraConfig, get_peft_model

    seed = torch.seed()
    print("seed", seed)
    model = get_peft_model(EveryOtherToken(), LoraConfig(r=4, target_modules=["fc"], init_lora_weights=False)).eval()
    art = stageml.compile(model, (torch.randn(4, 2, 64),), max_adapters=2, max_rank=4,
                          dynamic_shapes=({0: Dim("b", max=16), 1: Dim("s", max=8)},))
    mod = art.load(str(tmp_path / "tokens.vmfb"), policy="factorized")
    mod.load_adapter("a", {k: v for k, v in model.state_dict().items() if "lora_" in k},
                     config=model.peft_config["default"])
    for rows, tokens in ((7, 2), (2, 4)):  # one kept token per row; two per row
        names = ["a" if i % 2 == 0 else None for i in range(rows)]
        x = torch.randn(rows, tokens, 64)
        y = mod.run_batch(x, names)
        with torch.no_grad():
            adapted = model(x)
            with model.disable_adapter():
                base = model(x)
        per = rows * tokens // 2 // rows  # kept tokens per row
        for t in range(y.shape[0]):
            expected = adapted[t] if names[t // per] == "a" else base[t]
            assert rel_err(y[t], expected) <= 1e-4, (rows, tokens, t)
    with pytest.raises(stageml.StageMLError, match="input rows do not line up with the request rows"):
        mod.run_batch(torch.randn(3, 3, 64), ["a", None, "a"])  # 5 kept tokens for 3 rows
    x = torch.randn(2, 4, 64)
    with torch.no_grad():
        assert rel_err(mod.run_batch(x, ["a", "a"]), model(x)) <= 1e-4


def _factors(seed, rank=4):
    g = torch.Generator().manual_seed(seed)
    return {A: torch.randn(rank, 64, generator=g) / 8, B: torch.randn(48, rank, generator=g)}


def _expect(linear, factors, x):
    y = x @ linear["weight"].T + linear["bias"]
    if factors is not None:
        y = y + (x @ factors[A].numpy().T) @ factors[B].numpy().T
    return y


def _check_rows(mod, linear, adapters, names):
    x = np.random.randn(len(names), 64).astype(np.float32)
    y = mod.run_batch(x, names)
    for i, name in enumerate(names):
        expected = _expect(linear, None if name is None else adapters[name], x[i:i + 1])
        assert rel_err(y[i:i + 1], expected) <= 1e-4, (i, name)


def test_per_row_products_read_the_tables_directly(linear):
    # fuse-gathers: no batch_matmul against a gathered copy of the factors; a
    # reduction generic extracts each row's factor from the table.
    forward = linear["iree"].split("func.func @forward_factorized")[1]
    assert "linalg.batch_matmul" not in forward
    assert forward.count('"parallel", "parallel", "parallel", "reduction"') == 2
    assert forward.count("tensor.extract %") == 2


def test_rows_see_only_their_adapter_through_unload_reload_and_slot_reuse(linear):
    mod = stageml.load(linear["path"], policy="factorized")
    adapters = {n: _factors(s) for s, n in enumerate("abcd")}
    mod.load_adapter("a", adapters["a"])
    mod.load_adapter("b", adapters["b"])
    _check_rows(mod, linear, adapters, ["a", "b", None, "b", "a"])
    slot_b = mod.stats()["adapters"]["b"]["slot"]
    mod.unload_adapter("b")
    assert mod.adapters == ["a"]
    mod.load_adapter("c", adapters["c"])
    assert mod.stats()["adapters"]["c"]["slot"] == slot_b  # b's slot, reused
    _check_rows(mod, linear, adapters, ["c", "a", None, "c"])
    _check_rows(mod, linear, adapters, ["a", "c", None, "c", "a"])  # the first batch's slots, now c's rows
    with pytest.raises(AdapterError, match="unknown adapter 'b'"):
        mod(np.zeros((1, 64), np.float32), adapter="b")
    mod.load_adapter("b", adapters["b"])  # both slots full: the least recently used ("a") is evicted
    assert mod.stats()["adapters"]["a"]["form"] == "evicted"
    _check_rows(mod, linear, adapters, ["b", "c", "b"])
    _check_rows(mod, linear, adapters, ["a", None, "a"])  # "a" comes back transparently
    assert mod.stats()["adapters"]["a"]["form"] == "factorized"
    with pytest.raises(AdapterError, match="all 2 adapter slots are in use"):
        mod.run_batch(np.zeros((3, 64), np.float32), ["a", "b", "c"])


def test_every_call_of_a_kept_composition_counts_its_rows_and_use(linear):
    # a composition run again is not checked again, but each call still adds its rows to
    # its adapters' counts and makes them recently used (the least recently used is evicted)
    mod = stageml.load(linear["path"], policy="factorized")
    adapters = {n: _factors(i) for i, n in enumerate("abc")}
    mod.load_adapter("a", adapters["a"])
    mod.load_adapter("b", adapters["b"])
    for _ in range(3):
        _check_rows(mod, linear, adapters, ["a", "b", "a", None])
    _check_rows(mod, linear, adapters, ["b"])
    _check_rows(mod, linear, adapters, ["a", "b", "a", None])
    _check_rows(mod, linear, adapters, ["a"])  # "a" used after "b" (which was loaded later)
    served = {n: a["requests"] for n, a in mod.stats()["adapters"].items()}
    assert served == {"a": 9, "b": 5}
    mod.load_adapter("c", adapters["c"])  # both slots full: "b" is the least recently used
    forms = {n: a["form"] for n, a in mod.stats()["adapters"].items()}
    assert forms == {"a": "factorized", "b": "evicted", "c": "factorized"}


def test_batch_compositions_are_checked_once_and_rechecked_when_slots_change(linear):
    # run_batch checks a composition and uploads its slot ids once, keeps the last 64, and checks
    # a kept one again once any slot has changed hands.
    from stageml.runtime.tenants import _BATCHES_KEPT

    mod = stageml.load(linear["path"], policy="factorized")
    adapters = {n: _factors(s) for s, n in enumerate("ab")}
    for name, factors in adapters.items():
        mod.load_adapter(name, factors)
    names = ["b", None, "a", "b"]
    _check_rows(mod, linear, adapters, names)
    kept = mod._batches[tuple(names)]
    _check_rows(mod, linear, adapters, names)
    assert mod._batches[tuple(names)] is kept and kept.ids is not None
    slots = {n: mod.stats()["adapters"][n]["slot"] for n in "ab"}
    mod.unload_adapter("b")
    mod.unload_adapter("a")
    mod.load_adapter("b", adapters["b"])
    mod.load_adapter("a", adapters["a"])
    assert {n: mod.stats()["adapters"][n]["slot"] for n in "ab"} == {"a": slots["b"], "b": slots["a"]}
    _check_rows(mod, linear, adapters, names)  # the same composition, now with the slots swapped
    assert mod._batches[tuple(names)] is not kept

    compositions = [["a", "b", None][:1 + i % 3] * (1 + i // 3) for i in range(_BATCHES_KEPT + 6)]
    for names in compositions + compositions[:3]:  # the first three were dropped, and come back
        _check_rows(mod, linear, adapters, names)
    assert len(mod._batches) == _BATCHES_KEPT


def test_evicted_directory_adapter_is_reloaded_from_disk(linear, tmp_path):
    from safetensors.torch import save_file

    mod = stageml.load(linear["path"])
    adapters = {n: _factors(10 + s, rank=2) for s, n in enumerate("xyz")}
    for name, factors in adapters.items():
        (tmp_path / name).mkdir()
        save_file({k.replace(".default", ""): v.contiguous() for k, v in factors.items()},
                  str(tmp_path / name / "adapter_model.safetensors"))
        (tmp_path / name / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 2}))
        mod.load_adapter(name, str(tmp_path / name))
    assert mod.stats()["adapters"]["x"]["form"] == "evicted"
    _check_rows(mod, linear, adapters, ["x", "z", "x"])


def test_merged_policy_serves_single_adapter_batches_merged(linear):
    mod = stageml.load(linear["path"], policy="merged")
    adapters = {"a": _factors(3), "b": _factors(4)}
    for name, factors in adapters.items():
        mod.load_adapter(name, factors)
    assert {s["form"] for s in mod.stats()["adapters"].values()} == {"merged"}
    _check_rows(mod, linear, adapters, ["a", "a", "a"])       # @forward with a's merged weights
    _check_rows(mod, linear, adapters, ["a", "b", None, "a"])  # one factorized call


def test_auto_policy_merges_hot_adapters_and_unmerges_cold_ones(linear):
    per_adapter = 8 * (64 + 48) * 4
    budget = 2 * per_adapter + 64 * 48 * 4  # one merged adapter
    mod = stageml.load(linear["path"], adapter_memory_budget=budget, replan_every=8)
    adapters = {"a": _factors(5), "b": _factors(6)}
    for name, factors in adapters.items():
        mod.load_adapter(name, factors)
    x = np.random.randn(2, 64).astype(np.float32)
    for _ in range(8):
        mod(x, adapter="a")
    assert mod.stats()["adapters"]["a"]["form"] == "merged"
    for _ in range(24):
        mod(x, adapter="b")
    forms = {n: s["form"] for n, s in mod.stats()["adapters"].items()}
    assert forms == {"a": "factorized", "b": "merged"}
    assert mod.stats()["bytes_held"] <= budget
    _check_rows(mod, linear, adapters, ["b", "b"])
    _check_rows(mod, linear, adapters, ["a", "b"])


def test_too_small_budget_is_an_error(linear):
    mod = stageml.load(linear["path"], adapter_memory_budget=100)
    with pytest.raises(AdapterError, match="adapter 'a' does not fit the adapter memory budget of 100 bytes"):
        mod.load_adapter("a", _factors(0))
    assert mod.adapters == []


def test_lora_on_a_module_the_forward_never_runs(tmp_path):
    """PEFT's all-linear adapts layers a causal LM's forward never runs (its cross-attention): the
    residual has no site for them, and their factors, which change nothing, load and are left out."""
    from peft import LoraConfig, get_peft_model

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(64, 48)
            self.cross = torch.nn.Linear(64, 48)  # runs only with encoder states, never in this forward

        def forward(self, x, encoder_states=None):
            return self.fc(x) if encoder_states is None else self.fc(x) + self.cross(encoder_states)

    seed = torch.seed()
    print("seed", seed)
    model = get_peft_model(Decoder(), LoraConfig(r=4, target_modules=["fc", "cross"], init_lora_weights=False)).eval()
    model.save_pretrained(str(tmp_path / "a"))
    art = stageml.compile(model, (torch.randn(2, 64),), dynamic_shapes=({0: Dim("rows", max=8)},), max_adapters=2,
                          max_rank=8)
    assert [s["lora_A"] for s in art.tenants["sites"]] == ["base_model.model.fc.lora_A.default.weight"]
    assert art.tenants["unread"] == [f"base_model.model.cross.lora_{f}.default.weight" for f in "AB"]
    mod = art.load(str(tmp_path / "r.vmfb"))
    mod.load_adapter("a", str(tmp_path / "a"))
    x = torch.randn(3, 64)
    with torch.no_grad():
        expected = torch.cat([model(x[:1]), model.base_model.model.fc.base_layer(x[1:2]), model(x[2:])])
    assert rel_err(mod.run_batch(x, adapters=["a", None, "a"]), expected) <= 1e-5


def test_a_site_iree_data_tiling_cannot_vectorize_compiles_by_the_next_path(tmp_path):
    """A multi-tenant site of in 32, out 24 and rank 16 stops IREE 3.13's dispatch-creation data
    tiling for znver4 ("One or more operations with large vector sizes", iree-org/iree#24876): the
    residual is compiled by the next path, and for this CPU (whichever path it takes) matches PEFT."""
    from peft import LoraConfig, get_peft_model

    from stageml.compiler.lowering import RESIDUAL_FLAGS
    from stageml.compiler.options import CompileOptions
    from stageml.compiler.targets import get_target

    seed = torch.seed()
    print("seed", seed)
    model = get_peft_model(torch.nn.Sequential(torch.nn.Linear(32, 24)),
                           LoraConfig(r=4, target_modules=["0"], init_lora_weights=False)).eval()
    model.save_pretrained(str(tmp_path / "a"))
    example, dims = (torch.randn(2, 32),), ({0: Dim("rows", max=8)},)
    znver4 = stageml.compile(model, example, dynamic_shapes=dims, max_adapters=2, max_rank=16, cpu="znver4")
    assert znver4.report.iree_flags == [*get_target(CompileOptions(cpu="znver4")).flag_choices(None)[1],
                                        *RESIDUAL_FLAGS]
    art = stageml.compile(model, example, dynamic_shapes=dims, max_adapters=2, max_rank=16)
    mod = art.load(str(tmp_path / "r.vmfb"))
    mod.load_adapter("a", str(tmp_path / "a"))
    x = torch.randn(3, 32)
    with torch.no_grad():
        expected = torch.cat([model(x[:1]), model.base_model.model[0].base_layer(x[1:2]), model(x[2:])])
    assert rel_err(mod.run_batch(x, adapters=["a", None, "a"]), expected) <= 1e-5


# -- bad adapters and requests: errors that change nothing ------------------------

@pytest.mark.parametrize("tensors, match", [
    ({A: torch.zeros(9, 64), B: torch.zeros(48, 9)}, f"adapter tensor '{A}' has rank 9, above the residual's maximum rank 8"),
    ({A: torch.zeros(4, 63), B: torch.zeros(48, 4)}, f"adapter tensor '{A}' has shape \\[4, 63\\]; expected \\[r, 64\\]"),
    ({A: torch.zeros(4, 64), B: torch.zeros(47, 4)}, f"adapter tensor '{B}' has shape \\[47, 4\\]; expected \\[48, 4\\]"),
    ({A: torch.zeros(4, 64)}, f"adapter tensor '{A}' has no matching lora_B"),
    ({"base_model.model.fc.weight": torch.zeros(48, 64)}, "'base_model.model.fc.weight' is not a LoRA factor"),
    ({"base_model.model.proj.lora_A.weight": torch.zeros(4, 64), "base_model.model.proj.lora_B.weight": torch.zeros(48, 4)},
     "targets module 'base_model.model.proj', which the residual was not compiled with LoRA on"),
])
def test_bad_adapter_names_the_tensor_and_changes_nothing(linear, tensors, match):
    mod = stageml.load(linear["path"])
    good = _factors(7)
    mod.load_adapter("good", good)
    before = mod.stats()
    with pytest.raises(AdapterError, match=match):
        mod.load_adapter("bad", tensors)
    with pytest.raises(AdapterError, match=match):
        mod.load_adapter("good", tensors)  # a failed replacement keeps the old adapter
    assert mod.adapters == ["good"] and mod.stats() == before
    _check_rows(mod, linear, {"good": good}, ["good", None])


def test_bad_adapter_directory_and_config(linear, tmp_path):
    mod = stageml.load(linear["path"])
    with pytest.raises(AdapterError, match="has no adapter_config.json"):
        mod.load_adapter("a", str(tmp_path))
    with pytest.raises(AdapterError, match="sets use_dora"):
        mod.load_adapter("a", _factors(0), config={"r": 4, "lora_alpha": 8, "use_dora": True})
    with pytest.raises(AdapterError, match="gives rank 16 .* but its lora_A has rank 4"):
        mod.load_adapter("a", _factors(0), config={"r": 16, "lora_alpha": 8})
    assert mod.adapters == []


def test_unknown_adapter_fails_before_any_compute(linear):
    mod = stageml.load(linear["path"])
    mod.load_adapter("a", _factors(0))
    x = np.zeros((2, 64), np.float32)
    with pytest.raises(AdapterError, match="unknown adapter 'nobody': load it with mod.load_adapter"):
        mod.run_batch(x, ["a", "nobody"])
    assert mod.stats()["adapters"]["a"]["requests"] == 0
    with pytest.raises(InputError, match="run_batch got 3 adapter names for inputs of \\[2\\] rows"):
        mod.run_batch(x, ["a", None, None])
    with pytest.raises(AdapterError, match="unknown adapter policy"):
        stageml.load(linear["path"], policy="greedy")


@pytest.mark.parametrize("options, match", [
    ({"replan_every": 0}, "replan_every is 0"), ({"adapter_memory_budget": "1G"}, "adapter_memory_budget is '1G'"),
    ({"adapter_memory_budget": -1}, "adapter_memory_budget is -1"), ({"policy": None}, "unknown adapter policy None"),
    ({"budget": 10}, "unknown serving option 'budget'")])
def test_bad_serving_options(linear, options, match):
    with pytest.raises(stageml.StageMLError, match=match):
        stageml.load(linear["path"], **options)


@pytest.mark.parametrize("call, match", [
    (lambda m: m(object(), adapter=None), "input 'args_0' has shape \\[\\] object"),
    (lambda m: m(np.float32(3)), "input 'args_0' has shape \\[\\] float32"),
    (lambda m: m(np.zeros((1, 64), np.float32), adapter=["a"]), r"adapter \['a'\] is not a name"),
    (lambda m: m.run_batch(np.zeros((1, 64), np.float32), None), "run_batch takes a list of adapter names"),
    (lambda m: m.run_batch(np.zeros((1, 64), np.float32), "a"), "run_batch takes a list of adapter names"),
    (lambda m: m(np.zeros((257, 64), np.float32)), "has 257 along dimension 0, outside the exported range 0..256"),
    (lambda m: stageml.load(None), "not a NoneType")])
def test_bad_calls_are_stageml_errors(linear, call, match):
    mod = stageml.load(linear["path"])
    with pytest.raises(stageml.StageMLError, match=match):
        call(mod)
    assert mod(np.zeros((1, 64), np.float32)).shape == (1, 48)  # and the module keeps working


def test_run_batch_with_torch_tensors(linear):
    mod = stageml.load(linear["path"])
    adapters = {n: _factors(40 + s) for s, n in enumerate("ab")}
    for name, factors in adapters.items():
        mod.load_adapter(name, factors)
    names = ["a", None, "b", "a"]
    x = torch.randn(len(names), 64)
    rows = mod.run_batch(x, names)
    assert isinstance(rows, torch.Tensor)
    assert np.array_equal(rows.numpy(), mod.run_batch(x.numpy(), names))
    for i, name in enumerate(names):
        expected = _expect(linear, None if name is None else adapters[name], x[i:i + 1].numpy())
        assert rel_err(rows[i:i + 1], expected) <= 1e-4, (i, name)
    assert isinstance(mod(x[:1], adapter="b"), torch.Tensor)


# -- threads ----------------------------------------------------------------------

def _concurrently(*workers) -> list:
    """Runs each worker (a callable taking the shared failure list) in its own
    thread; returns the failures they recorded and any exception they raised."""
    failures = []

    def guarded(worker):
        try:
            worker(failures)
        except Exception as e:  # reported by the caller's assert
            failures.append(repr(e))

    threads = [threading.Thread(target=guarded, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return failures


def test_threads_loading_unloading_and_serving_stay_correct(linear):
    mod = stageml.load(linear["path"], adapter_memory_budget=10 << 20, replan_every=16)
    adapters = {n: _factors(20 + s) for s, n in enumerate("abc")}
    for name in "ab":
        mod.load_adapter(name, adapters[name])
    mod.load_adapter("c", adapters["c"])  # 3 adapters, 2 slots: eviction and reloads under load
    served = []

    def serve(seed):
        def work(failures):
            rng = random.Random(seed)
            for _ in range(60):
                pair = rng.sample("abc", 2)
                names = [rng.choice(pair + [None]) for _ in range(rng.randint(1, 4))]
                x = np.random.default_rng(rng.randrange(1 << 30)).standard_normal((len(names), 64)).astype(np.float32)
                y = mod.run_batch(x, names)
                for i, name in enumerate(names):
                    expected = _expect(linear, None if name is None else adapters[name], x[i:i + 1])
                    if rel_err(y[i:i + 1], expected) > 1e-4:
                        failures.append((name, rel_err(y[i:i + 1], expected)))
                served.append(1)
        return work

    def churn(failures):
        for i in range(20):
            name = f"tmp{i}"
            mod.load_adapter(name, _factors(100 + i))
            y = mod(np.ones((1, 64), np.float32), adapter=name)
            if rel_err(y, _expect(linear, _factors(100 + i), np.ones((1, 64), np.float32))) > 1e-4:
                failures.append(name)
            with pytest.raises(AdapterError):
                mod.load_adapter(name, {A: torch.zeros(9, 64), B: torch.zeros(48, 9)})
            mod.unload_adapter(name)

    assert _concurrently(*[serve(s) for s in range(4)], churn) == []
    assert len(served) == 240
    assert mod.adapters == ["a", "b", "c"]


def test_bad_ids_are_refused_and_the_compiled_code_stays_in_bounds(llama, monkeypatch):
    """Token ids outside the vocabulary, and sequences beyond the exported maximum,
    are an InputError per call; called past those checks, the residual's own
    index clamps keep every read inside its table (finite rows, no crash), and its
    slot check refuses a write outside the slot table (an InputError, not IREE's error)."""
    mod = stageml.load(llama["path"])
    mod.load_adapter("a", str(llama["root"] / "a"))
    ids = mod.inputs[0]
    assert ids["range"] == {"min": 0, "max": 127} and ids["dims"][1] == {"min": 0, "max": 64}
    mod.run_batch(torch.tensor([[1, 2, 3]]), ["a"])  # [1, 3] int64 is now a shape 'ids' has accepted: values still count
    for on_host in (module.HOST_EXTREMES, 2):  # ids read on the host whole, and through aminmax
        monkeypatch.setattr(module, "HOST_EXTREMES", on_host)
        for bad in (128, 1000, -1, 10**9, -(2**63)):
            with pytest.raises(InputError, match=f"input 'ids' holds {bad}, outside 0..127"):
                mod.run_batch(torch.tensor([[1, 2, bad]]), ["a"])
    with pytest.raises(InputError, match="has 65 along dimension 1, outside the exported range 0..64"):
        mod(torch.zeros(1, 65, dtype=torch.int64), adapter="a")
    slots = mod.entry("dynamic", "factorized")
    wild = np.array([[10**9, -5, 127, 128]], np.int64)
    rows = mod._call(slots, {"ids": wild, "adapter_ids": np.array([10**6], np.int64)}).to_host()
    assert np.isfinite(rows).all()
    writer = mod.entry("adapter", "factorized")
    zeros = {a["name"]: np.zeros(a["shape"], np.float32) for a in writer["arguments"] if a["kind"] == "input"}
    for slot in (0, 5, 10**12, -1):  # slot 0 is the base model's; 4 slots are compiled
        with pytest.raises(InputError, match=r"the residual refused the call: adapter slot out of range \[1, 4\]"):
            mod._call(writer, {**zeros, "slot": slot})
    good = torch.randint(0, 128, (1, 6))
    assert rel_err(mod(good, adapter="a"), _llama_reference(llama, "a", good)) <= 1e-4


def test_manifest_cannot_widen_the_slot_table(llama, tmp_path):
    for ext in (".vmfb", ".irpa", ".json"):
        (tmp_path / f"tenants{ext}").write_bytes(open(llama["path"][:-5] + ext, "rb").read())
    manifest = json.loads((tmp_path / "tenants.json").read_text())
    manifest["tenants"]["max_adapters"] = 64
    (tmp_path / "tenants.json").write_text(json.dumps(manifest))
    with pytest.raises(stageml.StageMLError, match="disagrees with its module about the multi-tenant configuration"):
        stageml.load(str(tmp_path / "tenants.vmfb"))


def test_stress_mixed_tenants_churn_and_bad_requests(llama):
    """Bounded stress: 3 threads serve mixed-tenant batches (every row checked
    against PEFT), one loads and unloads adapters, one sends bad requests
    (ids outside the vocabulary, too-long sequences) that must each fail alone."""
    mod = stageml.load(llama["path"], replan_every=8)
    for name in "abc":
        mod.load_adapter(name, str(llama["root"] / name))
    seed = random.randrange(1 << 30)
    print("stress seed", seed)
    torch.manual_seed(seed)
    pool = [torch.randint(0, 128, (1, 6)) for _ in range(6)]
    expected = {(i, n): _llama_reference(llama, n, x) for i, x in enumerate(pool) for n in ["a", "b", "c", None]}
    served, refused = [], []

    def serve(worker):
        def work(failures):
            rng = random.Random(seed + worker)
            for _ in range(12):
                rows = [(rng.randrange(len(pool)), rng.choice(["a", "b", "c", None])) for _ in range(rng.randint(1, 5))]
                y = mod.run_batch(torch.cat([pool[i] for i, _ in rows]), [n for _, n in rows])
                for r, key in enumerate(rows):
                    if rel_err(y[r:r + 1], expected[key]) > 1e-4:
                        failures.append((key, rel_err(y[r:r + 1], expected[key])))
                served.append(1)
        return work

    def churn(failures):
        for i in range(6):
            mod.load_adapter(f"tmp{i}", str(llama["root"] / "bc"[i % 2]))
            mod.unload_adapter(f"tmp{i}")

    def bad_requests(failures):
        rng = random.Random(seed - 1)
        for _ in range(12):
            ids = torch.randint(0, 128, (2, 6))
            ids[rng.randrange(2), rng.randrange(6)] = rng.choice([128, -1, 10**9, -(10**12)])
            try:
                if rng.random() < 0.3:
                    mod.run_batch(torch.zeros(1, 80, dtype=torch.int64), ["a"])
                else:
                    mod.run_batch(ids, ["a", "c"])
                failures.append("a bad request was served")
            except InputError:
                refused.append(1)

    assert _concurrently(*[serve(w) for w in range(3)], churn, bad_requests) == []
    assert (len(served), len(refused)) == (36, 12)
    assert mod.adapters == ["a", "b", "c"]


def test_inactive_adapters_are_not_compiled_in(tmp_path):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(2)
    config = LoraConfig(r=2, target_modules=["fc"], init_lora_weights=False)
    model = get_peft_model(Linear(), config, adapter_name="t0").eval()
    model.add_adapter("t1", config)  # inactive: its weights are unused by the exported graph
    art = stageml.compile(model, (torch.randn(2, 64),), dynamic_shapes=({0: Dim("rows")},), max_adapters=2, max_rank=2)
    adapter = next(e for e in art.entry_points if (e["stage"], e["program"]) == ("adapter", "factorized"))
    inputs = [a["name"] for a in adapter["arguments"] if a["kind"] == "input"]
    assert inputs == ["base_model.model.fc.lora_A.t0.weight", "base_model.model.fc.lora_B.t0.weight"]
    model.save_pretrained(str(tmp_path))  # t0/ and t1/
    mod = art.load(str(tmp_path / "out" / "m.vmfb"))
    mod.load_adapter("t0", str(tmp_path / "t0"))
    mod.load_adapter("t1", str(tmp_path / "t1"))
    x = torch.randn(4, 64)
    with torch.no_grad():
        expected = model(x, adapter_names=["t1", "t0", "__base__", "t1"])
    assert rel_err(mod.run_batch(x, ["t1", "t0", None, "t1"]), expected) <= 1e-4


@pytest.mark.parametrize("dtype, bound", [(torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
def test_half_precision_tenants(tmp_path, dtype, bound):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(3)
    model = get_peft_model(Linear(), LoraConfig(r=4, target_modules=["fc"], init_lora_weights=False)).eval().to(dtype)
    art = stageml.compile(model, (torch.randn(2, 64).to(dtype),), dynamic_shapes=({0: Dim("rows")},),
                          max_adapters=2, max_rank=8)
    factors = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    x = torch.randn(4, 64).to(dtype)
    with torch.no_grad():
        wide = copy.deepcopy(model).double()
        expected = wide(x.double())
        with wide.disable_adapter():
            expected[2] = wide(x[2:3].double())[0]
    for policy in ("merged", "factorized"):
        mod = art.load(str(tmp_path / f"{policy}.vmfb"), policy=policy)
        mod.load_adapter("a", factors, config=model.peft_config["default"])
        assert rel_err(mod.run_batch(x, ["a", "a", None, "a"]), expected) <= bound, policy
        assert rel_err(mod(x[:2], adapter="a"), expected[:2]) <= bound, policy
    # The budget counts the model's element size: r·(in+out) and in·out
    # elements of 2 bytes per site, not 4 (sites carry their dtype).
    factorized, merged = 8 * (64 + 48) * 2, 64 * 48 * 2
    mod = art.load(str(tmp_path / "budget.vmfb"), adapter_memory_budget=factorized + merged, policy="merged")
    mod.load_adapter("a", factors, config=model.peft_config["default"])
    assert mod.stats()["bytes_held"] == factorized + merged
    assert art.tenants["sites"][0]["dtype"] == str(dtype).split(".")[1]
    with pytest.raises(AdapterError, match="does not fit the adapter memory budget"):
        art.load(str(tmp_path / "tight.vmfb"), adapter_memory_budget=factorized + merged - 1,
                 policy="merged").load_adapter("a", factors, config=model.peft_config["default"])


def test_multi_tenant_compile_resumes_from_a_dump(tmp_path):
    # The multi-tenant configuration, the sites and the resident state live in
    # the IR, so a dumped stage carries them to the rest of the compile.
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(4)
    model = get_peft_model(Linear(), LoraConfig(r=4, target_modules=["fc"], init_lora_weights=False)).eval()
    stageml.compile(model, (torch.randn(3, 64),), dynamic_shapes=({0: Dim("rows", max=256)},),
                    max_adapters=2, max_rank=8, emit="split", dump_dir=str(tmp_path / "dump"))
    art = stageml.compile(str(tmp_path / "dump" / "model.split.mlir"))
    assert (art.tenants["max_adapters"], art.tenants["max_rank"], len(art.tenants["sites"])) == (2, 8, 1)
    mod = art.load(str(tmp_path / "resumed.vmfb"))
    adapters = {"t": _factors(5)}
    mod.load_adapter("t", adapters["t"])
    linear = {"weight": model.base_model.model.fc.base_layer.weight.detach().numpy(),
              "bias": model.base_model.model.fc.base_layer.bias.detach().numpy()}
    _check_rows(mod, linear, adapters, ["t", None, "t"])
