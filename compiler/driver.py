"""The compile driver: an ordered mapping of stages, each a compile step.

    torch  → .torch.mlir   torch backend IR of the model
    bt     → .bt.mlir      annotated, improved, lifted (bt-annotate … bt-lift)
    split  → .split.mlir   @static, @adapter, @forward (bt-split, flatten-matmul)
    linalg → .linalg.mlir  each stage lowered by torch-mlir
    iree   → .iree.mlir    @static evaluated; the residual as IREE input
                           (parameters, adapter state, packed weights)
    vmfb   → .vmfb         the residual compiled by IREE

`compile(..., emit=STAGE)` stops after STAGE; `dump_dir` writes every stage's
output as it is produced.
"""

import collections
import os
import sys
import time

from stageml.binding_time import BindingTime
from stageml.compiler import frontend, lowering, stage_spec
from stageml.compiler.artifact import Artifact
from stageml.compiler.ir import TIME, is_rematerializable, new_context, parse_time
from stageml.compiler.partial_eval import evaluate_static
from stageml.compiler.passes import PassOptions, main_func, run_passes
from stageml.compiler.report import Report
from stageml.errors import CompileError

STAGES = {"torch": ".torch.mlir", "bt": ".bt.mlir", "split": ".split.mlir",
          "linalg": ".linalg.mlir", "iree": ".iree.mlir", "vmfb": ".vmfb"}

BT_PIPELINE = ("bt-annotate", "bt-propagate", "bt-verify", "bt-improve", "bt-verify",
               "bt-lift", "bt-verify")
SPLIT_PIPELINE = ("bt-split", "flatten-matmul")

TARGETS = ("cpu",)


def _count_ops(module) -> dict:
    counts = collections.Counter()
    for op in main_func(module.operation).regions[0].blocks[0].operations:
        op = op.operation
        if op.name == "bt.lift" or TIME not in op.attributes or not len(op.results):
            continue
        if not is_rematerializable(op.results[0]):
            counts[parse_time(op.attributes[TIME]).label] += 1
    return {t.label: counts.get(t.label, 0) for t in BindingTime}


def compile(model, args=None, *, stages=None, dynamic_shapes=None, target="cpu", emit="vmfb",
            dump_dir=None, merge_lora=True, verbose=False) -> Artifact:
    """Compiles `model` into a staged artifact. See `stageml.compile`."""
    if emit not in STAGES:
        raise CompileError(f"unknown stage {emit!r} to emit: choose one of {', '.join(STAGES)}")
    if target not in TARGETS:
        raise CompileError(f"unknown target {target!r}: choose one of {', '.join(TARGETS)}")
    art = Artifact()
    started = time.perf_counter()

    def done(stage, text):
        art.mlir[stage] = text
        if dump_dir:
            os.makedirs(dump_dir, exist_ok=True)
            mode = "wb" if isinstance(text, bytes) else "w"
            with open(os.path.join(dump_dir, "model" + STAGES[stage]), mode) as f:
                f.write(text)
        if verbose:
            print(f"[stageml] {stage:<6} {time.perf_counter() - started:6.1f}s", file=sys.stderr, flush=True)
        return stage == emit

    program = frontend.export(model, args, dynamic_shapes)
    context = new_context()
    imported = frontend.import_program(program, context)
    options = PassOptions(stages=stage_spec.resolve(imported.arg_names, set(imported.weights), stages),
                          merge_lora=merge_lora)
    module = imported.module
    with context:
        if done("torch", str(module)):
            return art
        run_passes(module, BT_PIPELINE, options)
        ops = _count_ops(module)
        if done("bt", str(module)):
            art.report = Report.from_stats(ops, options.stats)
            return art
        run_passes(module, SPLIT_PIPELINE, options)
        art.report = Report.from_stats(ops, options.stats)
        if done("split", str(module)):
            return art
        sigs = lowering.signatures(module)
    linalg = lowering.to_linalg(module)
    if done("linalg", linalg):
        return art

    folded = evaluate_static(linalg, sigs["static"], imported.weights) if "static" in sigs else {}
    art.report.folded_values = len(folded)
    art.report.folded_bytes = sum(v.nbytes for v in folded.values())
    residual = lowering.residual_module(linalg, sigs)
    if done("iree", residual):
        return art
    vmfb = lowering.compile_cpu(residual, "residual")
    adapter_args = [a for a in sigs.get("adapter", lowering.Signature("adapter", [], [])).args if a.time == "adapter"]
    art.vmfb = vmfb
    used = [a for sig in sigs.values() if sig.stage != "static" for a in sig.args if a.time == "static"]
    art.parameters = {**{a.name: imported.weights[a.name].numpy() for a in used if a.name not in folded}, **folded}
    art.default_adapter = {a.name: imported.weights[a.name].numpy() for a in adapter_args}
    art.signatures = sigs
    art.target = target
    done("vmfb", vmfb)
    return art
