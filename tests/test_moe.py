"""MoE models: routed experts compiled for the CPU, against transformers on fresh inputs."""

import numpy as np
import pytest
import torch
import transformers
from torch.export import Dim

import stageml
from models import CausalLM, rel_err
from workloads import decisively_routed
from stageml.errors import AdapterError

_COMMON = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               max_position_embeddings=64, use_cache=False)
# Tiny random-weight configs of each family's layout: Mixtral's [E, 2I, H] stacks with
# softmax-then-top-k routing, Qwen3-MoE's and OLMoE's (top-k of 8 experts), and GPT-OSS's
# transposed, biased stacks with interleaved gate/up; Qwen2-MoE's shared expert behind a sigmoid
# gate (iree-compile's default data-tiling path crashes on it: the CPU target's next one compiles
# it); DeepSeek-V3's grouped routing (top-k of groups, then of experts) with a shared expert. Two
# layers: each routes on its own.
FAMILIES = {
    "mixtral": lambda: transformers.MixtralConfig(intermediate_size=96, num_local_experts=4,
                                                  num_experts_per_tok=2, **_COMMON),
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(intermediate_size=96, moe_intermediate_size=48, num_experts=8,
                                                     num_experts_per_tok=2, head_dim=16, **_COMMON),
    "olmoe": lambda: transformers.OlmoeConfig(intermediate_size=96, num_experts=8, num_experts_per_tok=2, **_COMMON),
    "qwen2_moe": lambda: transformers.Qwen2MoeConfig(intermediate_size=96, moe_intermediate_size=48, num_experts=8,
                                                     shared_expert_intermediate_size=96, num_experts_per_tok=2,
                                                     **_COMMON),
    "gpt_oss": lambda: transformers.GptOssConfig(intermediate_size=96, num_local_experts=4, num_experts_per_tok=2,
                                                 head_dim=16, sliding_window=8,
                                                 layer_types=["sliding_attention", "full_attention"], **_COMMON),
    "deepseek_v3": lambda: transformers.DeepseekV3Config(
        intermediate_size=96, moe_intermediate_size=48, n_routed_experts=8, num_experts_per_tok=2, n_group=2,
        topk_group=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=16, **{**_COMMON, "num_key_value_heads": 4}),
}
MOE_LAYERS = {"deepseek_v3": 1}  # its first layer is dense (first_k_dense_replace)


def _seeded() -> int:
    seed = int(torch.randint(0, 2 ** 31, ()))
    print("seed", seed)
    torch.manual_seed(seed)
    return seed


@pytest.mark.parametrize("family", FAMILIES)
def test_moe_family_matches_transformers(family, tmp_path):
    _seeded()
    model = transformers.AutoModelForCausalLM.from_config(FAMILIES[family]()).eval()
    chosen = model.config._experts_implementation
    ids = torch.randint(0, 128, (2, 7))
    art = stageml.compile(model, (ids,), dynamic_shapes=({0: Dim("batch", max=8), 1: Dim("seq", max=32)},))
    assert model.config._experts_implementation == chosen  # the model is left as it was
    products = 2 * MOE_LAYERS.get(family, _COMMON["num_hidden_layers"])  # gate/up and down per MoE layer
    biased = family == "gpt_oss"  # its bias stacks are gathered by the routed ids too
    assert art.report.rewrites["stacks"] == products * (2 if biased else 1)  # stacks gathered by routed ids...
    assert art.report.rewrites["fuse-gathers"] == products  # ...and read in place, never copied per row
    mod = art.load(str(tmp_path / f"{family}.vmfb"))
    assert art.report.rewrites["group-experts"] == products  # long batches: in blocks of rows of one expert
    # one token (most experts get none), a ragged pair, a longer batch, and batches long
    # enough for blocks (at least 128 routed rows); ids whose routing is no near-tie, where a
    # router workloads.decisively_routed knows decides (a tie's expert is a rounding's choice)
    routed = any(type(m).__name__.endswith("TopKRouter") for m in model.modules())
    for shape in [(1, 1), (2, 7), (3, 16), (8, 32), (5, 27)]:
        with torch.no_grad():
            x, expected = decisively_routed(model, lambda x: model(x).logits, shape, 1e-5, 50) if routed else \
                (lambda x: (x, model(x).logits))(torch.randint(0, 128, shape))
        assert rel_err(mod(x.numpy()), expected.numpy()) <= 1e-4, shape


@pytest.mark.parametrize("shape, grouped", [((2, 8), 0), ((4, 40), 4)], ids=["32-rows", "320-rows"])
def test_moe_compiles_without_dynamic_shapes(shape, grouped, tmp_path):
    """Compiled for one static shape, the count of routed rows is known at compile time:
    32 keep their per-row products, 320 are grouped in blocks, with no branch on the count."""
    _seeded()
    model = transformers.AutoModelForCausalLM.from_config(FAMILIES["mixtral"]()).eval()
    x = torch.randint(0, 128, shape)
    art = stageml.compile(model, (x,))
    assert art.report.rewrites.get("group-experts", 0) == grouped
    mod = art.load(str(tmp_path / "static.vmfb"))
    with torch.no_grad():
        assert rel_err(mod(x.numpy()), model(x).logits.numpy()) <= 1e-4


class _TopK(torch.nn.Module):
    def __init__(self, k: int, largest: bool = True):
        super().__init__()
        self.k, self.largest = k, largest

    def forward(self, x):
        return torch.topk(x, self.k, dim=-1, largest=self.largest)


@pytest.mark.parametrize("largest", [True, False])
def test_topk_rounds_break_ties_toward_the_lower_index(largest, tmp_path):
    _seeded()
    art = stageml.compile(_TopK(3, largest), (torch.randn(4, 8),), dynamic_shapes=({0: Dim("rows", max=64)},))
    mod = art.load(str(tmp_path / "topk.vmfb"))
    x = torch.randint(0, 4, (33, 8)).float().numpy()  # many equal scores in every row
    values, indices = mod(x)
    order = np.argsort(-x if largest else x, axis=-1, kind="stable")[:, :3]  # ties: lower index first
    np.testing.assert_array_equal(indices, order)
    np.testing.assert_array_equal(values, np.take_along_axis(x, order, axis=-1))
    x = np.random.default_rng(int(torch.randint(0, 2 ** 31, ()))).standard_normal((5, 8)).astype(np.float32)
    expected = torch.topk(torch.from_numpy(x), 3, dim=-1, largest=largest)  # distinct scores: torch's order
    values, indices = mod(x)
    np.testing.assert_array_equal(indices, expected.indices.numpy())
    np.testing.assert_array_equal(values, expected.values.numpy())


def test_topk_over_a_middle_dim_is_refused():
    class Middle(torch.nn.Module):
        def forward(self, x):
            return torch.topk(x, 2, dim=1).values

    with pytest.raises(stageml.StageMLError, match="over the last dim"):
        stageml.compile(Middle(), (torch.randn(2, 5, 3),))


@pytest.mark.parametrize("family", ["mixtral", "gpt_oss"])
def test_peft_expert_lora_merges_at_adapter_load(family, tmp_path):
    """One PEFT adapter with LoRA on the expert stacks (`target_parameters`) and on attention:
    the adapter stage merges each expert's W + s·B·A once; the request path gathers the merged stacks."""
    from peft import LoraConfig, get_peft_model

    _seeded()
    model = transformers.AutoModelForCausalLM.from_config(FAMILIES[family]()).eval()
    peft_model = get_peft_model(model, LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
        target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])).eval()
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:  # (PEFT starts B at zero: the adapter would change nothing)
                p.normal_(0, 0.1)
    ids = torch.randint(0, 128, (2, 7))
    art = stageml.compile(peft_model, (ids,), dynamic_shapes=({0: Dim("batch", max=8), 1: Dim("seq", max=32)},))
    assert art.report.lifted["adapter->dynamic"] > 0 and art.report.rewrites["stacks"] >= 4
    mod = art.load(str(tmp_path / "peft.vmfb"))
    for shape in [(1, 1), (3, 9), (8, 20)]:  # the last in blocks (320 routed rows)
        x = torch.randint(0, 128, shape)
        with torch.no_grad():
            expected = peft_model(x).logits.numpy()
            with peft_model.disable_adapter():
                base = peft_model(x).logits.numpy()
        assert rel_err(base, expected) > 1e-3  # the adapter matters
        assert rel_err(mod(x.numpy()), expected) <= 1e-4, shape



def test_router_lora_merges_at_adapter_load(tmp_path):
    """LoRA on the router (`target_parameters=["mlp.gate.weight"]`) is adapter-time: merged into
    the router's weight at adapter load, so the adapter changes which experts tokens go to."""
    from peft import LoraConfig, get_peft_model

    _seeded()
    model = transformers.AutoModelForCausalLM.from_config(FAMILIES["mixtral"]()).eval()
    peft_model = get_peft_model(model, LoraConfig(r=4, target_parameters=["mlp.gate.weight"])).eval()
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    art = stageml.compile(peft_model, (torch.randint(0, 128, (2, 7)),),
                          dynamic_shapes=({0: Dim("batch", max=8), 1: Dim("seq", max=32)},))
    assert art.report.lifted["adapter->dynamic"] == 2  # one merged router weight per layer
    mod = art.load(str(tmp_path / "router.vmfb"))
    x = torch.randint(0, 128, (3, 9))
    with torch.no_grad():
        expected = peft_model(x).logits
        with peft_model.disable_adapter():
            assert rel_err(peft_model(x).logits, expected) > 1e-2  # the routing changed
    assert rel_err(mod(x.numpy()), expected.numpy()) <= 1e-4


def test_router_lora_tenants_in_one_batch(tmp_path):
    """Multi-tenant LoRA on the router (`target_parameters=["mlp.gate.weight"]`, beside expert
    LoRA): each row's tenant changes which experts its tokens go to, as PEFT computes each row,
    in the factorized and the merged form."""
    _seeded()
    model = transformers.AutoModelForCausalLM.from_config(FAMILIES["mixtral"]()).eval()
    adapters = {"a": _expert_adapter(model, tmp_path / "a", 1, r=4, lora_alpha=8,
                                     target_parameters=["mlp.gate.weight", *EXPERTS]),
                "b": _expert_adapter(model, tmp_path / "b", 2, r=2, lora_alpha=2, target_parameters=["mlp.gate.weight"])}
    art = stageml.compile(adapters["a"], (torch.randint(0, 128, (2, 7)),), max_adapters=2, max_rank=4,
                          dynamic_shapes=({0: Dim("batch", max=8), 1: Dim("seq", max=32)},))
    routers = [s for s in art.tenants["sites"] if not s["experts"]]
    assert [(s["in_features"], s["out_features"]) for s in routers] == [(64, 4)] * 2  # one router per layer
    path = str(tmp_path / "router.vmfb")
    art.save(path)
    rows = ["a", None, "b", "a"]
    x = torch.randint(0, 128, (len(rows), 9))
    with torch.no_grad():
        expected = {name: adapters[name](x).logits.numpy() for name in adapters}
        expected[None] = model(x).logits.numpy()
    for name in adapters:  # the adapter moves tokens to other experts
        assert any((r != b).any() for r, b in zip(_routed(adapters[name], x), _routed(model, x))), name
    for policy in ("factorized", "merged"):
        mod = stageml.load(path, policy=policy)
        for name in adapters:
            mod.load_adapter(name, str(tmp_path / name))
        ys = mod.run_batch(x.numpy(), adapters=rows)
        for i, name in enumerate(rows):
            assert rel_err(ys[i], expected[name][i]) <= 1e-4, (policy, i, name)
        assert rel_err(mod(x.numpy(), adapter="b"), expected["b"]) <= 1e-4, policy


def _decisive_mixtral():
    """The Mixtral-shaped model with routers as decisive as a trained one's, not near-uniform."""
    model = transformers.AutoModelForCausalLM.from_config(FAMILIES["mixtral"]()).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.mul_(20)
    return model


@pytest.mark.parametrize("dtype, bound", [(torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
def test_half_precision_expert_lora(dtype, bound, tmp_path):
    """A half-precision Mixtral with LoRA on its experts and attention, against the same
    half-precision weights in float64 (transformers' eager experts: no float64 grouped_mm)."""
    from peft import LoraConfig, get_peft_model

    _seeded()
    peft_model = get_peft_model(_decisive_mixtral(), LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
        target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])).eval()
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    peft_model = peft_model.to(dtype)
    ids = torch.randint(0, 128, (2, 7))
    art = stageml.compile(peft_model, (ids,), dynamic_shapes=({0: Dim("batch", max=8), 1: Dim("seq", max=32)},))
    mod = art.load(str(tmp_path / "half.vmfb"))
    reference = peft_model.double()
    reference.base_model.model.config._experts_implementation = "eager"
    for shape in [(1, 1), (2, 6)]:
        x, expected = decisively_routed(reference, lambda x: reference(x).logits, shape, 0.1, 50)
        y = mod(x)
        assert y.dtype == dtype
        assert rel_err(y, expected) <= bound, shape


def _expert_adapter(model, path, seed: int, std: float = 0.1, **config):
    """A PEFT adapter on a copy of `model` with random N(0, std²) factors, saved to `path`."""
    import copy
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    peft_model = get_peft_model(copy.deepcopy(model), LoraConfig(**config)).eval()
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.normal_(0, std)
    peft_model.save_pretrained(str(path))
    return peft_model


EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]


@pytest.fixture(scope="module")
def tenants(tmp_path_factory):
    """A Mixtral-shaped model, three PEFT adapters with expert LoRA, and a 3-slot residual."""
    _seeded()
    root = tmp_path_factory.mktemp("moe_tenants")
    model = transformers.AutoModelForCausalLM.from_config(FAMILIES["mixtral"]()).eval()
    adapters = {  # rank 4 on attention and experts; rsLoRA rank 2; rank 3 on layer 1's down experts only
        "a": _expert_adapter(model, root / "a", 1, r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                             target_parameters=EXPERTS),
        "b": _expert_adapter(model, root / "b", 2, r=2, lora_alpha=3, use_rslora=True, target_modules=["v_proj"],
                             target_parameters=EXPERTS),
        "c": _expert_adapter(model, root / "c", 3, r=3, lora_alpha=6, target_parameters=["mlp.experts.down_proj"],
                             layers_to_transform=[1]),
    }
    art = stageml.compile(adapters["a"], (torch.randint(0, 128, (2, 7)),), max_adapters=3, max_rank=4,
                          dynamic_shapes=({0: Dim("batch", max=8), 1: Dim("seq", max=32)},))
    path = str(root / "tenants.vmfb")
    art.save(path)
    return model, adapters, root, path, art


@pytest.mark.parametrize("policy", ["factorized", "merged", "budget"])
def test_expert_lora_tenants_in_one_batch(tenants, policy):
    """Rows of one batch use different tenants' expert LoRA and the base model, as PEFT computes each."""
    model, adapters, root, path, art = tenants
    sites = [s for s in art.tenants["sites"] if s["experts"]]
    assert len(sites) == 4 and all(s["experts"] == 4 for s in sites)  # gate/up and down of each layer
    assert art.report.rewrites["expert-factors"] == 4
    if policy == "budget":  # every adapter's factors and one merged adapter (experts included)
        per = [(max(s["experts"], 1), s["in_features"], s["out_features"]) for s in art.tenants["sites"]]
        budget = sum(3 * e * 4 * (k + n) * 4 + e * k * n * 4 for e, k, n in per)
        mod = stageml.load(path, adapter_memory_budget=budget, replan_every=4)
    else:
        mod = stageml.load(path, policy=policy)
    for name in adapters:
        mod.load_adapter(name, str(root / name))
    if policy == "budget":  # "c" has the most traffic: it is merged, the others stay factorized
        for _ in range(8):
            mod(torch.randint(0, 128, (1, 3)), adapter="c")
    rows = ["a", None, "b", "c", "a", "b"]
    x = torch.randint(0, 128, (len(rows), 12))  # 144 routed rows: the base expert products in blocks
    ys = mod.run_batch(x.numpy(), adapters=rows)
    with torch.no_grad():
        expected = {name: adapters[name](x).logits.numpy() for name in adapters}
        expected[None] = model(x).logits.numpy()
    for i, name in enumerate(rows):
        assert rel_err(ys[i], expected[name][i]) <= 1e-4, (i, name)
    forms = {n: a["form"] for n, a in mod.stats()["adapters"].items()}
    if policy == "budget":
        assert forms == {"a": "factorized", "b": "factorized", "c": "merged"}
        assert mod.stats()["bytes_held"] <= mod.stats()["budget"]
    else:
        assert set(forms.values()) == {policy}


@pytest.mark.parametrize("dtype, bound", [(torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
def test_half_precision_expert_lora_tenants(dtype, bound, tmp_path):
    """Half-precision rows of two tenants' expert LoRA (one with router LoRA too) and the base
    model in one batch, each against PEFT with that row's adapter, in float64 on the same
    half-precision weights. PEFT merges a half-precision parameter (an expert stack, a router)
    in float32, casts around the merge: it is still the site each tenant's factors serve."""
    import copy
    _seeded()
    model = _decisive_mixtral().to(dtype)
    # factors of N(0, 0.05²): PyTorch's own bf16 run of the usual 0.1 misses bf16's bound by itself
    peft = {"a": _expert_adapter(model, tmp_path / "a", 1, 0.05, r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                 target_parameters=["mlp.gate.weight", *EXPERTS]).to(dtype),
            "b": _expert_adapter(model, tmp_path / "b", 2, 0.05, r=2, lora_alpha=4, use_rslora=True,
                                 target_parameters=EXPERTS).to(dtype)}
    art = stageml.compile(peft["a"], (torch.randint(0, 128, (2, 7)),), max_adapters=2, max_rank=4,
                          dynamic_shapes=({0: Dim("batch", max=8), 1: Dim("seq", max=32)},))
    merged = [s for s in art.tenants["sites"] if s["experts"] or s["out_features"] == 4]  # experts, routers
    assert len(merged) == 6 and {s["dtype"] for s in merged} == {str(dtype).removeprefix("torch.")}
    assert art.report.rewrites["expert-factors"] == 4
    mod = art.load(str(tmp_path / "half.vmfb"))
    for name in peft:
        mod.load_adapter(name, str(tmp_path / name))
    references = {name: copy.deepcopy(m).double() for name, m in {**peft, None: model}.items()}
    for reference in references.values():
        reference.config._experts_implementation = "eager"  # no float64 grouped_mm
    rows = ["a", None, "b", "a"]
    x, expected = decisively_routed(torch.nn.ModuleList(references.values()), lambda x: [
        references[name](x[i:i + 1]).logits for i, name in enumerate(rows)], (len(rows), 6), 0.1, 100)
    ys = mod.run_batch(x.numpy(), adapters=rows)
    for i, name in enumerate(rows):
        assert rel_err(ys[i:i + 1], expected[i]) <= bound, (i, name)
    assert rel_err(mod(x[2:3].numpy(), adapter="b"), expected[2]) <= bound


def _routed(model, x) -> list:
    """Per MoE layer, the experts `model` routes each row's tokens to: [rows, tokens·k] each."""
    routed = []
    hooks = [m.register_forward_hook(lambda m, args, out: routed.append(out[2].reshape(x.shape[0], -1)))
             for m in model.modules() if type(m).__name__.endswith("TopKRouter")]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for hook in hooks:
            hook.remove()
    return routed


def _run_and_count(mod, adapters, batches, expected: dict) -> None:
    """Runs each batch (an adapter name or None per row) on `mod` and adds to `expected`
    {(layer, tenant, expert): rows} where PEFT routes each tenant's rows."""
    for rows in batches:
        x = torch.randint(0, 128, (len(rows), int(torch.randint(1, 12, ()))))
        mod.run_batch(x.numpy(), adapters=rows)
        for name in set(rows) - {None}:
            for layer, experts in enumerate(_routed(adapters[name], x)):
                mine = experts[[i for i, n in enumerate(rows) if n == name]].flatten()
                for e in mine.tolist():
                    expected[layer, name, e] = expected.get((layer, name, e), 0) + 1


def test_plan_counts_each_tenants_routed_tokens(tenants):
    """mod.plan(): per MoE layer, tenant and expert, the rows routed there in mixed batches
    (the residual's own counts), the form and bytes held, as JSON."""
    import json

    model, adapters, root, path, art = tenants
    mod = stageml.load(path, policy="factorized")
    for name in adapters:
        mod.load_adapter(name, str(root / name))
    expected = {}
    _run_and_count(mod, adapters, (["a", None, "b", "c"], ["b", "b", None]), expected)
    plan = json.loads(json.dumps(mod.plan()))
    assert plan == mod.stats()["plan"] and plan["policy"] == "factorized"
    assert [layer["layer"] for layer in plan["layers"]] == [0, 1]
    for layer in plan["layers"]:  # each layer's routing serves its gate/up and down sites
        assert layer["experts"] == 4 and len(layer["sites"]) == 2
        assert all(f"layers.{layer['layer']}." in site for site in layer["sites"])
    assert len(plan["pairs"]) == 2 * 3 * 4  # layers x tenants x experts
    for pair in plan["pairs"]:
        assert pair["tokens"] == expected.get((pair["layer"], pair["tenant"], pair["expert"]), 0), pair
        assert pair["form"] == "factorized" and pair["bytes"] > 0 and pair["reason"] == "policy 'factorized'"
    assert sum(p["tokens"] for p in plan["pairs"]) == sum(expected.values()) > 0
    from stageml.dialects.plan import read_plan
    assert read_plan(mod.plan("mlir")) == plan  # the same plan as verified plan-dialect MLIR
    mod.run_batch(torch.randint(0, 128, (2, 5)).numpy(), adapters=["a", "b"])
    mod.load_adapter("a", str(root / "a"))  # another adapter under the name: its rows start at zero
    tokens = {}
    for pair in mod.plan()["pairs"]:
        tokens[pair["tenant"]] = tokens.get(pair["tenant"], 0) + pair["tokens"]
    before = sum(n for (_, tenant, _), n in expected.items() if tenant == "b")
    assert tokens["a"] == 0 and tokens["b"] == before + 5 * 2 * 2  # 5 tokens, top-2, 2 layers


def test_plan_counts_merged_calls_too(tenants):
    """A batch of one merged tenant runs the main program, which returns its routing counts
    too: the plan's tokens are every call's, merged or factorized."""
    model, adapters, root, path, art = tenants
    mod = stageml.load(path, policy="merged")
    for name in adapters:
        mod.load_adapter(name, str(root / name))
    main_routing = [r for r in mod.entry("dynamic")["results"] if r["kind"] == "routing"]
    assert [r["sites"] for r in main_routing] == [layer["sites"] for layer in mod.plan()["layers"]]
    expected = {}
    _run_and_count(mod, adapters, (["a", "a"], ["c"], ["a", "b", None], ["b"]), expected)  # 3 merged calls
    for pair in mod.plan()["pairs"]:
        assert pair["form"] == "merged"
        assert pair["tokens"] == expected.get((pair["layer"], pair["tenant"], pair["expert"]), 0), pair
    assert sum(p["tokens"] for p in mod.plan()["pairs"]) == sum(expected.values()) > 0


def test_stagemlc_emits_the_plan_a_load_starts_from(tmp_path):
    """`stagemlc ... --max-adapters N --emit-plan plan.mlir`: the MoE layers with their costs
    per (tenant, expert), as the loaded module's plan() starts; bad plan paths refused. (From a
    dumped stage: torch 2.13 cannot load a .pt2 of PEFT's expert wrapper, whose autocast region
    it saves without the metadata it then requires.)"""
    import subprocess
    import sys

    from peft import LoraConfig, get_peft_model
    from stageml.dialects.plan import read_plan

    _seeded()
    model = get_peft_model(transformers.AutoModelForCausalLM.from_config(FAMILIES["mixtral"]()),
                           LoraConfig(r=2, target_parameters=EXPERTS)).eval()
    stageml.compile(model, (torch.randint(0, 128, (2, 7)),), max_adapters=2, max_rank=4, emit="bt",
                          dump_dir=str(tmp_path / "stages"),
                          dynamic_shapes=({0: Dim("batch", max=8), 1: Dim("seq", max=32)},))
    stagemlc = [sys.executable, "-m", "stageml.tools.stagemlc", str(tmp_path / "stages" / "model.bt.mlir"), "-o",
                str(tmp_path / "r.vmfb"), "-q"]
    for extra, message in ((["--emit-plan", "p.json"], "add --max-adapters N"),
                           (["--max-adapters", "2", "--emit-plan", "p.txt"], "end it in .json or .mlir"),
                           (["--max-adapters", "2", "--emit", "linalg", "--emit-plan", "p.json"], "drop --emit")):
        refused = subprocess.run(stagemlc + extra, capture_output=True, text=True)
        assert refused.returncode == 1 and message in refused.stderr and "Traceback" not in refused.stderr
    result = subprocess.run(stagemlc + ["--max-adapters", "2", "--max-rank", "4", "--emit-plan",
                                        str(tmp_path / "plan.mlir")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    plan = read_plan((tmp_path / "plan.mlir").read_text())
    assert [len(layer["sites"]) for layer in plan["layers"]] == [2, 2] and plan["pairs"] == []
    gate_up, down = 2 * 96 * 64 * 4, 64 * 96 * 4  # a merged copy of one expert's stacks (f32)
    assert all(layer["merged_bytes"] == gate_up + down for layer in plan["layers"])
    assert plan == stageml.load(str(tmp_path / "r.vmfb")).plan()


def test_expert_lora_bad_adapters_change_nothing(tenants, tmp_path):
    model, adapters, root, path, art = tenants
    mod = stageml.load(path)
    mod.load_adapter("a", str(root / "a"))
    before = mod.stats()
    wider = transformers.AutoModelForCausalLM.from_config(  # eight experts, where the residual has four
        transformers.MixtralConfig(**{**FAMILIES["mixtral"]().to_dict(), "num_local_experts": 8}))
    _expert_adapter(wider, tmp_path / "wide", 4, r=4, target_parameters=EXPERTS)
    with pytest.raises(AdapterError, match="for 8 experts, but the residual's layer has 4"):
        mod.load_adapter("wide", str(tmp_path / "wide"))
    _expert_adapter(model, tmp_path / "deep", 5, r=8, target_parameters=EXPERTS)
    with pytest.raises(AdapterError, match="above the residual's maximum rank 4"):
        mod.load_adapter("deep", str(tmp_path / "deep"))
    assert mod.stats() == before and mod.adapters == ["a"]


@pytest.mark.parametrize("family", ["gpt_oss", "qwen3_moe", "olmoe", "qwen2_moe"])
def test_expert_lora_tenants_of_other_families(family, tmp_path):
    """Rows of two tenants (one rsLoRA) and the base model on the other families' layouts: GPT-OSS's
    stacks are [E, in, out] with biases and interleaved gate/up, so the per-tenant factors multiply
    the other way round (x @ A_eᵀ then B_eᵀ); Qwen3-MoE, OLMoE and Qwen2-MoE route top-2 of 8
    experts. Qwen2-MoE's shared expert, with LoRA too, runs on the block's flattened tokens:
    each takes its row's adapter."""
    _seeded()
    model = transformers.AutoModelForCausalLM.from_config(FAMILIES[family]()).eval()
    shared = ["gate_proj", "up_proj", "down_proj"] if family == "qwen2_moe" else []  # on the block's flattened tokens
    a = _expert_adapter(model, tmp_path / "a", 1, r=4, lora_alpha=8, target_modules=["q_proj", *shared],
                        target_parameters=EXPERTS)
    b = _expert_adapter(model, tmp_path / "b", 2, r=2, lora_alpha=4, use_rslora=True, target_parameters=EXPERTS)
    art = stageml.compile(a, (torch.randint(0, 128, (2, 7)),), max_adapters=2, max_rank=4,
                          dynamic_shapes=({0: Dim("batch", max=8), 1: Dim("seq", max=32)},))
    assert art.report.rewrites["expert-factors"] == 4
    mod = art.load(str(tmp_path / f"{family}.vmfb"), policy="factorized")
    mod.load_adapter("a", str(tmp_path / "a"))
    mod.load_adapter("b", str(tmp_path / "b"))
    rows = ["a", None, "b", "b"]
    x = torch.randint(0, 128, (len(rows), 5))
    ys = mod.run_batch(x.numpy(), adapters=rows)
    with torch.no_grad():
        expected = {"a": a(x).logits.numpy(), "b": b(x).logits.numpy(), None: model(x).logits.numpy()}
    for i, name in enumerate(rows):
        assert rel_err(ys[i], expected[name][i]) <= 1e-4, (i, name)
