"""Generation with a KV cache the module keeps (generate=True): greedy output against
transformers' `generate` token for token, for every row, in batches whose sequences join and
leave, per tenant adapter; sampling; and the errors. Prompts are drawn fresh (the seed is printed)."""

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model

import stageml
from stageml.errors import CompileError, InputError
from workloads import EXPERT_LORA, LLAMA_LORA, greedy, llama_tenants, random_factors, small_llama, small_mixtral

NEW = 8
LENGTHS = (5, 1, 9, 3, 7)  # five prompts over three cache slots: sequences join as others leave


def _prompts(seed: int) -> list:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 128, (n,), generator=generator).tolist() for n in LENGTHS]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    torch.manual_seed(0)
    model = small_llama()
    art = stageml.compile(model, generate=True, max_seq=64, sequences=3)
    path = art.save(str(tmp_path_factory.mktemp("gen") / "llama.vmfb"))
    return model, art, stageml.load(path), path


def test_greedy_generation_matches_transformers(llama):
    """Three slots, five prompts of different lengths: rows at different positions in one decode
    step, and each finished sequence's slot taken by a waiting prompt."""
    seed = torch.seed() % 2 ** 31
    print(f"seed {seed}")
    model, art, gen, _ = llama
    cache_bytes = 2 * 2 * 3 * 64 * 2 * 32 * 4  # keys, values of 2 layers: 3 slots x 64 x 2 KV heads of 32, f32
    assert art.generation == {"sequences": 3, "max_seq": 64, "eos": [model.generation_config.eos_token_id],
                              "tokens": "ids", "slots": "slots", "positions": "positions", "cache_bytes": cache_bytes}
    assert gen.cache_bytes == cache_bytes
    assert [a["name"] for a in gen.module.inputs] == ["ids", "slots", "positions"]
    prompts = _prompts(seed)
    out = gen.generate(prompts, max_new_tokens=NEW)
    assert out == [greedy(model, p, NEW) for p in prompts]
    assert gen.generate(prompts[:2], max_new_tokens=NEW) == out[:2]  # the cache's old contents do not leak


def test_eos_ends_a_sequence(llama):
    """A sequence ends at the model's end-of-sequence token (as transformers' does), at a given one,
    or at max_new_tokens with ignore_eos."""
    model, _, gen, _ = llama
    prompt = _prompts(1)[0]
    model_eos = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = None
    try:
        expected = greedy(model, prompt, NEW)  # NEW tokens, eos or not
    finally:
        model.generation_config.eos_token_id = model_eos
    eos = expected[2]
    assert gen.generate([prompt], max_new_tokens=NEW, eos_token_id=eos) == [expected[:expected.index(eos) + 1]]
    assert gen.generate([prompt], max_new_tokens=NEW, eos_token_id=[eos, -1]) == [expected[:expected.index(eos) + 1]]
    assert gen.generate([prompt], max_new_tokens=NEW, eos_token_id=eos, ignore_eos=True) == [expected]


def test_sampling_is_reproducible_by_seed(llama):
    _, _, gen, _ = llama
    prompts = _prompts(2)
    first = gen.generate(prompts, max_new_tokens=NEW, temperature=1.5, seed=7)
    assert first == gen.generate(prompts, max_new_tokens=NEW, temperature=1.5, seed=7)
    assert all(len(o) == NEW and all(0 <= t < 128 for t in o) for o in first)


def test_generation_refuses_what_does_not_fit(llama):
    _, _, gen, _ = llama
    with pytest.raises(InputError, match="do not fit the cache's 64 positions"):
        gen.generate([[1] * 60], max_new_tokens=8)
    with pytest.raises(InputError, match="prompt 1 is empty"):
        gen.generate([[1], []])
    with pytest.raises(InputError, match="max_new_tokens"):
        gen.generate([[1]], max_new_tokens=0)
    with pytest.raises(InputError, match="compiled without adapter slots"):
        gen.generate([[1]], adapters=["a"])
    with pytest.raises(InputError, match="cache slot 3 is outside 0..2"):
        gen.step([[1]], [3], [0])
    with pytest.raises(InputError, match="positions up to 64"):
        gen.step([[1, 2]], [0], [63])
    with pytest.raises(InputError, match="outside 0..127"):
        gen.generate([[1, 500]])
    with pytest.raises(InputError, match="integer token ids"):
        gen.generate([["a", "b"]])
    with pytest.raises(InputError, match="one row each"):
        gen.step([1, 2], [0], [0])
    with pytest.raises(InputError, match="is negative"):
        gen.step([[1]], [0], [-1])


def test_a_generation_step_is_no_staged_module(llama):
    from stageml.interop.torch import StagedModule

    with pytest.raises(InputError, match="which its Generator drives"):
        StagedModule(llama[3])


def test_generate_takes_the_model_alone():
    with pytest.raises(CompileError, match="pass the model alone"):
        stageml.compile(small_llama(), (torch.zeros(1, 2, dtype=torch.int64),), generate=True)
    with pytest.raises(CompileError, match="needs a transformers causal LM"):
        stageml.compile(torch.nn.Linear(4, 4), generate=True)


def _multi_query(family: str):
    from transformers import GPTBigCodeConfig, GPTBigCodeForCausalLM, LlamaConfig, LlamaForCausalLM
    if family == "llama":  # one KV head, by num_key_value_heads
        return LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=128))
    return GPTBigCodeForCausalLM(GPTBigCodeConfig(vocab_size=128, n_embd=128, n_layer=2, n_head=4, n_positions=128,
                                                  multi_query=True, initializer_range=0.2))  # (by multi_query)


@pytest.mark.parametrize("family", ["llama", "gpt_bigcode"])
def test_multi_query_generation_matches_transformers(tmp_path, family):
    """Models with one KV head: prompts of one token and of several (a prompt of two or more
    failed at run time), the cache's shape taken from what the model writes."""
    seed = torch.seed() % 2 ** 31
    print(f"seed {seed}")
    model = _multi_query(family).eval()
    art = stageml.compile(model, generate=True, max_seq=32, sequences=3)
    gen = art.load(str(tmp_path / "mqa.vmfb"))
    assert gen.cache_bytes == 2 * 2 * 3 * 32 * 1 * 32 * 4  # keys, values of 2 layers: 3 x 32 positions x 1 x 32, f32
    prompts = _prompts(seed)
    assert gen.generate(prompts, max_new_tokens=NEW) == [greedy(model, p, NEW) for p in prompts]


@pytest.mark.parametrize("policy", ["auto", "factorized"])
def test_mixed_tenant_generation_matches_peft(tmp_path, policy):
    """Two PEFT adapters and the base model in one run: each prompt's tokens are PEFT's with its
    adapter (merged calls under "auto", where a step's rows share one; per-row factors else)."""
    seed = torch.seed() % 2 ** 31
    print(f"seed {seed}")
    models = llama_tenants("ab", seed)
    art = stageml.compile(models["a"], generate=True, max_seq=64, sequences=3, max_adapters=2, max_rank=8)
    gen = art.load(str(tmp_path / "tenants.vmfb"), policy=policy)
    for name, model in models.items():
        gen.load_adapter(name, {k: v for k, v in model.state_dict().items() if "lora_" in k},
                         config=model.peft_config["default"])
    prompts, adapters = _prompts(seed), ["a", "b", None, "b", "a"]
    out = gen.generate(prompts, adapters=adapters, max_new_tokens=NEW)
    assert out == [greedy(models[a or "a"], p, NEW, base=a is None) for p, a in zip(prompts, adapters)]


def test_stagemlc_compiles_a_save_pretrained_directory(tmp_path, capsys):
    """`stagemlc models/llama -o out.vmfb --generate ... --lora-config adapters/a`: the model from a
    transformers save_pretrained directory, its LoRA sites from a PEFT adapter directory, which
    then loads as a tenant; against PEFT."""
    from stageml.tools import stagemlc

    seed = torch.seed() % 2 ** 31
    print(f"seed {seed}")
    torch.manual_seed(0)
    small_llama().save_pretrained(tmp_path / "llama")
    torch.manual_seed(0)
    base = small_llama()  # the same weights
    torch.manual_seed(seed)
    peft = random_factors(get_peft_model(base, LoraConfig(**LLAMA_LORA)), 0.3).eval()
    peft.save_pretrained(tmp_path / "adapter")
    assert stagemlc.main([str(tmp_path / "llama"), "-o", str(tmp_path / "out" / "llama.vmfb"), "--generate",
                          "--max-seq", "32", "--sequences", "2", "--max-adapters", "2", "--max-rank", "8",
                          "--lora-config", str(tmp_path / "adapter"), "-q"]) == 0
    gen = stageml.load(str(tmp_path / "out" / "llama.vmfb"))
    gen.load_adapter("a", str(tmp_path / "adapter"))
    prompts = _prompts(seed)[:3]
    out = gen.generate(prompts, adapters=["a", None, "a"], max_new_tokens=NEW)
    assert out == [greedy(peft, p, NEW, base=a is None) for p, a in zip(prompts, ["a", None, "a"])]
    assert stagemlc.main([str(tmp_path / "llama"), "-o", str(tmp_path / "x.vmfb"), "-q"]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"stagemlc: error: {str(tmp_path / 'llama')!r} is a directory: a transformers save_pretrained directory "
        "compiles with generate=True (stagemlc --generate)")


class _Recorder:
    """A Generator's stand-in for the Batcher: 3 cache slots, 2 adapter slots; each step's logits
    make token 7 the next (every row, every position); `fail` makes the next call raise."""

    sequences, max_seq = 3, 64

    def __init__(self):
        from types import SimpleNamespace
        self.module = SimpleNamespace(tenants={"max_adapters": 2})
        self.calls, self.fail = [], False

    def check(self, sequence, label):
        pass

    def check_adapter(self, sequence):
        pass

    def step(self, tokens, slots, positions, adapters):
        if self.fail:
            self.fail = False
            raise InputError("the call failed")
        self.calls.append((tokens, slots, positions, adapters))
        logits = np.zeros((len(tokens), len(tokens[0]), 8))
        logits[..., 7] = 1
        return logits


def test_batcher_schedules_first_come_first_served():
    """Prompts right-padded into one prefill call; a prompt whose adapter would exceed the adapter
    slots waits, and the ones behind it wait with it; an abort and a failed call free their slots."""
    from stageml.runtime.generation import PAD, Batcher, Sequence

    recorder = _Recorder()
    batcher = Batcher(recorder)
    a, b, c, a2 = (Sequence([1, 2, 3][:n], name, max_tokens=2) for n, name in ((3, "a"), (1, "b"), (2, "c"), (2, "a")))
    for sequence in (a, b, c, a2):
        batcher.add(sequence)
    assert batcher.step() == [a, b]  # c needs a third adapter slot; a2 waits behind it, a cache slot free
    slots = [a.slot, b.slot]
    assert recorder.calls[-1] == ([[1, 2, 3], [1, PAD, PAD]], slots, [0, 0], ["a", "b"])
    assert a.tokens == b.tokens == [7] and batcher.last_call == ("prefill", 2)
    assert batcher.step() == [a, b] and a.finish == b.finish == "length"  # the decode at positions 3 and 1
    assert recorder.calls[-1] == ([[7], [7]], slots, [3, 1], ["a", "b"]) and a.slot is None
    assert batcher.step() == [c, a2]  # both slots free again: c and then a2
    assert batcher.abort(c) and c.finish == "abort" and not batcher.abort(c)
    recorder.fail = True
    assert batcher.step() == [a2] and (a2.finish, str(a2.error)) == ("error", "the call failed")
    assert not batcher.busy
    again = [Sequence([5], None) for _ in range(3)]
    for sequence in again:
        batcher.add(sequence)
    assert batcher.step() == again and sorted(s.slot for s in again) == [0, 1, 2]  # every slot free


def test_moe_generation_matches_peft(tmp_path):
    """A tiny Mixtral with expert LoRA (target_parameters) on two tenants and the base model in
    mixed batches, against PEFT's greedy generate. Fixed prompts and factors: with fresh draws a
    routing near-tie (two experts' router scores equal to rounding) would decide a token by the
    last bit, which is no disagreement between the two."""
    models = {}
    for i, name in enumerate("ab"):
        torch.manual_seed(0)
        base = small_mixtral()
        torch.manual_seed(100 + i)
        models[name] = random_factors(get_peft_model(base, LoraConfig(**EXPERT_LORA)), 0.1).eval()
    art = stageml.compile(models["a"], generate=True, max_seq=32, sequences=3, max_adapters=2, max_rank=8)
    gen = art.load(str(tmp_path / "mixtral.vmfb"))
    for name, model in models.items():
        gen.load_adapter(name, {k: v for k, v in model.state_dict().items() if "lora_" in k},
                         config=model.peft_config["default"])
    prompts, adapters = [[3, 9, 27, 11], [5], [7, 7], [100, 4, 2]], ["a", "b", None, "a"]
    out = gen.generate(prompts, adapters=adapters, max_new_tokens=6, ignore_eos=True)
    for model in models.values():
        model.generation_config.eos_token_id = None
    assert out == [greedy(models[a or "a"], p, 6, base=a is None) for p, a in zip(prompts, adapters)]
