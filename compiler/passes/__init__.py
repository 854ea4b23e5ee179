"""The pass registry: every StageML pass, on either side, looked up by name.

A pass is a plain function `run(module_op, options, stats)` in a file named
after it (`bt_lift.py` ↔ "bt-lift"), registered with `register`. Its
options are a frozen dataclass of its own (`LoraSitesOptions(max_rank=8)`),
written `lora-sites{max-rank=8}` in a pipeline string. `context` says which
bindings it runs in: "torch" (torch-mlir's, with the bt dialect: the
binding-time passes) or "iree" (IREE's: the rewrites of the residual's
IREE input). `run_passes` runs a pipeline as Python passes of one MLIR
PassManager; `stats` (a Counter) collects what the passes did.
"""

import collections
import dataclasses
import importlib
import typing

from stageml.errors import CompileError


@dataclasses.dataclass(frozen=True)
class NoOptions:
    """A pass without options."""


@dataclasses.dataclass(frozen=True)
class Pass:
    name: str
    description: str
    run: typing.Callable
    options: type
    context: str  # "torch" or "iree"


PASSES: dict = {}
UPSTREAM = ("canonicalize", "cse")  # MLIR's own, run on the whole module in either context

_MODULES = ("bt_annotate", "bt_propagate", "bt_improve", "requantize_merged", "defer_dequant", "bt_lift", "bt_split", "bt_verify",
            "flatten_matmul", "collapse_views", "decompose_topk", "lora_sites", "factorized_program", "expert_factors",
            "bt_stacks", "bt_gather", "routing_counts", "group_experts", "index_bounds", "use_parameters", "resident_state", "fuse_gathers", "fuse_dequant", "pack_weights", "hoist_asserts", "entry_reflection")
_TARGET_MODULES = ("stageml.compiler.sm90.attach_hopper_target", "stageml.compiler.sm90.use_custom_kernels")


def register(name: str, description: str, options: type = NoOptions, context: str = "torch"):
    def wrap(run):
        PASSES[name] = Pass(name, description, run, options, context)
        return run
    return wrap


def rewrite_each(module_op, op_name: str, match, stats, counter: str) -> None:
    """Applies `match(op, rewriter)` to every `op_name` op of the module by the bindings' walk
    driver (no folding, so the IR around keeps its shape); `match` returns True where it does
    not apply (the bindings' convention). Counts the rewrites in stats[counter]."""
    from torch_mlir import rewrite

    patterns = rewrite.RewritePatternSet(module_op.context)

    def pattern(op, rewriter):
        unmatched = match(op, rewriter)
        stats[counter] += not unmatched
        return unmatched

    patterns.add(op_name, pattern)
    rewrite.walk_and_apply_patterns(module_op, patterns.freeze())


def lookup(name: str) -> Pass:
    if name in UPSTREAM:
        return Pass(name, f"MLIR's {name}", None, NoOptions, "any")
    if name not in PASSES:
        raise CompileError(f"unknown pass {name!r}: choose from {', '.join(sorted(PASSES))}")
    return PASSES[name]


def _convert(field, text: str):
    kind = field.type  # bool, int, float or str (options are plain dataclasses)
    if kind is bool:
        if text not in ("true", "false"):
            raise CompileError(f"pass option {field.name} takes true or false, not {text!r}")
        return text == "true"
    try:
        return kind(text)
    except (TypeError, ValueError):
        raise CompileError(f"pass option {field.name} takes a {kind.__name__}, not {text!r}") from None


def parse_pipeline(text: str) -> list:
    """'a,b{max-rank=8,merge=false}' → [(pass name, options), ...]."""
    pipeline, depth, start = [], 0, 0
    items = []
    for i, c in enumerate(text + ","):
        depth += (c == "{") - (c == "}")
        if c == "," and depth == 0:
            items.append(text[start:i].strip())
            start = i + 1
    for item in filter(None, items):
        name, _, rest = item.partition("{")
        pass_ = lookup(name.strip())
        fields = {f.name: f for f in dataclasses.fields(pass_.options)}
        values = {}
        for pair in filter(None, (p.strip() for p in rest.rstrip("}").split(","))):
            key, sep, value = pair.partition("=")
            key = key.strip().replace("-", "_")
            if not sep or key not in fields:
                raise CompileError(f"pass {pass_.name!r} has no option {pair!r}: its options are "
                                   f"{', '.join(f.replace('_', '-') for f in fields) or 'none'}")
            values[key] = _convert(fields[key], value.strip())
        pipeline.append((pass_.name, pass_.options(**values)))
    return pipeline


def run_passes(module, pipeline, stats: collections.Counter | None = None) -> collections.Counter:
    """Runs `pipeline` ([(name, options)] or a pipeline string) on `module`, in order."""
    if isinstance(pipeline, str):
        pipeline = parse_pipeline(pipeline)
    stats = collections.Counter() if stats is None else stats
    contexts = {lookup(name).context for name, _ in pipeline} - {"any"}
    if len(contexts) > 1:
        raise CompileError(f"pipeline {','.join(n for n, _ in pipeline)} mixes torch-side and IREE-side passes: "
                           "run them on their own stages")
    pm = _passmanager(contexts.pop() if contexts else "torch").PassManager("builtin.module", context=module.context)
    failure = []
    for name, options in pipeline:
        pass_info = lookup(name)
        run = pass_info.run
        if run is None:
            pm.add(name)
            continue
        options = pass_info.options() if options is None else options  # None: the pass's defaults

        def python_pass(op, pass_, run=run, options=options):
            try:
                run(op, options, stats)
            except Exception as e:  # re-raised below, after the pass manager stops
                failure.append(e)
                pass_.signal_pass_failure()

        pm.add(python_pass, name=name, argument=name)
    try:
        pm.run(module.operation)
    except Exception as e:
        if not failure:
            raise CompileError(f"pass pipeline {','.join(n for n, _ in pipeline)} failed: {e}") from e
    if failure:  # (popped: the pass manager's closures must not keep the traceback alive)
        raise failure.pop() from None
    return stats


def _passmanager(context: str):
    if context == "torch":
        from torch_mlir import passmanager
    else:
        from iree.compiler import passmanager
    return passmanager


def programs(module_op) -> list:
    """The program functions of an unsplit module: each `func.func` with bt.program."""
    from stageml.compiler import facts

    found = [op.operation for op in module_op.regions[0].blocks[0].operations
             if op.operation.name == "func.func" and facts.PROGRAM in op.operation.attributes
             and facts.STAGE not in op.operation.attributes]
    if not found:
        raise CompileError("the module has no program function (a func.func with bt.program): "
                           "import the model with the StageML frontend")
    return found


def program_of(func) -> str:
    from stageml.compiler import facts
    return facts.get(func, facts.PROGRAM)


for _module in _MODULES:
    importlib.import_module(f"{__name__}.{_module}")
for _module in _TARGET_MODULES:
    importlib.import_module(_module)
