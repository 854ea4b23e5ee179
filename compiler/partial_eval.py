"""Partial evaluation: run @static now, on the CPU, through IREE.

Its results (transposed, merged, cast weights) become the residual's
parameters; nothing folded is ever embedded in IR as text.
"""

import numpy as np
from iree import runtime as iree_rt

from stageml.compiler.lowering import compile_module, static_module
from stageml.runtime.module import as_numpy, numpy_dtype


def evaluate_static(linalg: str, signature, weights: dict) -> dict:
    """{result name: ndarray} of a @static function, called with the model's weights."""
    vmfb = compile_module(static_module(linalg, signature.stage), signature.stage,
                          flags=["--iree-llvmcpu-target-cpu=host"])
    module = iree_rt.load_vm_flatbuffer(vmfb, driver="local-task")
    args = [np.ascontiguousarray(as_numpy(weights[a.name]).astype(numpy_dtype(a.dtype), copy=False))
            for a in signature.args]
    results = getattr(module, signature.stage)(*args)
    if not isinstance(results, (tuple, list)):
        results = [results]
    return {r.name: np.asarray(v.to_host()) for r, v in zip(signature.results, results)}
