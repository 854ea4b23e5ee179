"""The pass registry: every StageML pass, looked up by name.

A pass is a plain function `run(module_op, options)` in a file named after
it (`bt_lift.py` ↔ "bt-lift"); the file registers it here with `register`.
`run_passes` runs a list of names as Python passes of an MLIR PassManager.
"""

import collections
import dataclasses
import importlib

from torch_mlir import ir, passmanager

from stageml.errors import CompileError


@dataclasses.dataclass
class PassOptions:
    """What passes may read (`stages`, ...) and write (`stats`, `sites`)."""

    stages: dict = dataclasses.field(default_factory=dict)  # arg name -> BindingTime
    stats: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    merge_lora: bool = True  # the cost policy may decline LoRA merges
    max_rank: int | None = None  # lora-sites: the rank factors are padded to (None: single-tenant)
    lift_prefix: str = ""    # bt-lift: prefix of computed values' names
    sites: list = dataclasses.field(default_factory=list)  # lora-sites: one dict per LoRA site


PASSES: dict = {}

_MODULES = ("bt_annotate", "bt_propagate", "bt_improve", "bt_lift", "bt_split",
            "bt_verify", "flatten_matmul", "lora_sites", "bt_gather")


def register(name: str, description: str):
    def wrap(run):
        PASSES[name] = (run, description)
        return run
    return wrap


def run_passes(module: ir.Module, names, options: PassOptions | None = None) -> PassOptions:
    """Runs the named passes on `module`, in order; returns the options (with stats)."""
    options = options or PassOptions()
    pm = passmanager.PassManager("builtin.module", context=module.context)
    failure = []
    for name in names:
        if name not in PASSES:
            raise CompileError(f"unknown pass {name!r}: choose from {', '.join(sorted(PASSES))}")
        run = PASSES[name][0]

        def python_pass(op, pass_, run=run, name=name):
            try:
                run(op, options)
            except Exception as e:  # re-raised below, after the pass manager stops
                failure.append(e)
                pass_.signal_pass_failure()

        pm.add(python_pass, name=name, argument=name)
    try:
        pm.run(module.operation)
    except Exception as e:
        if failure:
            raise failure[0] from None
        raise CompileError(f"pass pipeline {','.join(names)} failed: {e}") from e
    if failure:
        raise failure[0]
    return options


def main_func(module_op: ir.Operation, name: str = "main") -> ir.Operation:
    for op in module_op.regions[0].blocks[0].operations:
        if op.operation.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == name:
            return op.operation
    raise CompileError(f"the module has no function @{name}: import the model with the StageML frontend")


for _module in _MODULES:
    importlib.import_module(f"{__name__}.{_module}")
