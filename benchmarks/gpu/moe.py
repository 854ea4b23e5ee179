"""MoE residuals on an H200: a tiny PEFT Mixtral with expert LoRA, fp16, against float64 PyTorch.

    python3 benchmarks/gpu/moe.py ARTIFACTS_DIR [REPORT.md]    # run_h200.sh runs it

The artifacts (prepare.py): workloads.small_mixtral() with workloads.EXPERT_LORA
(q_proj / v_proj and both expert stacks, random factors) compiled for sm90 and
for cuda with the adapter merged, and for sm90 with 2 tenant slots. Checks,
each on fresh random token ids: the single-tenant residuals at 1x2, 1x16 and
4x20 ids (numpy and torch CUDA tensors in); the multi-tenant one with two
more PEFT adapters (adapters/m0, m1) and the base model mixed in one batch,
under both policies, each row against PEFT with that row's adapter active
(PEFT refuses mixed batches with expert LoRA). The float64 references run on
the CPU, with transformers' eager experts (its default, grouped_mm, has no
float64). Routing is top-2 of 8 experts: a token whose router scores are
near-tied in float64 may pick other experts in fp16, which no tolerance hides.
"""

import copy
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from h200 import BOUNDS, check, finish, rel_err, tenant_module  # noqa: E402

import stageml  # noqa: E402
from workloads import EXPERT_LORA, Logits, decisively_routed, small_mixtral  # noqa: E402

SHAPES = ((1, 2), (1, 16), (4, 20))  # (the export takes sequences of 2 tokens or more)
ADAPTERS = ("m0", "m1")
ROUTING_MARGIN, TRIES = 1e-3, 300


def peft_mixtral(art_dir: str):
    """The compiled PEFT Mixtral (its base and its own adapter), float64, on the CPU."""
    from peft import LoraConfig, get_peft_model

    model = Logits(get_peft_model(small_mixtral(), LoraConfig(**EXPERT_LORA))).half().eval()
    model.load_state_dict(torch.load(os.path.join(art_dir, "mixtral.pt")))
    for module in model.modules():  # transformers' default experts (grouped_mm) have no float64
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_experts_implementation"):
            config._experts_implementation = "eager"
    return model.double()


def single(art_dir: str, reference) -> list:
    lines = []
    for target in ("sm90", "cuda"):
        mod = stageml.load(os.path.join(art_dir, f"mixtral-f16-{target}.vmfb"))
        for batch, seq in SHAPES:
            ids, expected = decisively_routed(reference, reference, (batch, seq), ROUTING_MARGIN, TRIES)
            for kind, got in (("numpy", mod(ids.numpy())), ("torch", mod(ids.cuda()))):
                err = rel_err(got, expected)
                check(f"mixtral f16 {target} {batch}x{seq}, {kind} in", err, BOUNDS["f16"])
                lines.append(f"| {target} | {batch}x{seq} | {kind} | {err:.1e} |")
    return lines


def tenants(art_dir: str, reference) -> list:
    peft = copy.deepcopy(reference.m)
    for name in ADAPTERS:
        peft.load_adapter(os.path.join(art_dir, "adapters", name), adapter_name=name)
    peft = peft.double().eval()
    rows = ["m0", None, "m1", "m0"]

    def per_row(ids):  # each row by PEFT with its own adapter (or none)
        expected = []
        for i, name in enumerate(rows):
            if name is None:
                with peft.disable_adapter():
                    expected.append(peft(input_ids=ids[i:i + 1], use_cache=False).logits)
            else:
                peft.set_adapter(name)
                expected.append(peft(input_ids=ids[i:i + 1], use_cache=False).logits)
        return expected

    ids, expected = decisively_routed(peft, per_row, (len(rows), 12), ROUTING_MARGIN, TRIES)
    lines = []
    for policy in ("factorized", "merged"):
        mod = tenant_module(art_dir, "mixtral-tenants-f16-sm90", policy, ADAPTERS)
        got = mod.run_batch(ids.numpy(), rows)
        for i, name in enumerate(rows):
            err = rel_err(got[i:i + 1], expected[i])
            check(f"mixtral tenants f16 sm90 {policy}, row {i} ({name or 'base'}) of a mixed batch", err,
                  BOUNDS["f16"])
            lines.append(f"| sm90, {policy} | row {i} of 4x12 | {name or 'base'} | {err:.1e} |")
        err = rel_err(mod.run_batch(ids[:1].numpy(), ["m0"]), expected[0])
        check(f"mixtral tenants f16 sm90 {policy}, one tenant", err, BOUNDS["f16"])
        lines.append(f"| sm90, {policy} | 1x12, one tenant | m0 | {err:.1e} |")
    return lines


def main() -> int:
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    reference = peft_mixtral(sys.argv[1])
    lines = ["## MoE: a tiny PEFT Mixtral with expert LoRA (moe.py, fp16, rel. err against float64)", "",
             "| residual | ids | in / adapter | rel. err |", "|---|---|---|---:|"]
    lines += single(sys.argv[1], reference) + tenants(sys.argv[1], reference)
    return finish("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
