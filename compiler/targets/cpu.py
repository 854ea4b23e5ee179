"""The CPU target: IREE's llvm-cpu backend, for the host or a named LLVM CPU.

The CPU's features decide the mmt4d tiles pack-weights lays weights out in.
The tiles are IREE's own (`enumerateMatmulTileX86_64` / `...Arm64` in
compiler/src/iree/compiler/Codegen/ExternalInterfaces/CPUEncodingExternalModels.cpp):
for f32 on x86-64, N0 = 16 with avx512f, 8 with avx, 4 with SSE only; on
arm64, 8. K0 is 1. M0 is the widest tile's (16 with avx512f, else 8) or,
for fewer rows, one of its truncations 1, 2, 4(, 8): IREE picks the
smallest that covers the row count rounded up to a power of two.

Tiles must be the CPU's own: on an AVX2 AMD EPYC (Zen 3), IREE 3.13 with
its default mmt4d ukernels computed wrong results with f32 tiles 16x16x1,
8x16x1 and 16x8x1 (which have no AVX2 kernel; 1x16, 4x16 and 16x4 were
right), and ran ~80x slower than with its own 8x8x1.
"""

import functools
import os
import platform
import shutil
import subprocess
import sys

from stageml.compiler.targets import Target
from stageml.errors import CompileError

# LLVM's x86-64 micro-architecture levels, each adding to the one before.
_V1 = frozenset({"sse", "sse2"})
_V2 = _V1 | {"sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "cx16"}
_V3 = _V2 | {"avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "lzcnt", "movbe"}
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
_ICELAKE = _V4 | {"avx512vnni", "avx512ifma", "avx512vbmi", "avx512vbmi2", "avx512bitalg", "avx512vpopcntdq"}

# Named x86-64 LLVM CPUs (`--iree-llvmcpu-target-cpu=NAME`) and the features that matter here.
CPUS = {
    "generic": _V1, "x86-64": _V1, "x86-64-v2": _V2, "x86-64-v3": _V3, "x86-64-v4": _V4,
    "haswell": _V3, "skylake": _V3,
    "skylake-avx512": _V4,
    "cascadelake": _V4 | {"avx512vnni"},
    "icelake-server": _ICELAKE,
    "sapphirerapids": _ICELAKE | {"avx512bf16", "avx512fp16", "amx-tile", "amx-int8", "amx-bf16"},
    "znver2": _V3, "znver3": _V3,
    "znver4": _ICELAKE | {"avx512bf16"},
}

# The features IREE's mmt4d tile choice reads (fma: the AVX2 f32 kernels' FMAs).
TILE_FEATURES = frozenset({"avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vnni", "avx512bf16"})

# /proc/cpuinfo flag names → LLVM / iree-cpuinfo names, where they differ.
_PROC_NAMES = {"pni": "sse3", "sse4_1": "sse4.1", "sse4_2": "sse4.2", "avx512_bf16": "avx512bf16",
               "avx512_fp16": "avx512fp16", "avx512_vbmi2": "avx512vbmi2", "avx512_vnni": "avx512vnni",
               "avx512_bitalg": "avx512bitalg", "avx512_vpopcntdq": "avx512vpopcntdq",
               "amx_tile": "amx-tile", "amx_int8": "amx-int8", "amx_bf16": "amx-bf16", "abm": "lzcnt"}


def _arch() -> str:
    machine = platform.machine().lower()
    return "arm64" if machine in ("aarch64", "arm64") else "x86_64"


def _cpuinfo_binary() -> str | None:
    """IREE's `iree-cpuinfo` (shipped with iree-base-runtime), or None."""
    try:
        from iree import _runtime_libs
        candidate = os.path.join(_runtime_libs.__path__[0], "iree-cpuinfo")
        if os.access(candidate, os.X_OK):
            return candidate
    except ImportError:
        pass
    for candidate in (os.path.join(os.path.dirname(sys.executable), "iree-cpuinfo"), shutil.which("iree-cpuinfo")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def _iree_features() -> frozenset | None:
    """The host's features as IREE's runtime detects them (`iree-cpuinfo`), or None."""
    binary = _cpuinfo_binary()
    if binary is None:
        return None
    try:
        out = subprocess.run([binary], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    features = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] in ("0", "1"):
            if parts[1] == "1":
                features.add(parts[0])
        elif parts:
            return None  # not the format we know
    return frozenset(features) if out.strip() else None


def _proc_features() -> frozenset | None:
    """The host's features from /proc/cpuinfo's flags (Linux), or None."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(_PROC_NAMES.get(flag, flag) for flag in value.split())
    except OSError:
        pass
    return None


@functools.cache
def host_features() -> frozenset:
    """The host CPU's features: IREE's detection, else /proc/cpuinfo, else the baseline."""
    baseline = frozenset({"neon"}) if _arch() == "arm64" else _V1
    detected = _iree_features()
    if detected is None:
        detected = _proc_features()
    return baseline | (detected or frozenset())


def f32_tiles(arch: str, features: frozenset) -> tuple:
    """IREE's f32 mmt4d tiles as a ladder ((max rows, M0, N0, K0), ...), narrowest first."""
    if arch == "arm64":
        m0, n0 = 8, 8
    elif "avx512f" in features:
        m0, n0 = 16, 16
    elif "avx" in features:
        m0, n0 = 8, 8
    else:
        m0, n0 = 8, 4
    ladder = [(m, m, n0, 1) for m in (1, 2, 4, 8, 16) if m < m0]
    return tuple(ladder) + ((None, m0, n0, 1),)


def _data_tiling(module, features: frozenset) -> tuple:
    """IREE's data-tiling flags for `module` (the residual's IREE input, or None), best
    first: the next one is the workaround when iree-compile crashes on the one before.

    `--iree-opt-data-tiling` picks IREE 3.13's dispatch-creation path, which fails on
    half-precision attention (a transpose + f16→f32 extension feeding a batch matmul's
    encoding: "'affine.delinearize_index' op no basis element may be statically
    non-positive", the canonicalization bug of llvm/llvm-project#205238, fixed by
    llvm/llvm-project#205288). The global-optimization path compiles those; for f32 it
    was 1.6-1.9x slower on a 2-layer Llama (AMD EPYC Zen 3), so only modules with f16 or
    bf16 tensors take it. On a CPU without avx512bf16 (AVX2 only: AMD EPYC Zen 3) that path
    crashes iree-compile on bf16 models (tiny Llama, Mixtral, the tenant and expert-LoRA
    tests), so bf16 there is compiled without data tiling. Other modules crash the
    dispatch-creation path too (Qwen2-MoE in f32: a linalg.pack of a 1-D matmul
    accumulator lowered to loops; XLM's attention scores: a workgroup count it cannot
    express in the workload); they compile by the global-optimization path. A module
    whose batch matmul takes an operand normalized after a transpose (`_normalized_batch_matmul`)
    takes that path first: the dispatch-creation path computes it wrong without a word."""
    half = _half_types(module) if module is not None else set()
    if "bf16" in half and "avx512bf16" not in features:
        return ("--iree-opt-data-tiling=false",)
    if half or (module is not None and _normalized_batch_matmul(module)):
        return ("--iree-global-opt-data-tiling", "--iree-opt-data-tiling=false")
    return ("--iree-opt-data-tiling", "--iree-global-opt-data-tiling", "--iree-opt-data-tiling=false")


_VIEWS = ("tensor.collapse_shape", "tensor.expand_shape", "linalg.transpose", "linalg.broadcast")


def _sources(value, reduction, views=_VIEWS) -> list:
    """The operations `value` is computed from through `views` and elementwise linalg.generic
    ops: reductions, products, loads, other views (each once)."""
    from iree.compiler import ir
    found, stack, seen = [], [value], set()
    while stack:
        owner = stack.pop().owner
        if isinstance(owner, ir.Block):
            continue
        op = owner.operation
        if op in seen:
            continue
        seen.add(op)
        if op.name in views:
            stack.append(op.operands[0])
        elif op.name == "linalg.generic" and reduction not in ir.ArrayAttr(op.attributes["iterator_types"]):
            stack.extend(op.opview.inputs)
        else:
            found.append(op)
    return found


def _normalized_batch_matmul(module) -> bool:
    """Whether a linalg.batch_matmul of `module` takes an operand normalized, at request time,
    over a transposed tensor: a reduction's result combined elementwise into the operand, the
    reduction's input a linalg.transpose's result (HunYuan-V1-Dense's RMSNorm of the rotated
    queries [B, heads, T, dim] before Q·Kᵀ; Qwen3 normalizes before the transpose).

    IREE 3.13's dispatch-creation data tiling computes that product wrong without a word
    (HunYuan-V1-Dense: rel. err. 0.3-1.0 from two tokens on) or stops with "'memref.alloca'
    op all stack allocations need to be hoisted" (the norm straight into the product); the
    global-optimization path computes both right. Not reported upstream as far as IREE's
    tracker shows; the compile error is the symptom of iree-org/iree#14406 (closed)."""
    from iree.compiler import ir
    reduction = ir.Attribute.parse("#linalg.iterator_type<reduction>", module.context)
    untransposed = tuple(v for v in _VIEWS if v != "linalg.transpose")
    found = []

    def normalized(op) -> bool:
        return any(source.name == "linalg.generic" and any(
            s.name == "linalg.transpose" for i in source.opview.inputs for s in _sources(i, reduction, untransposed))
            for operand in op.opview.inputs for source in _sources(operand, reduction))

    def visit(op):
        if op.name == "linalg.batch_matmul" and normalized(op):
            found.append(op)
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return bool(found)


def _half_types(module) -> set:
    """The half-precision element types ("f16", "bf16") of the tensors `module`'s functions
    take or return."""
    from iree.compiler import ir
    found = set()
    for op in module.operation.regions[0].blocks[0].operations:
        if op.operation.name != "func.func":
            continue
        fn = ir.FunctionType(ir.TypeAttr(op.operation.attributes["function_type"]).value)
        for type_ in list(fn.inputs) + list(fn.results):
            if isinstance(type_, ir.RankedTensorType):
                if isinstance(type_.element_type, ir.F16Type):
                    found.add("f16")
                elif isinstance(type_.element_type, ir.BF16Type):
                    found.add("bf16")
    return found


class CpuTarget(Target):
    """IREE's llvm-cpu backend for one CPU ("host" or an LLVM CPU name)."""

    name = "cpu"
    backend = "llvm-cpu"
    device = "local-task"

    def __init__(self, cpu: str = "host"):
        if cpu == "host":
            self.arch, self.features = _arch(), host_features()
        elif cpu in CPUS:
            self.arch, self.features = "x86_64", CPUS[cpu]
        else:
            raise CompileError(f"unknown CPU {cpu!r}: choose host or one of {', '.join(CPUS)}")
        self.cpu = cpu

    @classmethod
    def from_options(cls, options):
        return cls(options.cpu)

    def mmt4d_tiles(self, element: str) -> tuple:
        """The tile ladder for `element` ("f32"): ((max rows or None, M0, N0, K0), ...),
        narrowest first, the last one for any row count; () where pack-weights leaves
        the products to IREE."""
        return f32_tiles(self.arch, self.features) if element == "f32" else ()

    def flags(self, module=None) -> list:
        return self.flag_choices(module)[0]

    def flag_choices(self, module=None) -> list:
        # Measured on a 2-core CPU to matter 4x for weight-heavy residuals (DESIGN.md):
        # what layout work is left is done once, at load time, not per request.
        return [[f"--iree-llvmcpu-target-cpu={self.cpu}", tiling, "--iree-opt-const-eval",
                 "--iree-opt-const-expr-hoisting"] for tiling in _data_tiling(module, self.features)]

    def passes(self) -> list:
        from stageml.compiler.passes.pack_weights import PackWeightsOptions
        return [("pack-weights", PackWeightsOptions(cpu=self.cpu)), ("fuse-dequant", None)]

    def describe(self) -> dict:
        return {"name": self.name, "device": self.device, "cpu": self.cpu,
                "features": sorted(self.features & TILE_FEATURES)}
