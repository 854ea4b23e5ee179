"""The compile driver: one declared pipeline, an ordered mapping from each
stage to the step that produces it from the stage before.

    torch  → .torch.mlir   torch backend IR of the model (frontend)
    bt     → .bt.mlir      binding times: annotated, improved, lifted; for a
                           multi-tenant compile also LoRA sites, the factorized
                           program and its per-row gathers (BT_PIPELINE)
    split  → .split.mlir   stage functions with their facts (SPLIT_PIPELINE)
    linalg → .linalg.mlir  lowered by torch-mlir, in IREE's context
    iree   → .iree.mlir    @static evaluated now (partial evaluation); the
                           residual as IREE input (RESIDUAL_PIPELINE, then
                           the target's own passes)
    vmfb   → .vmfb         the residual compiled by IREE for the target

Every stage can be dumped (`dump_dir`: `model<suffix>`, printed with
locations, plus the weights as `model.weights.safetensors` and the folded
values as `model.folded.safetensors`), and a compile can start from any
dumped file: `stageml.compile("out/model.split.mlir")` picks up there, so
every dump is a reproducer.
"""

import collections
import dataclasses
import hashlib
import os
import sys
import time

import numpy as np

from stageml.binding_time import BindingTime
from stageml.compiler import entry_points, facts, frontend, generation, lowering, stage_spec
from stageml.compiler.artifact import Artifact
from stageml.compiler.ir import TIME, is_rematerializable, new_context, parse_time
from stageml.compiler.options import EMITS, CompileOptions
from stageml.compiler.partial_eval import evaluate_static
from stageml.compiler.passes import programs, run_passes
from stageml.compiler.passes.bt_annotate import BtAnnotateOptions
from stageml.compiler.passes.bt_improve import BtImproveOptions
from stageml.compiler.passes.lora_sites import LoraSitesOptions
from stageml.compiler.report import Report
from stageml.compiler.targets import get_target
from stageml.errors import CompileError, ModelLoadError
from stageml.files import write_files
from stageml.runtime.module import as_numpy

SUFFIXES = {"torch": ".torch.mlir", "bt": ".bt.mlir", "split": ".split.mlir",
            "linalg": ".linalg.mlir", "iree": ".iree.mlir", "vmfb": ".vmfb"}
WEIGHTS, FOLDED = ".weights.safetensors", ".folded.safetensors"


def bt_pipeline(options: CompileOptions, stages: dict) -> list:
    """The binding-time passes, in order (multi-tenant compiles add their own)."""
    tenants = options.multi_tenant
    return [("bt-annotate", BtAnnotateOptions(tuple(stages.items()))), ("bt-propagate", None), ("bt-verify", None),
            *([("lora-sites", LoraSitesOptions(options.max_rank, options.max_adapters)), ("bt-verify", None),
               ("factorized-program", None), ("expert-factors", None), ("bt-verify", None)] if tenants else []),
            ("bt-improve", BtImproveOptions(options.merge_lora, merge_quantized=tenants or not options.keep_quantized)),
            *([("requantize-merged", None)] if options.keep_quantized and tenants else []),
            *([("defer-dequant", None)] if options.keep_quantized else []), ("bt-verify", None),
            ("bt-lift", None), ("bt-stacks", None), ("bt-verify", None),
            *([("bt-gather", None), ("routing-counts", None), ("bt-verify", None)] if tenants else [])]


SPLIT_PIPELINE = [("bt-split", None), ("group-experts", None), ("index-bounds", None), ("flatten-matmul", None),
                  ("collapse-views", None), ("decompose-topk", None)]
# After partial evaluation: parameters first (they remove @static), then the
# resident tables, then the products that read them.
RESIDUAL_PIPELINE = [("use-parameters", None), ("resident-state", None), ("fuse-gathers", None)]
# After the target's passes: the runtime checks ahead of the work (CSE'd first, so that
# repeats are one condition), then the entry points' reflection.
FINAL_PIPELINE = [("cse", None), ("hoist-asserts", None), ("entry-reflection", None)]


@dataclasses.dataclass
class Compilation:
    """What flows from stage to stage."""

    options: CompileOptions
    module: object = None                      # the current stage's module (or the vmfb bytes)
    weights: dict = dataclasses.field(default_factory=dict)   # the model's weights (name → tensor/array)
    folded: dict = dataclasses.field(default_factory=dict)    # partial evaluation's results
    stats: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    ops: dict = dataclasses.field(default_factory=dict)
    mutated: set = dataclasses.field(default_factory=set)  # buffers the model mutates
    stages: dict = dataclasses.field(default_factory=dict)  # argument name → BindingTime
    context: object = None                     # torch-mlir context of the torch-side stages
    vmfb: bytes | None = None
    iree_flags: list = dataclasses.field(default_factory=list)  # what iree-compile compiled the residual with


def _count_ops(module) -> dict:
    counts = collections.Counter()
    for func in programs(module.operation):
        if facts.get(func, facts.PROGRAM) != facts.MAIN:
            continue
        for op in func.regions[0].blocks[0].operations:
            op = op.operation
            if op.name == "bt.lift" or TIME not in op.attributes or not len(op.results):
                continue
            if not is_rematerializable(op.results[0]):
                counts[parse_time(op.attributes[TIME]).label] += 1
    return {t.label: counts.get(t.label, 0) for t in BindingTime}


def _bt(c: Compilation) -> None:
    with c.context:
        run_passes(c.module, bt_pipeline(c.options, c.stages), c.stats)
        c.ops = _count_ops(c.module)


def _split(c: Compilation) -> None:
    with c.context:
        run_passes(c.module, SPLIT_PIPELINE, c.stats)


def _linalg(c: Compilation) -> None:
    c.module = lowering.to_linalg(c.module)


def _share_folded(c: Compilation) -> None:
    """Stores each folded value once: a parameter equal to an earlier one is renamed to it."""
    kept, by_content, renamed = {}, {}, {}
    for name, value in c.folded.items():
        key = (value.dtype.str, value.shape, hashlib.blake2b(np.ascontiguousarray(value).view(np.uint8).data).digest())
        if key in by_content:
            renamed[name] = by_content[key]
        else:
            by_content[key], kept[name] = name, value
    for func in facts.stage_functions(c.module.operation):
        for i in range(len(func.regions[0].blocks[0].arguments)):
            entry = facts.facts(func, "arg", i)
            if entry.get("kind") == facts.PARAMETER and entry["name"] in renamed:
                facts.set_facts(func, "arg", i, name=renamed[entry["name"]])
    c.folded = kept


def _iree(c: Compilation) -> None:
    c.folded = evaluate_static(c.module, c.weights)
    _share_folded(c)
    with c.module.context:
        run_passes(c.module, RESIDUAL_PIPELINE + get_target(c.options).passes() + FINAL_PIPELINE,
                   c.stats)


def _vmfb(c: Compilation) -> None:
    target = get_target(c.options)
    text = lowering.text(c.module)
    choices = [[*flags, *lowering.RESIDUAL_FLAGS] for flags in target.flag_choices(c.module)]
    for flags, fallback in zip(choices, choices[1:] + [None]):
        try:
            c.vmfb = lowering.compile_module(text, "the residual", target.backend, flags)
        except lowering.CompilerCrash as e:
            if fallback is None:
                raise
            if c.options.verbose:
                print(f"[stageml] {e} (with {' '.join(f for f in flags if f not in fallback)}); "
                      f"compiling with {' '.join(f for f in fallback if f not in flags)}", file=sys.stderr, flush=True)
            continue
        c.iree_flags = flags
        return


STEPS = {"bt": _bt, "split": _split, "linalg": _linalg, "iree": _iree, "vmfb": _vmfb}


def _dump(c: Compilation, stage: str) -> None:
    stem = os.path.join(c.options.dump_dir, "model")
    text = c.vmfb if stage == "vmfb" else lowering.text(c.module).encode()
    files = [(stem + SUFFIXES[stage], lambda temp: _write_bytes(temp, text))]
    if stage == "torch":
        files.append((stem + WEIGHTS, lambda temp: _save_tensors(temp, c.weights)))
    if stage == "iree":
        files.append((stem + FOLDED, lambda temp: _save_tensors(temp, c.folded)))
    write_files(files)


def _write_bytes(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def _save_tensors(path: str, tensors: dict) -> None:
    import torch
    from safetensors.torch import save_file

    storages = set()  # tied weights (one storage, two names) are written as two tensors

    def as_torch(value):
        if isinstance(value, torch.Tensor):
            value = value.detach().contiguous()
            shared = value.untyped_storage().data_ptr() in storages
            storages.add(value.untyped_storage().data_ptr())
            return value.clone() if shared else value
        array = np.asarray(value, order="C")
        if array.dtype.name == "bfloat16":
            return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(array.copy())

    save_file({k: as_torch(v) for k, v in tensors.items()}, path)


def _load_tensors(path: str) -> dict:
    from safetensors.torch import load_file
    if not os.path.isfile(path):
        raise ModelLoadError(f"{path!r} is missing: a compile from a dumped stage needs the tensors "
                             "--dump-stages wrote beside it")
    try:
        return load_file(path)
    except Exception as e:  # safetensors' own error type, OSError, ...
        raise ModelLoadError(f"{path!r} cannot be read ({str(e).strip().splitlines()[0]}): dump the stages "
                             "again with --dump-stages") from None


def _resume(path: str, options: CompileOptions) -> tuple:
    """(stage, Compilation) for a dumped stage file."""
    stage = next((s for s, suffix in SUFFIXES.items() if path.endswith(suffix) and s != "vmfb"), None)
    if stage is None:
        raise ModelLoadError(f"{path!r} is neither an exported model (.pt2) nor a dumped stage "
                             f"({', '.join(v for v in SUFFIXES.values() if v != '.vmfb')})")
    if not os.path.isfile(path):
        raise ModelLoadError(f"stage file {path!r} does not exist: pass a file that --dump-stages wrote")
    stem = path[:-len(SUFFIXES[stage])]
    c = Compilation(options, weights=_load_tensors(stem + WEIGHTS))
    from torch_mlir import ir
    try:
        if stage in ("torch", "bt", "split"):
            c.context = new_context()
            with c.context:
                c.module = ir.Module.parseFile(path)
        else:
            from iree.compiler import ir as iree_ir
            c.module = iree_ir.Module.parse(open(path).read(), lowering.iree_context())
    except Exception as e:
        raise ModelLoadError(f"{path!r} is not valid {stage} IR ({str(e).splitlines()[0]}): "
                             "pass a file that --dump-stages wrote") from None
    if stage == "torch":  # a result named after a buffer is its new value: the frontend's mutations
        main = programs(c.module.operation)[0]
        names = [facts.facts(main, "arg", i).get("name") for i in range(len(main.regions[0].blocks[0].arguments))]
        results = {facts.facts(main, "res", i).get("name") for i in range(len(list(
            main.regions[0].blocks[0].operations)[-1].operands))}
        c.mutated = results & set(c.weights)
        c.stages = stage_spec.resolve(names, set(c.weights), options.stages, c.mutated)
    if stage == "iree":
        c.folded = {k: as_numpy(v) for k, v in _load_tensors(stem + FOLDED).items()}
    return stage, c


def _is_dumped_stage(model) -> bool:
    return isinstance(model, (str, os.PathLike)) and os.fspath(model).endswith(
        tuple(v for v in SUFFIXES.values() if v != ".vmfb"))


def compile(model, args=None, *, dynamic_shapes=None, options: CompileOptions) -> Artifact:
    """Compiles `model` (or a dumped stage file) with `options`. See `stageml.compile`."""
    get_target(options)  # an unknown target or CPU fails before any work
    started = time.perf_counter()
    if _is_dumped_stage(model):
        first, c = _resume(os.fspath(model), options)
    else:
        first, c = "torch", Compilation(options)
        if isinstance(model, (str, os.PathLike)) and os.path.isdir(model):
            if not options.generate:
                raise CompileError(f"{os.fspath(model)!r} is a directory: a transformers save_pretrained directory "
                                   "compiles with generate=True (stagemlc --generate)")
            model = generation.pretrained(os.fspath(model), options.lora_config)
        elif options.lora_config is not None:
            raise CompileError("lora_config (--lora-config) applies to a save_pretrained directory: pass the model "
                               "as one, or give a PEFT model instead")
        if options.generate:
            if args is not None or dynamic_shapes is not None:
                raise CompileError("with generate=True StageML builds the step's inputs itself: pass the model alone "
                                   "(no example inputs or dynamic_shapes)")
            eos = generation.end_tokens(model)
            model, args, dynamic_shapes = generation.step_program(model, options.sequences, options.max_seq)
        program = frontend.export(model, args, dynamic_shapes, trust_model=options.trust_model)
        c.context = new_context()
        imported = frontend.import_program(program, c.context)
        if options.generate:
            facts.put(imported.module.operation, facts.GENERATION,
                      {"sequences": options.sequences, "max_seq": options.max_seq, "eos": eos,
                       **dict(zip(("tokens", "slots", "positions"), generation.INPUTS))})
        c.module, c.weights, c.mutated = imported.module, imported.weights, imported.mutated
        # (resolved now, so that a bad glob fails before any stage runs)
        c.stages = stage_spec.resolve(imported.arg_names, set(c.weights), options.stages, c.mutated)
    art = Artifact()
    art.source = os.fspath(model) if isinstance(model, (str, os.PathLike)) else None
    stages = list(SUFFIXES)
    for stage in stages[stages.index(first):stages.index(options.emit) + 1]:
        if stage != first:
            STEPS[stage](c)
        if stage != "vmfb":
            art.mlir[stage] = lowering.text(c.module)
        if options.dump_dir:
            _dump(c, stage)
        if options.verbose:
            print(f"[stageml] {stage:<6} {time.perf_counter() - started:6.1f}s", file=sys.stderr, flush=True)
    art.report = Report.from_stats(c.ops, c.stats, kernels=get_target(options).counts_kernels)
    art.report.folded_values = len(c.folded)
    art.report.folded_bytes = sum(v.nbytes for v in c.folded.values())
    art.report.iree_flags = c.iree_flags
    if options.emit != "vmfb":
        return art
    _finish(art, c)
    return art


def _finish(art: Artifact, c: Compilation) -> None:
    """The artifact's contents, all read from the final IR."""
    module = c.module.operation
    art.vmfb = c.vmfb
    art.entry_points = entry_points.entry_points(module)
    values = {**{k: v for k, v in c.weights.items()}, **c.folded}
    art.parameters = {name: as_numpy(values[name]) for name in entry_points.parameters(module)}
    art.tenants = entry_points.tenants(module)
    art.generation = facts.get(module, facts.GENERATION)
    if art.tenants is None:
        adapter = next((e for e in art.entry_points if e["stage"] == "adapter" and e["program"] == facts.MAIN), None)
        if adapter is not None:
            art.default_adapter = {a["name"]: as_numpy(c.weights[a["name"]])
                                   for a in adapter["arguments"] if a["kind"] == facts.INPUT}
    art.target = get_target(c.options).describe()


__all__ = ["compile", "EMITS", "SUFFIXES"]
