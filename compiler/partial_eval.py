"""Partial evaluation: run each @static now, on the CPU, through IREE.

Its results (transposed, merged, cast weights) become the residual's
parameters; nothing folded is ever embedded in IR as text.
"""

import numpy as np
from iree import runtime as iree_rt
from iree.compiler import ir

from stageml.compiler import facts
from stageml.compiler.lowering import compile_module, text
from stageml.runtime.module import as_numpy, numpy_dtype
from stageml.compiler.entry_points import describe
from stageml.errors import ModelLoadError

HOST = ["--iree-llvmcpu-target-cpu=host"]


def evaluate_static(module: ir.Module, weights: dict) -> dict:
    """{result name: ndarray} of every static stage function of `module`
    (linalg, IREE's context), called with the model's weights."""
    folded = {}
    for func in facts.stage_functions(module.operation, "static"):
        single = ir.Module.create(loc=func.location)
        func.clone(ip=ir.InsertionPoint(single.body))
        entry = describe(func)
        vmfb = compile_module(text(single), f"@{entry['symbol']}", "llvm-cpu", HOST)
        compiled = iree_rt.load_vm_flatbuffer(vmfb, driver="local-task")
        missing = [a["name"] for a in entry["arguments"] if a["name"] not in weights]
        if missing:
            raise ModelLoadError(f"the weights lack {missing[0]!r}, which @{entry['symbol']} reads: compile from the "
                                 "model, or keep the weights file --dump-stages wrote beside the stage")
        args = [np.asarray(as_numpy(weights[a["name"]]).astype(numpy_dtype(a["dtype"]), copy=False), order="C")
                for a in entry["arguments"]]
        results = getattr(compiled, entry["symbol"])(*args)
        results = results if isinstance(results, (tuple, list)) else [results]
        folded.update({r["name"]: np.asarray(v.to_host()) for r, v in zip(entry["results"], results)})
    return folded
