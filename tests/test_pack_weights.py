"""pack-weights and the CPU target: each product's M0 fits its rows, and the
packed residual computes what numpy does (IREE's llvm-cpu, on this host)."""

import random
import re

import numpy as np
import pytest
from iree import compiler as iree_compiler
from iree import runtime as iree_rt
from iree.compiler import ir

from stageml.compiler.options import CompileOptions
from stageml.compiler.passes import parse_pipeline, run_passes
from stageml.compiler.passes.pack_weights import PackWeightsOptions
from stageml.compiler.targets import cpu as cpu_target
from stageml.compiler.targets.cpu import CpuTarget
from stageml.errors import CompileError

K, N = 64, 48
ROWS = (1, 3, 8, 17, None)  # None: a dynamic row count


def _forward(rows) -> str:
    """A request-time function: x @ state (@adapter's result 0) and x @ a global weight."""
    m = "?" if rows is None else str(rows)
    name = "dyn" if rows is None else str(rows)
    dim = "%rows" if rows is None else ""
    return f"""
  func.func @forward_{name}(%w: tensor<{K}x{N}xf32> {{bt.name = "merged", bt.kind = "state", bt.result = 0 : i64}},
                           %x: tensor<{m}x{K}xf32> {{bt.name = "x", bt.kind = "input"}})
      -> (tensor<{m}x{N}xf32>, tensor<{m}x{N}xf32>) attributes {{bt.stage = "dynamic", bt.program = "main"}} {{
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : f32
    %rows = tensor.dim %x, %c0 : tensor<{m}x{K}xf32>
    %e = tensor.empty({dim}) : tensor<{m}x{N}xf32>
    %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<{m}x{N}xf32>) -> tensor<{m}x{N}xf32>
    %y = linalg.matmul ins(%x, %w : tensor<{m}x{K}xf32>, tensor<{K}x{N}xf32>) outs(%acc : tensor<{m}x{N}xf32>) -> tensor<{m}x{N}xf32>
    %g = util.global.load @base : tensor<{K}x{N}xf32>
    %z = linalg.matmul ins(%x, %g : tensor<{m}x{K}xf32>, tensor<{K}x{N}xf32>) outs(%acc : tensor<{m}x{N}xf32>) -> tensor<{m}x{N}xf32>
    return %y, %z : tensor<{m}x{N}xf32>, tensor<{m}x{N}xf32>
  }}"""


def _module(base: np.ndarray) -> str:
    """IREE input: a global weight initialized inline, @adapter returning its argument
    as the state, and one request-time function per row count."""
    values = "0x" + base.astype("<f4").tobytes().hex().upper()
    return f"""module {{
  util.global private @base = dense<"{values}"> : tensor<{K}x{N}xf32>
  func.func @adapter(%a: tensor<{K}x{N}xf32> {{bt.name = "a", bt.kind = "input"}})
      -> (tensor<{K}x{N}xf32> {{bt.name = "merged", bt.kind = "state"}}) attributes {{bt.stage = "adapter", bt.program = "main"}} {{
    return %a : tensor<{K}x{N}xf32>
  }}""" + "".join(_forward(rows) for rows in ROWS) + "\n}\n"


def _packed(text: str, cpu: str):
    """The module text after pack-weights{cpu=...} and its stats."""
    with ir.Context():
        module = ir.Module.parse(text)
        stats = run_passes(module, f"pack-weights{{cpu={cpu}}}")
        return str(module), stats


def _tiles(text: str, function: str) -> set:
    """{(M0, N0)} of the mmt4d ops in `function` of a printed module."""
    body = text.split(f"func.func @{function}(")[1].split("func.func @")[0]
    found = set()
    for lhs, acc in re.findall(r"linalg\.mmt4d ins\(%\S+, %\S+ : tensor<(\S+)>, tensor<\S+>\) outs\(%\S+ : tensor<(\S+)>\)",
                               body):
        found.add((int(lhs.split("x")[2]), int(acc.split("x")[3])))
    return found


@pytest.fixture(scope="module")
def seed():
    seed = random.randrange(2**32)
    print(f"test_pack_weights seed = {seed}")
    return seed


@pytest.mark.parametrize("cpu, expected", [
    ("znver4", {"1": {(1, 16)}, "3": {(4, 16)}, "8": {(8, 16)}, "17": {(16, 16)},
                "dyn": {(1, 16), (2, 16), (4, 16), (8, 16), (16, 16)}}),
    ("haswell", {"1": {(1, 8)}, "3": {(4, 8)}, "8": {(8, 8)}, "17": {(8, 8)},
                 "dyn": {(1, 8), (2, 8), (4, 8), (8, 8)}}),
])
def test_each_product_takes_the_tile_for_its_rows(cpu, expected):
    text, stats = _packed(_module(np.zeros((K, N), np.float32)), cpu)
    assert stats["pack-weights"] == 2 * len(ROWS)
    n0 = max(n for tiles in expected.values() for _, n in tiles)
    # @adapter returns the state packed once, in the widest tile's (N0, K0) layout.
    assert f"-> (tensor<{N // n0}x{K}x{n0}x1xf32> {{bt.kind = \"state\", bt.name = \"merged\"}})" in text
    assert "linalg.matmul" not in text
    for name, tiles in expected.items():
        assert _tiles(text, f"forward_{name}") == tiles, name
    assert text.count("scf.if") == 2 * (len(expected["dyn"]) - 1)  # the dynamic function's two ladders


def test_state_with_another_use_stays_unpacked():
    text = f"""module {{
  func.func @adapter(%a: tensor<{K}x{N}xf32>) -> tensor<{K}x{N}xf32> attributes {{bt.stage = "adapter", bt.program = "main"}} {{
    return %a : tensor<{K}x{N}xf32>
  }}
  func.func @forward(%w: tensor<{K}x{N}xf32> {{bt.result = 0 : i64}}, %x: tensor<2x{K}xf32>)
      -> (tensor<2x{N}xf32>, tensor<{K}x{N}xf32>) attributes {{bt.stage = "dynamic", bt.program = "main"}} {{
    %zero = arith.constant 0.0 : f32
    %e = tensor.empty() : tensor<2x{N}xf32>
    %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<2x{N}xf32>) -> tensor<2x{N}xf32>
    %y = linalg.matmul ins(%x, %w : tensor<2x{K}xf32>, tensor<{K}x{N}xf32>) outs(%acc : tensor<2x{N}xf32>) -> tensor<2x{N}xf32>
    return %y, %w : tensor<2x{N}xf32>, tensor<{K}x{N}xf32>
  }}
}}"""
    packed, stats = _packed(text, "znver4")
    assert stats["pack-weights"] == 0
    assert "linalg.mmt4d" not in packed and "linalg.matmul" in packed


def test_mutable_global_stays_unpacked():
    text = f"""module {{
  util.global private mutable @table = dense<0.0> : tensor<{K}x{N}xf32>
  func.func @forward(%x: tensor<2x{K}xf32>) -> tensor<2x{N}xf32> attributes {{bt.stage = "dynamic", bt.program = "main"}} {{
    %zero = arith.constant 0.0 : f32
    %t = util.global.load @table : tensor<{K}x{N}xf32>
    %e = tensor.empty() : tensor<2x{N}xf32>
    %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<2x{N}xf32>) -> tensor<2x{N}xf32>
    %y = linalg.matmul ins(%x, %t : tensor<2x{K}xf32>, tensor<{K}x{N}xf32>) outs(%acc : tensor<2x{N}xf32>) -> tensor<2x{N}xf32>
    return %y : tensor<2x{N}xf32>
  }}
}}"""
    packed, stats = _packed(text, "znver4")
    assert stats["pack-weights"] == 0 and "linalg.pack" not in packed  # it would be packed on every call


def _rel_err(got, want) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))


def test_packed_products_match_numpy(seed):
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((K, N)).astype(np.float32)
    adapter_w = rng.standard_normal((K, N)).astype(np.float32)
    text, stats = _packed(_module(base), "host")
    assert stats["pack-weights"] == 2 * len(ROWS)
    vmfb = iree_compiler.compile_str(text, target_backends=["llvm-cpu"], extra_args=CpuTarget("host").flags())
    config = iree_rt.Config(CpuTarget.device)
    context = iree_rt.SystemContext(config=config)
    context.add_vm_module(iree_rt.VmModule.copy_buffer(context.instance, vmfb))
    module = context.modules.module
    state = module.adapter(adapter_w)  # packed by @adapter, once
    calls = [(f"forward_{rows}", rows) for rows in ROWS if rows is not None]
    calls += [("forward_dyn", rows) for rows in (1, 2, 3, 4, 8, 9, 16, 17)]
    for function, rows in calls:
        x = rng.standard_normal((rows, K)).astype(np.float32)
        y, z = (np.asarray(r.to_host()) for r in module[function](state, x))
        assert y.shape == z.shape == (rows, N)
        assert _rel_err(y, x.astype(np.float64) @ adapter_w) <= 1e-5, (function, rows, seed)
        assert _rel_err(z, x.astype(np.float64) @ base) <= 1e-5, (function, rows, seed)


# -- CpuTarget ---------------------------------------------------------------------

def test_unknown_cpu_is_a_clear_error():
    with pytest.raises(CompileError, match=r"unknown CPU 'zen9': choose host or one of .*znver4"):
        CpuTarget("zen9")
    with pytest.raises(CompileError, match="unknown CPU 'zen9'"):
        _packed("module {}", "zen9")


def test_avx512_cpus_take_16_wide_tiles():
    for name in ("znver4", "sapphirerapids", "skylake-avx512", "x86-64-v4"):
        target = CpuTarget(name)
        assert target.mmt4d_tiles("f32") == ((1, 1, 16, 1), (2, 2, 16, 1), (4, 4, 16, 1), (8, 8, 16, 1),
                                             (None, 16, 16, 1)), name
        assert "avx512f" in target.describe()["features"]


def test_avx2_cpus_take_8_wide_tiles():
    for name in ("haswell", "znver3", "x86-64-v3"):
        target = CpuTarget(name)
        assert target.mmt4d_tiles("f32") == ((1, 1, 8, 1), (2, 2, 8, 1), (4, 4, 8, 1), (None, 8, 8, 1)), name
        assert "avx512f" not in target.features and {"avx2", "fma"} <= target.features
    assert CpuTarget("x86-64").mmt4d_tiles("f32")[-1] == (None, 8, 4, 1)  # SSE only
    assert CpuTarget("haswell").mmt4d_tiles("f16") == ()


def test_host_target():
    target = CpuTarget.from_options(CompileOptions())
    assert (target.name, target.backend, target.device, target.cpu) == ("cpu", "llvm-cpu", "local-task", "host")
    assert target.mmt4d_tiles("f32")[-1][0] is None
    assert target.flags()[0] == "--iree-llvmcpu-target-cpu=host"
    assert "--iree-opt-data-tiling" in target.flags()
    assert target.passes() == [("pack-weights", PackWeightsOptions(cpu="host")), ("fuse-dequant", None)]
    described = target.describe()
    assert (described["name"], described["device"], described["cpu"]) == ("cpu", "local-task", "host")
    assert described["features"] == sorted(described["features"])
    assert CpuTarget.from_options(CompileOptions(cpu="znver4")).flags()[0] == "--iree-llvmcpu-target-cpu=znver4"
    assert parse_pipeline("pack-weights{cpu=znver4}") == [("pack-weights", PackWeightsOptions(cpu="znver4"))]


@pytest.mark.parametrize("half, normalized, features, paths", [
    (set(), False, frozenset(),
     ["--iree-opt-data-tiling", "--iree-global-opt-data-tiling", "--iree-opt-data-tiling=false"]),
    (set(), True, frozenset(), ["--iree-global-opt-data-tiling", "--iree-opt-data-tiling=false"]),
    ({"f16"}, False, frozenset(), ["--iree-global-opt-data-tiling", "--iree-opt-data-tiling=false"]),
    ({"bf16"}, False, frozenset({"avx512bf16"}), ["--iree-global-opt-data-tiling", "--iree-opt-data-tiling=false"]),
    ({"bf16"}, False, frozenset({"avx2"}), ["--iree-opt-data-tiling=false"]),
])
def test_data_tiling_paths_best_first(monkeypatch, half, normalized, features, paths):
    """f32 takes the dispatch-creation path, then the global-optimization one, then none;
    half precision skips the first (it fails on half attention), and so does a batch matmul
    of an operand normalized after its transpose (computed wrong there), bf16 without
    avx512bf16 the second too (it crashes iree-compile there)."""
    monkeypatch.setattr(cpu_target, "_half_types", lambda module: half)
    monkeypatch.setattr(cpu_target, "_normalized_batch_matmul", lambda module: normalized)
    target = CpuTarget("host")
    target.features = features
    assert [flags[1] for flags in target.flag_choices(object())] == paths
    assert target.flags(object()) == target.flag_choices(object())[0]


def test_host_features_without_detection_fall_back_to_the_baseline(monkeypatch):
    monkeypatch.setattr(cpu_target, "_iree_features", lambda: None)
    monkeypatch.setattr(cpu_target, "_proc_features", lambda: None)
    monkeypatch.setattr(cpu_target, "_arch", lambda: "x86_64")
    features = cpu_target.host_features.__wrapped__()
    assert features == {"sse", "sse2"}
    assert cpu_target.f32_tiles("x86_64", features)[-1] == (None, 8, 4, 1)
