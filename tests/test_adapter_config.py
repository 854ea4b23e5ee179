"""PEFT adapter configs and tensors: anything a user may pass either prepares
finite factors of the compiled shapes or raises AdapterError (no compile)."""

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stageml.errors import AdapterError
from stageml.runtime import peft_adapter

PREFIX = "base_model.model.layers.0."
MODULES = {"q_proj": (6, 5), "v_proj": (4, 3)}  # module: (in_features, out_features)
MAX_RANK = 4
SITES = [{"lora_A": f"{PREFIX}{m}.lora_A.default.weight", "lora_B": f"{PREFIX}{m}.lora_B.default.weight",
          "in_features": k, "out_features": n, "dtype": dtype}
         for (m, (k, n)), dtype in zip(MODULES.items(), ("float32", "float16"))]


def _factors(rank=2, seed=0, modules=MODULES, dtype=np.float32):
    rng = np.random.default_rng(seed)
    tensors = {}
    for m, (k, n) in modules.items():
        tensors[f"{PREFIX}{m}.lora_A.weight"] = rng.standard_normal((rank, k)).astype(dtype)
        tensors[f"{PREFIX}{m}.lora_B.weight"] = rng.standard_normal((n, rank)).astype(dtype)
    return tensors


def _check_prepared(inputs):
    assert set(inputs) == {s[f] for s in SITES for f in ("lora_A", "lora_B")}
    for site in SITES:
        a, b = inputs[site["lora_A"]], inputs[site["lora_B"]]
        assert a.shape == (MAX_RANK, site["in_features"]) and b.shape == (site["out_features"], MAX_RANK)
        assert a.dtype == b.dtype == np.float32
        assert np.isfinite(a).all() and np.isfinite(b).all()


# -- the property: prepared factors or an AdapterError, nothing else --------------

JSON_SCALARS = (st.none() | st.booleans() | st.integers() | st.integers(min_value=-2**70, max_value=2**1100)
                | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8)
                | st.sampled_from(["LORA", "IA3", "(", "q_proj", "8", "true", ""]))
JSON = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=6) | st.sampled_from(list(MODULES) + ["(", ".*"]), inner,
                                      max_size=3), max_leaves=8)


def mostly(valid, junk=JSON):
    """`valid` four times in five, else `junk`."""
    return st.integers(0, 4).flatmap(lambda i: junk if i == 4 else valid)


RANKS = st.integers(min_value=1, max_value=6)
NUMBERS = mostly(st.integers(-100, 100) | st.floats(-1e3, 1e3), st.floats(allow_nan=True, allow_infinity=True))
PATTERNS = st.dictionaries(st.sampled_from(list(MODULES) + ["layers.0.q_proj", ".*_proj", "(", "nope"]),
                           mostly(RANKS), max_size=3)
CONFIG_FIELDS = {
    "peft_type": mostly(st.just("LORA"), st.sampled_from(["IA3"]) | JSON),
    "r": mostly(RANKS),
    "lora_alpha": mostly(NUMBERS),
    "use_rslora": mostly(st.booleans() | st.none()),
    "rank_pattern": mostly(PATTERNS),
    "alpha_pattern": mostly(st.dictionaries(st.sampled_from(list(MODULES) + ["("]), mostly(NUMBERS), max_size=3)),
    "use_dora": mostly(st.just(False) | st.none(), st.booleans() | JSON),
    "fan_in_fan_out": mostly(st.just(False), st.booleans() | JSON),
    "lora_bias": mostly(st.just(False), st.booleans() | JSON),
    "target_modules": JSON,
    "task_type": JSON,
}
CONFIGS = mostly(st.fixed_dictionaries({}, optional=CONFIG_FIELDS).flatmap(
    lambda d: st.dictionaries(st.text(max_size=6), JSON, max_size=2).map(lambda extra: {**extra, **d})),
    st.none() | JSON)

DTYPES = mostly(st.sampled_from([np.float32, np.float16, np.float64]), st.sampled_from([np.int32, np.bool_]))
VALUES = mostly(st.sampled_from([0.0, 1.0, -2.5, 1e4]), st.sampled_from([1e30, 1e300, np.nan, np.inf]))


@st.composite
def tensors(draw):
    """PEFT-named factors for some of the sites, with odd ranks, shapes,
    element types and values, and now and then a stray tensor."""
    out = {}
    for m, (k, n) in MODULES.items():
        if not draw(st.booleans()):
            continue
        r = draw(st.integers(0, MAX_RANK + 2))
        adapter = draw(st.sampled_from(["", ".default"]))
        shapes = {"lora_A": (r, k), "lora_B": (n, r)}
        for factor in draw(mostly(st.just(("lora_A", "lora_B")), st.sampled_from([("lora_A",), ("lora_B",)]))):
            shape = shapes[factor]
            if draw(st.integers(0, 9)) == 0:  # a wrong shape
                shape = draw(st.lists(st.integers(0, 7), max_size=3).map(tuple))  # (maybe right after all)
            array = np.full(shape, 0.5)
            if array.size and draw(st.booleans()):
                array.flat[draw(st.integers(0, array.size - 1))] = draw(VALUES)
            with np.errstate(over="ignore", invalid="ignore"):
                array = array.astype(draw(DTYPES))
            out[f"{PREFIX}{m}.{factor}{adapter}.weight"] = array
    extra = draw(mostly(st.none(), st.sampled_from(["name", "type", "module"])))
    if extra == "name":
        out[draw(st.integers() | st.text(max_size=5))] = np.zeros((2, 2), np.float32)
    elif extra == "type":
        out[f"{PREFIX}q_proj.lora_A.weight"] = draw(JSON)
    elif extra == "module":
        out[f"{PREFIX}k_proj.lora_A.weight"] = np.zeros((2, 6), np.float32)
    return out


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(tensors=tensors(), config=CONFIGS)
def test_prepare_returns_finite_factors_or_raises_adapter_error(tensors, config):
    try:
        inputs = peft_adapter.prepare(tensors, config, SITES, MAX_RANK)
    except AdapterError as e:
        assert "\n" not in str(e)
        return
    _check_prepared(inputs)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(rank=st.integers(1, MAX_RANK), alpha=st.integers(-64, 64) | st.floats(-1e3, 1e3), rslora=st.booleans(),
       v_alpha=st.none() | st.floats(-8, 8), give_r=st.booleans(), dtype=st.sampled_from([np.float32, np.float64]),
       seed=st.integers(0, 2**16))
def test_valid_adapters_prepare_with_peft_scaling(rank, alpha, rslora, v_alpha, give_r, dtype, seed):
    tensors = _factors(rank, seed, dtype=dtype)
    config = {"peft_type": "LORA", "lora_alpha": alpha, "use_rslora": rslora, "target_modules": list(MODULES)}
    if give_r:
        config["r"] = rank
    if v_alpha is not None:
        config["alpha_pattern"] = {"v_proj": v_alpha}
    inputs = peft_adapter.prepare(tensors, config, SITES, MAX_RANK)
    _check_prepared(inputs)
    for m, a in (("q_proj", alpha), ("v_proj", alpha if v_alpha is None else v_alpha)):
        scaling = a / math.sqrt(rank) if rslora else a / rank
        b = inputs[f"{PREFIX}{m}.lora_B.default.weight"]
        np.testing.assert_allclose(b[:, :rank], tensors[f"{PREFIX}{m}.lora_B.weight"] * scaling, rtol=1e-6, atol=1e-30)
        assert not b[:, rank:].any() and not inputs[f"{PREFIX}{m}.lora_A.default.weight"][rank:].any()
        np.testing.assert_array_equal(inputs[f"{PREFIX}{m}.lora_A.default.weight"][:rank],
                                      tensors[f"{PREFIX}{m}.lora_A.weight"].astype(np.float32))


@settings(max_examples=50, deadline=None, derandomize=True)
@given(source=JSON | st.dictionaries(st.text(max_size=5) | st.integers(), JSON, max_size=3), config=CONFIGS)
def test_read_takes_anything_or_raises_adapter_error(source, config):
    try:
        tensors, config = peft_adapter.read(source, config)
        _check_prepared(peft_adapter.prepare(tensors, config, SITES, MAX_RANK))
    except AdapterError:
        pass


# -- explicit cases --------------------------------------------------------------

def _save(directory, tensors, config_text):
    from safetensors.numpy import save_file
    directory.mkdir(exist_ok=True)
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    (directory / "adapter_config.json").write_text(config_text)
    return str(directory)


@pytest.mark.parametrize("text", ["null", "[]", '"LORA"', "8"])
def test_config_that_is_not_a_json_object(tmp_path, text):
    directory = _save(tmp_path / "a", _factors(), text)
    with pytest.raises(AdapterError, match=rf"adapter_config.json in '{directory}' is not a JSON object: "
                                           "save the adapter with PEFT's save_pretrained"):
        peft_adapter.read(directory)


def _scale_of(inputs, tensors, module="q_proj"):
    b = inputs[f"{PREFIX}{module}.lora_B.default.weight"]
    given_b = tensors[f"{PREFIX}{module}.lora_B.weight"]
    return float(np.median(b[:, :given_b.shape[1]] / given_b))


@pytest.mark.parametrize("config, q_scale, v_scale", [
    (None, 1.0, 1.0),
    ({"r": 2, "lora_alpha": 16}, 8.0, 8.0),
    ({"r": 2, "lora_alpha": 3, "use_rslora": True}, 3 / math.sqrt(2), 3 / math.sqrt(2)),
    ({"lora_alpha": -4}, -2.0, -2.0),  # r left out: the factors' rank; PEFT allows any alpha
    ({"r": 2, "lora_alpha": 8, "alpha_pattern": {"v_proj": 2}}, 4.0, 1.0),
    ({"r": 4, "lora_alpha": 8, "rank_pattern": {"q_proj": 2, "v_proj": 2}}, 4.0, 4.0),
])
def test_scaling_is_peft_s(tmp_path, config, q_scale, v_scale):
    tensors = _factors(rank=2)
    inputs = peft_adapter.prepare(tensors, config, SITES, MAX_RANK)
    _check_prepared(inputs)
    assert _scale_of(inputs, tensors, "q_proj") == pytest.approx(q_scale, rel=1e-5)
    assert _scale_of(inputs, tensors, "v_proj") == pytest.approx(v_scale, rel=1e-3)  # float16 site
    if config is not None:  # the same from a directory
        read = peft_adapter.read(_save(tmp_path / "a", tensors, json.dumps(config)))
        assert all(np.array_equal(v, peft_adapter.prepare(*read, SITES, MAX_RANK)[k]) for k, v in inputs.items())


def test_factors_of_a_module_the_forward_never_runs_change_nothing():
    """Factors of a module whose compiled factors nothing reads (`unread`: LoRA on a causal LM's
    cross-attention) are left out; a module the residual does not know is still refused."""
    cross = {"encoder_attn.q_proj": (6, 5)}
    tensors = {**_factors(rank=2), **_factors(rank=2, seed=1, modules=cross)}
    unread = [f"{PREFIX}encoder_attn.q_proj.lora_{f}.default.weight" for f in "AB"]
    inputs = peft_adapter.prepare(tensors, None, SITES, MAX_RANK, unread)
    _check_prepared(inputs)
    expected = peft_adapter.prepare(_factors(rank=2), None, SITES, MAX_RANK)
    assert all(np.array_equal(inputs[k], expected[k]) for k in expected)
    with pytest.raises(AdapterError, match="targets module 'base_model.model.layers.0.encoder_attn.q_proj', which "
                                           "the residual was not compiled with LoRA on"):
        peft_adapter.prepare(tensors, None, SITES, MAX_RANK)


def test_peft_lora_config_object():
    from peft import LoraConfig

    tensors = _factors(rank=2)
    config = LoraConfig(r=2, lora_alpha=5, use_rslora=True, target_modules=list(MODULES))
    inputs = peft_adapter.prepare(*peft_adapter.read(tensors, config), SITES, MAX_RANK)
    assert _scale_of(inputs, tensors) == pytest.approx(5 / math.sqrt(2), rel=1e-5)
    with pytest.raises(AdapterError, match="an adapter config is a dict or a peft LoraConfig, not a list"):
        peft_adapter.read(tensors, [2, 5])


@pytest.mark.parametrize("config, match", [
    ({"r": 0}, "adapter config's r is 0, not a positive integer"),
    ({"r": 2.0}, "adapter config's r is 2.0, not a positive integer"),
    ({"r": True}, "adapter config's r is True, not a positive integer"),
    ({"lora_alpha": "16"}, "adapter config's lora_alpha is '16', not a finite number"),
    ({"lora_alpha": float("nan")}, "adapter config's lora_alpha is nan, not a finite number"),
    ({"lora_alpha": 10**400}, "adapter config's lora_alpha is 1000.*, not a finite number"),
    ({"use_rslora": "false"}, "adapter config's use_rslora is 'false', not true or false"),
    ({"rank_pattern": {"q_proj": -1}}, "adapter config's rank_pattern is .*, not a dict of module patterns"),
    ({"rank_pattern": {"(": 2}}, "adapter config's rank_pattern key '\\(' is not a regular expression"),
    ({"alpha_pattern": ["q_proj"]}, "adapter config's alpha_pattern is \\['q_proj'\\], not a dict"),
    ({"peft_type": "IA3"}, "peft_type 'IA3': StageML serves LoRA adapters only"),
    ({"use_dora": True}, "sets use_dora"),
    ({"r": 4}, "gives rank 4 for 'layers.0.q_proj', but its lora_A has rank 2"),
])
def test_bad_config_names_the_field(config, match):
    with pytest.raises(AdapterError, match=match):
        peft_adapter.prepare(_factors(rank=2), config, SITES, MAX_RANK)


def test_unknown_config_fields_are_ignored():
    inputs = peft_adapter.prepare(_factors(rank=2), {"r": 2, "target_modules": {"odd": [None]}, "x": float("nan"),
                                                     "lora_dropout": "anything"}, SITES, MAX_RANK)
    _check_prepared(inputs)


A, B = f"{PREFIX}q_proj.lora_A.weight", f"{PREFIX}q_proj.lora_B.weight"


@pytest.mark.parametrize("tensors, match", [
    ({A: np.ones((2, 6), np.int32), B: np.ones((5, 2), np.float32)}, f"'{A}' has element type int32, not a floating"),
    ({A: torch.ones(2, 6, dtype=torch.bool), B: torch.ones(5, 2)}, f"'{A}' has element type bool"),
    ({A: np.ones((2, 6)), B: np.full((5, 2), np.nan)}, f"'{B}' holds NaN or infinite values"),
    ({A: np.full((2, 6), np.inf), B: np.ones((5, 2))}, f"'{A}' holds NaN or infinite values"),
    ({A: np.full((2, 6), 1e300), B: np.ones((5, 2))}, f"'{A}' has values beyond the range of float32"),
    ({A: np.ones(6), B: np.ones(5)}, f"'{A}' has shape \\[6\\]; expected \\[r, 6\\]"),
    ({A: np.ones((2, 6, 1)), B: np.ones((5, 2, 1))}, f"'{A}' has shape \\[2, 6, 1\\]"),
    ({A: np.ones((0, 6)), B: np.ones((5, 0))}, f"'{A}' has rank 0"),
    ({A: "weights", B: np.ones((5, 2))}, f"'{A}' has element type <U7"),
    ({A: [[1.0], [1.0, 2.0]], B: np.ones((5, 2))}, f"'{A}' is not an array"),
    ({7: np.ones((2, 6))}, "adapter tensor name 7 is not a string"),
    ({A: np.ones((2, 6)), A.replace(".weight", ".default.weight"): np.ones((2, 6)), B: np.ones((5, 2))},
     "are both the lora_A of module"),
])
def test_bad_tensor_names_the_tensor(tensors, match):
    with pytest.raises(AdapterError, match=match):
        peft_adapter.prepare(*peft_adapter.read(tensors), SITES, MAX_RANK)


def test_half_precision_site_refuses_factors_it_cannot_hold():
    tensors = _factors(rank=2, modules={"v_proj": MODULES["v_proj"]})
    tensors[f"{PREFIX}v_proj.lora_B.weight"][:] = 5e4
    with pytest.raises(AdapterError, match="times PEFT's scaling 2 has values beyond the range of float16"):
        peft_adapter.prepare(tensors, {"r": 2, "lora_alpha": 4}, SITES, MAX_RANK)


def test_corrupt_or_odd_directories(tmp_path):
    directory = _save(tmp_path / "a", _factors(), "{}")
    weights = tmp_path / "a" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # truncated
    with pytest.raises(AdapterError, match="cannot be read .*save it again with PEFT's save_pretrained"):
        peft_adapter.read(directory)
    weights.write_bytes(b"")
    with pytest.raises(AdapterError, match="cannot be read"):
        peft_adapter.read(directory)
    (tmp_path / "a" / "adapter_config.json").write_text("[" * 100000)
    with pytest.raises(AdapterError, match="cannot be read"):
        peft_adapter.read(directory)
    with pytest.raises(AdapterError, match="does not exist or is not a directory"):
        peft_adapter.read(str(weights))


def test_bfloat16_directory(tmp_path):
    from safetensors.torch import save_file

    (tmp_path / "a").mkdir()
    tensors = {k: torch.from_numpy(v).to(torch.bfloat16) for k, v in _factors(rank=2).items()}
    save_file(tensors, str(tmp_path / "a" / "adapter_model.safetensors"))
    (tmp_path / "a" / "adapter_config.json").write_text('{"r": 2, "lora_alpha": 4}')
    inputs = peft_adapter.prepare(*peft_adapter.read(str(tmp_path / "a")), SITES, MAX_RANK)
    _check_prepared(inputs)
    assert _scale_of(inputs, {k: v.float().numpy() for k, v in tensors.items()}) == pytest.approx(2.0, rel=1e-3)


def test_site_without_peft_names():
    # A model whose factors are plain parameters (lora_A, lora_B): the adapter names them the same.
    sites = [{"lora_A": "lora_A", "lora_B": "lora_B", "in_features": 6, "out_features": 5}]
    inputs = peft_adapter.prepare({"lora_A": np.ones((2, 6)), "lora_B": np.ones((5, 2))}, None, sites, MAX_RANK)
    assert inputs["lora_A"].shape == (4, 6) and inputs["lora_B"][:, :2].sum() == 10


def test_numpy_scalars_in_a_config_count_as_numbers():
    tensors = _factors(rank=2)
    inputs = peft_adapter.prepare(tensors, {"r": np.int64(2), "lora_alpha": np.float32(3.0),
                                            "use_rslora": np.bool_(False)}, SITES, MAX_RANK)
    assert _scale_of(inputs, tensors) == pytest.approx(1.5, rel=1e-6)
    with pytest.raises(AdapterError, match="adapter config's r is np.True_, not a positive integer"):
        peft_adapter.prepare(tensors, {"r": np.bool_(True)}, SITES, MAX_RANK)


def test_expert_sites_take_their_parameters_rank_and_alpha_patterns():
    """PEFT keys rank_pattern / alpha_pattern for target_parameters by the parameter's path (its
    "all-linear" on an MoE layer gives gate_up_proj twice the rank): an expert site matches them
    by the stack it adapts, not by its factors' module (PEFT's nested ParamWrapper)."""
    experts, k, n, rank = 3, 4, 6, 2
    module = "base_model.model.model.layers.1.mlp.experts.base_layer"
    site = {"lora_A": f"{module}.lora_A.default.weight", "lora_B": f"{module}.lora_B.default.weight",
            "in_features": k, "out_features": n, "dtype": "float32", "experts": experts,
            "parameter": "base_model.model.model.layers.1.mlp.experts.base_layer.base_layer.gate_up_proj"}
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((experts * rank, k)), rng.standard_normal((n, experts * rank))
    tensors = {f"{module}.lora_A.weight": a, f"{module}.lora_B.weight": b}
    config = {"peft_type": "LORA", "r": 1, "lora_alpha": 1, "rank_pattern": {r".*\.gate_up_proj": rank},
              "alpha_pattern": {r".*\.gate_up_proj": 8}}
    inputs = peft_adapter.prepare(tensors, config, [site], max_rank=4)
    prepared_a = inputs[site["lora_A"]].reshape(experts, 4, k)
    prepared_b = inputs[site["lora_B"]].reshape(n, 4, experts)
    assert np.allclose(prepared_a[:, :rank], a.reshape(experts, rank, k), rtol=1e-6)
    assert np.allclose(prepared_b[:, :rank], 8 / rank * b.reshape(n, rank, experts), rtol=1e-6)  # alpha / r
    with pytest.raises(AdapterError, match="1 per expert .its config.s rank. for 6 experts"):  # by the factors' module
        peft_adapter.prepare(tensors, config, [{**site, "parameter": None}], max_rank=4)
