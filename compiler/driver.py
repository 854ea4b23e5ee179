"""The compile driver: an ordered mapping of stages, each a compile step.

    torch  → .torch.mlir   torch backend IR of the model
    bt     → .bt.mlir      annotated, improved, lifted (bt-annotate … bt-lift)
    split  → .split.mlir   @static, @adapter, @forward (bt-split, flatten-matmul)
    linalg → .linalg.mlir  each stage lowered by torch-mlir
    iree   → .iree.mlir    @static evaluated; the residual as IREE input
                           (parameters, adapter state, packed weights; for
                           sm90, the Hopper target and custom kernels)
    vmfb   → .vmfb         the residual compiled by IREE

`compile(..., emit=STAGE)` stops after STAGE; `dump_dir` writes every stage's
output as it is produced.

Multi-tenant compiles (`max_adapters`) first rebuild every LoRA site with
rank-`max_rank` factors (lora-sites), then build two programs from it:
merged (bt-improve folds each adapter into its own weights; @adapter and
@forward) and factorized (per-row gathers of the factors; @adapter_factorized
and @forward_factorized, suffixed). Both go into one .vmfb; static values
they share are folded and stored once.
"""

import collections
import hashlib
import os
import sys
import time

import numpy as np
from torch_mlir import ir

from stageml.binding_time import BindingTime
from stageml.compiler import frontend, lowering, stage_spec
from stageml.compiler.artifact import Artifact
from stageml.compiler.ir import TIME, is_rematerializable, new_context, parse_time
from stageml.compiler.partial_eval import evaluate_static
from stageml.compiler.passes import PassOptions, main_func, run_passes
from stageml.compiler.report import Report
from stageml.errors import CompileError
from stageml.runtime.module import as_numpy

STAGES = {"torch": ".torch.mlir", "bt": ".bt.mlir", "split": ".split.mlir",
          "linalg": ".linalg.mlir", "iree": ".iree.mlir", "vmfb": ".vmfb"}

BT_PIPELINE = ("bt-annotate", "bt-propagate", "bt-verify", "bt-improve", "bt-verify",
               "bt-lift", "bt-verify")
SITES_PIPELINE = ("bt-annotate", "bt-propagate", "bt-verify", "lora-sites", "bt-verify")
MERGED_PIPELINE = ("bt-improve", "bt-verify", "bt-lift", "bt-verify")
FACTORIZED_PIPELINE = ("bt-lift", "bt-verify", "bt-gather", "bt-verify")
SPLIT_PIPELINE = ("bt-split", "flatten-matmul")
FACTORIZED = "_factorized"  # the suffix of the factorized program's functions

TARGETS = tuple(lowering.TARGETS)


def _count_ops(module) -> dict:
    counts = collections.Counter()
    for op in main_func(module.operation).regions[0].blocks[0].operations:
        op = op.operation
        if op.name == "bt.lift" or TIME not in op.attributes or not len(op.results):
            continue
        if not is_rematerializable(op.results[0]):
            counts[parse_time(op.attributes[TIME]).label] += 1
    return {t.label: counts.get(t.label, 0) for t in BindingTime}


def _text(programs: dict) -> str:
    if len(programs) == 1:
        return str(next(iter(programs.values())))
    return "\n".join(f"// program: {suffix.strip('_') or 'merged'}\n{m}" for suffix, m in programs.items())


def _bt_programs(module, options) -> dict:
    """{function suffix: module} after the binding-time passes."""
    if options.max_rank is None:
        run_passes(module, BT_PIPELINE, options)
        return {"": module}
    run_passes(module, SITES_PIPELINE, options)
    if not options.sites:
        raise CompileError("the model has no LoRA site (x@W + s*(x@A^T)@B^T with adapter-time PEFT lora_A/lora_B "
                           "weights): compile a PEFT LoRA model, or compile without max_adapters")
    factorized = ir.Module.create(loc=module.operation.location)
    for op in module.body.operations:
        op.operation.clone(ip=ir.InsertionPoint(factorized.body))
    run_passes(module, MERGED_PIPELINE, options)
    factorized_options = PassOptions(stages=options.stages, lift_prefix="factorized.")
    run_passes(factorized, FACTORIZED_PIPELINE, factorized_options)
    options.stats["gathered"] += factorized_options.stats["gathered"]
    return {"": module, FACTORIZED: factorized}


def _split(programs: dict, options) -> dict:
    """Splits each program, suffixing its functions' names; returns all signatures."""
    sigs = {}
    for suffix, module in programs.items():
        run_passes(module, SPLIT_PIPELINE, options)
        for func in module.body.operations:
            name = ir.StringAttr(func.attributes["sym_name"]).value + suffix
            func.attributes["sym_name"] = ir.StringAttr.get(name)
        sigs.update(lowering.signatures(module))
    return sigs


def _share_folded(folded: dict, sigs: dict) -> dict:
    """Stores each folded value once: a later program's value equal to an
    earlier one is renamed to it in `sigs`. Returns the values kept."""
    kept, by_content, renamed = {}, {}, {}
    for name, value in folded.items():
        key = (value.dtype.str, value.shape, hashlib.blake2b(np.ascontiguousarray(value).view(np.uint8).data).digest())
        if key in by_content:
            renamed[name] = by_content[key]
        else:
            by_content[key], kept[name] = name, value
    for sig in sigs.values():
        for arg in sig.args:
            if arg.time == "static":
                arg.name = renamed.get(arg.name, arg.name)
    return kept


def compile(model, args=None, *, stages=None, dynamic_shapes=None, target="cpu", emit="vmfb",
            dump_dir=None, merge_lora=True, max_adapters=None, max_rank=16, custom_kernels=True,
            verbose=False) -> Artifact:
    """Compiles `model` into a staged artifact. See `stageml.compile`."""
    if emit not in STAGES:
        raise CompileError(f"unknown stage {emit!r} to emit: choose one of {', '.join(STAGES)}")
    if target not in TARGETS:
        raise CompileError(f"unknown target {target!r}: choose one of {', '.join(TARGETS)}")
    if max_adapters is not None and (int(max_adapters) < 1 or int(max_rank) < 1):
        raise CompileError(f"max_adapters ({max_adapters}) and max_rank ({max_rank}) must be at least 1")
    if max_adapters is not None and not merge_lora:
        raise CompileError("a multi-tenant residual holds both forms and chooses per adapter when serving: "
                           "drop --no-lora-merge (merge_lora=False) and load with policy='factorized' instead")
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
                          merge_lora=merge_lora, max_rank=None if max_adapters is None else int(max_rank))
    module = imported.module
    with context:
        if done("torch", str(module)):
            return art
        programs = _bt_programs(module, options)
        ops = _count_ops(module)
        art.report = Report.from_stats(ops, options.stats)
        if done("bt", _text(programs)):
            return art
        sigs = _split(programs, options)
        art.report = Report.from_stats(ops, options.stats)
        if done("split", _text(programs)):
            return art
    linalg = lowering.to_linalg(*programs.values())
    if done("linalg", linalg):
        return art

    folded = {}
    for suffix in programs:
        if "static" + suffix in sigs:
            folded.update(evaluate_static(linalg, sigs["static" + suffix], imported.weights))
    folded = _share_folded(folded, sigs)
    art.report.folded_values = len(folded)
    art.report.folded_bytes = sum(v.nbytes for v in folded.values())
    residual = lowering.residual_module(linalg, sigs, slots=max_adapters or 0,
                                        packs_weights=lowering.TARGETS[target].packs_weights)
    if lowering.TARGETS[target].hopper:
        from stageml.compiler import sm90
        residual, art.report.custom_kernels = sm90.run_pipeline(residual, custom_kernels)
    if done("iree", residual):
        return art
    art.vmfb = lowering.compile_module(residual, "residual", target)
    used = [a for sig in sigs.values() if lowering.stage_time(sig.stage) != BindingTime.STATIC
            for a in sig.args if a.time == "static"]
    art.parameters = {**{a.name: as_numpy(imported.weights[a.name]) for a in used if a.name not in folded}, **folded}
    if max_adapters is None and "adapter" in sigs:
        art.default_adapter = {a.name: as_numpy(imported.weights[a.name])
                               for a in sigs["adapter"].args if a.time == "adapter"}
    if max_adapters is not None:
        art.tenants = {"max_adapters": int(max_adapters), "max_rank": int(max_rank), "sites": options.sites}
    art.signatures = sigs
    art.target = target
    done("vmfb", art.vmfb)
    return art
