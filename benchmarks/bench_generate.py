"""Generation benchmark: StageML's Generator against transformers + PEFT `generate`, in one process.

    .venv/bin/python benchmarks/bench_generate.py [--report FILE]    # about 3 minutes on 2 cores, if idle

The model: workloads.small_llama() (LlamaForCausalLM, vocab 128, hidden 128, 2 layers)
with 8 random PEFT LoRA adapters (workloads.LLAMA_LORA, r=8 on q/v/o/gate_proj), float32,
on the CPU. Each workload generates 32 new tokens (greedy, end-of-sequence ignored) for
1 or 8 prompts of 8-15 tokens, over 1 adapter or 8 (one a prompt).

  stageml       the Generator (generate=True, max_seq 64, 8 sequence slots, max_adapters 8,
                policy "auto"): one prefill call a prompt, then one call a step for all
                running sequences
  peft          transformers' generate on the PEFT model, the prompts in one left-padded
                batch with adapter_names (PEFT's mixed-adapter batch)

Before timing, StageML's tokens are checked against PEFT's generate of each prompt alone
(token for token). Each figure: the median of 5 runs after 1 warm-up; tokens/s counts the
generated tokens of all prompts; time to first token is StageML's first prefill call.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
from peft import LoraConfig, get_peft_model

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stageml  # noqa: E402
from harness import cpu_model, report  # noqa: E402
from workloads import LLAMA_LORA, random_factors, small_llama  # noqa: E402

NEW, ADAPTERS, RUNS = 32, 8, 5


def _model():
    """The PEFT Llama with ADAPTERS adapters a0.. (random factors), and each one's tensors."""
    torch.manual_seed(0)
    model = get_peft_model(small_llama(), LoraConfig(**LLAMA_LORA), adapter_name="a0")
    for i in range(1, ADAPTERS):
        model.add_adapter(f"a{i}", LoraConfig(**LLAMA_LORA))
    random_factors(model, 0.3)
    tensors = {f"a{i}": {k.replace(f".a{i}.", ".default."): v for k, v in model.state_dict().items()
                         if f".a{i}." in k} for i in range(ADAPTERS)}
    return model.eval(), tensors


def _peft_generate(model, prompts: list, adapters: list, new: int = NEW) -> list:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, adapter_names=adapters, max_new_tokens=new,
                             do_sample=False, pad_token_id=0)
    return out[:, width:].tolist()


def _timed(fn) -> float:
    fn()
    times = []
    for _ in range(RUNS):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", help="also write the table (Markdown) to this file")
    args = parser.parse_args()
    model, tensors = _model()
    model.generation_config.eos_token_id = None
    with tempfile.TemporaryDirectory() as out:
        art = stageml.compile(model, generate=True, max_seq=64, sequences=8, max_adapters=ADAPTERS, max_rank=8)
        gen = art.load(os.path.join(out, "llama.vmfb"))
    for name, values in tensors.items():
        gen.load_adapter(name, values, config=model.peft_config[name])
    generator = torch.Generator().manual_seed(1)
    lines = [f"# Generation on the CPU ({cpu_model()}, {os.cpu_count()} cores), torch {torch.__version__}", "",
             f"{NEW} new tokens a prompt, greedy; tokens/s over all prompts; median of {RUNS} runs.", "",
             "| prompts | adapters | StageML tok/s | transformers+PEFT tok/s | ratio | StageML first token ms |",
             "|---:|---:|---:|---:|---:|---:|"]
    for count, distinct in ((1, 1), (8, 1), (8, 8)):
        prompts = [torch.randint(0, 128, (8 + i,), generator=generator).tolist() for i in range(count)]
        adapters = [f"a{i % distinct}" for i in range(count)]
        expected = [_peft_generate(model, [p], [a])[0] for p, a in zip(prompts, adapters)]
        got = gen.generate(prompts, adapters=adapters, max_new_tokens=NEW, ignore_eos=True)
        if got != expected:
            print(f"StageML's tokens differ from PEFT's ({count} prompts, {distinct} adapters)", file=sys.stderr)
            return 1
        staged = _timed(lambda: gen.generate(prompts, adapters=adapters, max_new_tokens=NEW, ignore_eos=True))
        peft = _timed(lambda: _peft_generate(model, prompts, adapters))
        first = _timed(lambda: gen.step([prompts[0]], [0], [0], [adapters[0]]))
        tokens = count * NEW
        lines.append(f"| {count} | {distinct} | {tokens / staged:.0f} | {tokens / peft:.0f} | {peft / staged:.2f}x | "
                     f"{first * 1e3:.2f} |")
        print(lines[-1], flush=True)
    report(lines, args.report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
