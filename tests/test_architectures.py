"""The architecture sweep: each causal-LM family of the installed transformers as a tiny
random-weight model with PEFT LoRA on every linear layer (tests/architectures.py), exported
once, compiled single-tenant (the adapter merged) and multi-tenant (max_adapters, the adapter
loaded from its save_pretrained directory), each module run at two shapes against PEFT.

The default run takes FAST; `make sweep` (`pytest -m sweep tests/test_architectures.py`) takes
every family. A family StageML cannot compile or run must fail with one line of StageMLError
(UNSUPPORTED says which and why); the README lists the outcome of the last sweep.
"""

import random

import pytest
import torch
from torch.export import Dim

import stageml
from architectures import families, tiny_peft_model
from models import CausalLM, rel_err
from stageml.compiler import frontend
from stageml.errors import StageMLError

FAST = ("llama", "gpt2", "opt", "falcon", "gpt_bigcode", "gemma2", "phi3", "gpt_neox", "qwen3_moe")
BOUND = 1e-4
_FIXED_SEQ = (r"torch.export failed on the model.*Constraints violated \(seq\)",
              "the model fixes the sequence length (a chunked scan or linear attention, or positions of a fixed "
              "length): torch.export refuses a dynamic sequence dim")
_ONE_ROW = (r"the residual refused 'ids' \(input\d+ shape dimension 0 mismatch; expected 1 but have",
            "IREE compiles its residual for one row (batch 1), a dimension its export leaves dynamic: a call of "
            "more rows is refused")
_TOP_KEYS = (r"torch.export failed on the model .*satisfy the generated guard min\(2048, L\['ids'\]\.size\(\)\[1\]\)",
             "its sparse attention's indexer keeps min(2048, seq) keys: torch.export cannot prove "
             "min(2048, seq) <= seq over a dynamic sequence")
UNSUPPORTED = {  # family or "family-mode" -> (a regex of the one-line StageMLError it raises, why)
    **dict.fromkeys(["aria_text", "bailing_hybrid", "bamba", "cpmant", "falcon_h1", "falcon_mamba",
                     "granitemoehybrid", "jamba", "kimi_linear", "mamba", "mamba2", "minimax", "nemotron_h",
                     "olmo_hybrid", "qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text",
                     "qwen4_exp", "qwen4_exp_text", "recurrent_gemma", "rwkv", "xlstm", "zamba", "zamba2"], _FIXED_SEQ),
    "zaya": (_FIXED_SEQ[0], "its queries' and keys' convolution over the sequence branches on seq == 2: "
                            "torch.export refuses a dynamic sequence dim"),
    "deepseek_v4": (_FIXED_SEQ[0], "its compressed sparse attention pools its keys in windows of 4 tokens and branches "
                                   "on their count (seq // 4): torch.export refuses a dynamic sequence dim"),
    "inkling_text": _ONE_ROW,
    "jetmoe": (r"failed to legalize operation 'torch.constant.int'",
               "torch-mlir's backend lowering leaves a torch.constant.int of its MoE attention unconverted"),
    **dict.fromkeys(["axk2", "deepseek_v32", "dots3_note", "dots3_note_text", "glm_moe_dsa", "hy_v4"], _TOP_KEYS),
    "inkling2_text": (r"the residual refused the call: not all strides are default",
                      "torch-mlir lowers a strided view of its attention with a run-time check that the strides are "
                      "the default ones, and they are not"),
    **dict.fromkeys(["deepseek_v2", "llama4", "llama4_text"], (
        r"the model failed to lower to linalg: 'torch.aten._assert_tensor_metadata' op Failed to canonicalize .* "
        r"dtype does not match",
        "its rotary embedding is complex (torch.polar, view_as_complex): torch-mlir fails the dtype check of the "
        "complex tensor's .to()")),
    "longcat_flash": (r"torch.export failed on the model at .*modeling_longcat_flash.py:\d+ "
                      r"\(GuardOnDataDependentSymNode",
                      "its MoE loops over the experts its tokens hit (nonzero, item), which StageML's expert export "
                      "form does not replace: torch.export cannot trace that loop"),
    "blt": (r"torch.export failed on the model at .*modeling_blt.py:\d+ \(GuardOnDataDependentSymNode",
            "its entropy patcher checks a Categorical over its own logits (a data-dependent .all()) and sizes its "
            "patches from their entropies (.item()): torch.export cannot trace that data-dependent patching"),
    "dbrx": (r"torch.export failed on the model at .*modeling_dbrx.py:\d+ \(GuardOnDataDependentSymNode",
             "its MoE loops over the experts its tokens hit (nonzero), in its own module rather than transformers' "
             "experts interface, which StageML's expert export form replaces: torch.export cannot trace that loop"),
    "cohere_compass_text": (r"IREE failed to compile the residual at <unknown>:0: LLVM Translation failed for "
                            r"operation: builtin.unrealized_conversion_cast",
                            "IREE 3.13's CPU codegen fails on its interleaved M-RoPE (the frequencies' strided slice, "
                            "freq[dim, ..., 1::3], read from a broadcast): on every data-tiling path"),
    "mpt": (r"torch-mlir could not import the model: .*Max\(0, 1 - s\d+\)",
            "torch-mlir's FX importer cannot import the symbolic size Max(0, 1 - seq) of MPT's ALiBi positions"),
    "xlnet": (r"torch.export failed on the model .*satisfy the generated guard .*2\*L\['ids'\]\.size\(\)\[1\]\) % "
              r"L\['ids'\]\.size\(\)\[1\]\) != 0",
              "its relative attention's shift (rel_shift_bnij) reshapes the seq x 2 seq position scores: torch.export "
              "cannot prove (2 seq - 1) % seq != 0 over a dynamic sequence, though it holds for every seq >= 2"),
    "prophetnet": (r"torch.export failed on the model .*satisfy the generated guard .*4\*L\['ids'\]\.size\(\)\[1\]\) "
                   r"// L\['ids'\]\.size\(\)\[1\]\) == 3",
                   "its n-gram attention chunks its main and 2 predict streams (3 seq rows) in 3: torch.export cannot "
                   "prove the chunk count (4 seq - 1) // seq == 3 over a dynamic sequence, though it holds for every "
                   "seq >= 1"),
    "reformer": (r"torch.export failed on the model.*Constraints violated \(batch\)",
                 "its axial position embeddings select each row's positions in a loop over the batch "
                 "(for i in range(batch_size)): torch.export refuses a dynamic batch dim"),
    "xmod": (r"torch.export failed on the model at .*modeling_xmod.py:\d+ \(ValueError: Input language unknown",
             "X-MOD routes each input through a language's adapter modules: export it after "
             "set_default_language(...)"),
}
SHAPES = {"single": [(1, 7), (3, 4)], "multi": [(2, 7), (3, 4)]}
VOCAB = 128


def _params():
    return [pytest.param(f, id=f, marks=() if f in FAST else pytest.mark.sweep) for f in families()]


@pytest.fixture(scope="module", params=_params())
def family(request, tmp_path_factory):
    """(name, PEFT model, its export with dynamic batch and sequence, its adapter directory)."""
    name = request.param
    seed = random.randrange(1 << 16)
    print(f"{name}: seed {seed}")
    model = tiny_peft_model(name, seed)
    directory = tmp_path_factory.mktemp(name.replace("-", "_"))
    model.save_pretrained(str(directory / "adapter"))
    ids = torch.randint(0, VOCAB, (2, 5))
    dims = {"ids": {0: Dim("batch", max=16), 1: Dim("seq", max=32)}}
    try:
        exported = frontend.export(CausalLM(model).eval(), (ids,), dims)
    except StageMLError as e:
        exported = e
    return name, model, exported, directory


def _reference(model, ids, adapter: bool):
    with torch.no_grad():  # no cache, as exported (CausalLM): LFM3's cache refuses its own linear attention layers
        if adapter:
            return model(input_ids=ids, use_cache=False).logits
        with model.disable_adapter():
            return model(input_ids=ids, use_cache=False).logits


def _compile(family, mode: str):
    name, model, exported, directory = family
    if isinstance(exported, StageMLError):
        raise exported
    options = dict(max_adapters=2, max_rank=8) if mode == "multi" else {}
    art = stageml.compile(exported, **options)
    mod = art.load(str(directory / f"{mode}.vmfb"))
    if mode == "multi":
        mod.load_adapter("a", str(directory / "adapter"))
    return mod


def _check(family, mode: str) -> None:
    """Compiles `family` in `mode` and compares its module with PEFT at SHAPES[mode]."""
    name, model = family[:2]
    mod = _compile(family, mode)
    for rows, tokens in SHAPES[mode]:
        ids = torch.randint(0, VOCAB, (rows, tokens))
        if mode == "single":
            assert rel_err(mod(ids), _reference(model, ids, True)) <= BOUND, (name, rows, tokens)
            continue
        adapters = ["a", None, "a"][:rows]
        out = mod.run_batch(ids, adapters=adapters)
        for i, adapter in enumerate(adapters):
            expected = _reference(model, ids[i:i + 1], adapter is not None)
            assert rel_err(out[i:i + 1], expected) <= BOUND, (name, mode, rows, tokens, i)


@pytest.mark.parametrize("mode", ["single", "multi"])
def test_family_matches_peft(family, mode):
    name = family[0]
    unsupported = UNSUPPORTED.get(f"{name}-{mode}", UNSUPPORTED.get(name))
    if unsupported is None:
        _check(family, mode)
        return
    pattern, _ = unsupported
    with pytest.raises(StageMLError, match=pattern) as e:
        _check(family, mode)
    assert "\n" not in str(e.value)
