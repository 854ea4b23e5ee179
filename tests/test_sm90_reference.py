"""use-custom-kernels{lowering=reference}, run on the CPU: every kernel
rewrite computes what the IREE input it replaced computes.

For each kernel pattern (GEMM against adapter state, LoRA against a global
weight with the scale after the second product or on x@A, BGMV against a
slot table), f16 and bf16, and random K (64, 128 or 192, so never the wgmma
GEMM's) and N (64 to 256), for the wgmma GEMM (the GEMM where K is a
multiple of 256) each K of 256 and 512 with each N of 64 and 192, and for
a multi-tenant site (a base product against a global weight plus its
expand, the per-row product of the rounded shrink by a slot table: the
base product with its expand fused, gemm_expand, the shrink a BGMV) K 256
and 512 with N 192 and 64, and the same sites exported for at most 128
rows (bt.dims: the whole site one kernel, gemm_lora): the IREE input like the lit test's is compiled
for llvm-cpu as it is and after the pass, which replaces the match by a
call of the kernel's CPU reference (compiler/sm90/reference.mlir) with the
operands and push constants the kernel's dispatch would get. Both run on
the same fresh random inputs at 1, 5 and 16 rows (the wgmma kernels, made
for any row count: 1, 5, 37 and 300, or 128 where the export bounds the
rows there); the rewritten module's relative error
against the original must stay within 2e-3 (f16) / 1e-2 (bf16) (the kernels
round less often than the linalg they replace; BGMV's f32 results within
1e-5), and the rewritten module must call the reference, so no test passes
by not matching. The GEMM's adapter function returns the tiles it packed:
they must be W in the kernels' layout, element by element.

The gemm_expand and gemm_lora references are also run alone against their semantics in f64
(numpy), with the rows past the ids (slot 0), more ids than rows, and rows of
t past M (not read). The seed is printed; STAGEML_SEED=<seed> repeats a run.
"""

import os
import secrets
import zlib

import ml_dtypes
import numpy as np
import pytest
from iree import compiler as iree_compiler
from iree import runtime as iree_rt
from iree.compiler import ir

from stageml.compiler.passes import run_passes
from stageml.compiler.sm90 import use_custom_kernels  # (importing it registers the pass)

SEED = int(os.environ.get("STAGEML_SEED") or secrets.randbits(32))
ROWS = (1, 5, 16)
WGMMA_ROWS = (1, 5, 37, 300)
RANK = 8
SLOTS = 5
DTYPES = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}
BOUNDS = {"f16": 2e-3, "bf16": 1e-2}
F32_BOUND = 1e-5  # BGMV: f32 sums on both sides, in other orders

CASES = [("gemm", t) for t in DTYPES] \
    + [(f"gemm_wgmma-{k}x{n}", t) for k in (256, 512) for n in (64, 192) for t in DTYPES] \
    + [(f"lora-{order}", t) for order in ("outer", "inner") for t in DTYPES] + [("bgmv", t) for t in DTYPES] \
    + [(f"gemm_expand-{k}x{n}", t) for k, n in ((256, 192), (512, 64)) for t in DTYPES] \
    + [(f"lora_by_expand-{order}-{k}x{n}", t) for order, k, n in (("outer", 256, 192), ("inner", 512, 64))
       for t in DTYPES] \
    + [(f"{site}-bounded-256x192", t) for site in ("gemm_expand", "lora_by_expand-outer") for t in DTYPES]
GEMMS = ("gemm", "gemm_wgmma")
# the kernels each pattern's rewrite calls (a LoRA site with K % 256 = 0 takes the multi-tenant path's)
KERNELS = {"gemm_expand": ("gemm_expand", "bgmv"), "lora_by_expand": ("gemm_expand", "bgmv")}
BOUNDED_ROWS = 128  # a site's rows the export bounds to this: the site is one kernel, gemm_lora
WGMMA = ("gemm_wgmma", "gemm_expand")  # the kernels of any row count, the shapes given
TILE, STRIP = 64, 8


def _rng(*key) -> np.random.Generator:
    """A generator of its own for each test, from the seed and the test's parameters."""
    return np.random.default_rng([SEED, zlib.crc32(repr(key).encode())])


def _random(rng, shape, t: str, std: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * std).astype(DTYPES[t])


def _dense(array: np.ndarray) -> str:
    return f'dense<"0x{np.ascontiguousarray(array).tobytes().hex().upper()}">'


def _tiles(w: np.ndarray) -> np.ndarray:
    """W [K, N] in the kernels' tiles [N/64, K/64, 8, 64, 8]: w[tn, tk, s, kk, c] = W[64 tk + kk, 64 tn + 8 s + c]."""
    k, n = w.shape
    tn, tk, s, kk, c = np.ix_(*(np.arange(d) for d in (n // TILE, k // TILE, TILE // STRIP, TILE, STRIP)))
    return w[TILE * tk + kk, TILE * tn + STRIP * s + c]


# -- the IREE inputs, as the lit test writes them -----------------------------------

_MAP = "#map = affine_map<(d0, d1) -> (d0, d1)>"


def _product(name: str, x: str, x_type: str, w: str, w_type: str, n: str, t: str) -> str:
    """%name = truncf(matmul(x, w) into a zero f32 fill): rows %m, `n` columns."""
    f32, out = f"tensor<?x{n}xf32>", f"tensor<?x{n}x{t}>"
    return f"""
    %{name}_e = tensor.empty(%m) : {f32}
    %{name}_z = linalg.fill ins(%zero : f32) outs(%{name}_e : {f32}) -> {f32}
    %{name}_p = linalg.matmul ins({x}, {w} : {x_type}, {w_type}) outs(%{name}_z : {f32}) -> {f32}
    %{name}_o = tensor.empty(%m) : {out}
    %{name} = linalg.generic {{indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}}
        ins(%{name}_p : {f32}) outs(%{name}_o : {out}) {{
    ^bb0(%in: f32, %out: {t}):
      %r = arith.truncf %in : f32 to {t}
      linalg.yield %r : {t}
    }} -> {out}"""


def _elementwise(name: str, op: str, inputs: list, n: str, t: str) -> str:
    """%name = op(inputs...) (an arith op on T, or `mulf` by a constant %s_<name>)."""
    out = f"tensor<?x{n}x{t}>"
    args = ", ".join(f"%in{i}: {t}" for i in range(len(inputs)))
    body = (f"%r = arith.{op} %in0, %in1 : {t}" if len(inputs) == 2 else f"%r = arith.{op} %in0, %s_{name} : {t}")
    maps = ", ".join(["#map"] * (len(inputs) + 1))
    return f"""
    %{name}_o = tensor.empty(%m) : {out}
    %{name} = linalg.generic {{indexing_maps = [{maps}], iterator_types = ["parallel", "parallel"]}}
        ins({", ".join(inputs)} : {", ".join([out] * len(inputs))}) outs(%{name}_o : {out}) {{
    ^bb0({args}, %out: {t}):
      {body}
      linalg.yield %r : {t}
    }} -> {out}"""


def _gemm_module(t: str, k: int, n: int) -> str:
    """@forward's product against adapter state (@adapter's result 0): the pass packs it in @adapter."""
    x_type, w_type = f"tensor<?x{k}x{t}>", f"tensor<{k}x{n}x{t}>"
    return f"""{_MAP}
module {{
  func.func @adapter(%w: {w_type}) -> {w_type} attributes {{bt.stage = "adapter", bt.program = "main"}} {{
    return %w : {w_type}
  }}
  func.func @forward(%w: {w_type} {{bt.result = 0 : i64}}, %x: {x_type}) -> tensor<?x{n}x{t}>
      attributes {{bt.stage = "dynamic", bt.program = "main"}} {{
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : f32
    %m = tensor.dim %x, %c0 : {x_type}{_product("y", "%x", x_type, "%w", w_type, n, t)}
    return %y : tensor<?x{n}x{t}>
  }}
}}"""


def _rows_bound(k: int, rows: int | None) -> str:
    """x's argument attributes: its export's dims (bt.dims), at most `rows` rows; none for None."""
    return "" if rows is None else f" {{bt.dims = [{{max = {rows} : i64, min = 0 : i64}}, {{max = {k} : i64, min = {k} : i64}}]}}"


def _lora_module(t: str, k: int, n: int, w: np.ndarray, scale: float, order: str, rows: int | None) -> str:
    """A request-path LoRA site against a global weight (packed after its load);
    the scale on (x@A)@B ("outer", PEFT's order) or on x@A ("inner"); x of at most `rows` rows."""
    x_type, w_type = f"tensor<?x{k}x{t}>", f"tensor<{k}x{n}x{t}>"
    a_type, b_type = f"tensor<{k}x{RANK}x{t}>", f"tensor<{RANK}x{n}x{t}>"
    down = _product("down", "%x", x_type, "%a", a_type, str(RANK), t)
    if order == "inner":
        down += _elementwise("t", "mulf", ["%down"], str(RANK), t)
        up = _product("up", "%t", f"tensor<?x{RANK}x{t}>", "%b", b_type, n, t)
        adapted = "%up"
    else:
        up = _product("up", "%down", f"tensor<?x{RANK}x{t}>", "%b", b_type, n, t)
        up += _elementwise("scaled", "mulf", ["%up"], n, t)
        adapted = "%scaled"
    scale_name = "t" if order == "inner" else "scaled"
    return f"""{_MAP}
module {{
  util.global private @w = {_dense(w)} : {w_type}
  func.func @forward(%x: {x_type}{_rows_bound(k, rows)}, %a: {a_type}, %b: {b_type}) -> tensor<?x{n}x{t}>
      attributes {{bt.stage = "dynamic", bt.program = "main"}} {{
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : f32
    %s_{scale_name} = arith.constant {scale!r} : {t}
    %w = util.global.load @w : {w_type}
    %m = tensor.dim %x, %c0 : {x_type}{_product("base", "%x", x_type, "%w", w_type, n, t)}{down}{up}{
        _elementwise("y", "addf", ["%base", adapted], n, t)}
    return %y : tensor<?x{n}x{t}>
  }}
}}"""


def _per_row(name: str, x: str, k: int, table: str, slots: int, n: int, t: str) -> str:
    """%name = fuse-gathers' per-row product of `x` (one-token rows [?, 1, k]), each
    row by its own slot of `table` ([slots, k, n]), into f32: rows %m."""
    x_type, y_type, table_type = f"tensor<?x1x{k}x{t}>", f"tensor<?x1x{n}xf32>", f"tensor<{slots}x{k}x{n}x{t}>"
    return f"""
    %{name}_e = tensor.empty(%m) : {y_type}
    %{name}_z = linalg.fill ins(%zero : f32) outs(%{name}_e : {y_type}) -> {y_type}
    %{name} = linalg.generic {{indexing_maps = [affine_map<(b, m, n, k) -> (b, m, k)>, affine_map<(b, m, n, k) -> (b)>,
                                                affine_map<(b, m, n, k) -> (b, m, n)>],
                               iterator_types = ["parallel", "parallel", "parallel", "reduction"]}}
        ins({x}, %ids : {x_type}, tensor<?xi64>) outs(%{name}_z : {y_type}) {{
    ^bb0(%in: {t}, %id: i64, %out: f32):
      %slot = arith.index_cast %id : i64 to index
      %col = linalg.index 2 : index
      %row = linalg.index 3 : index
      %v = tensor.extract {table}[%slot, %row, %col] : {table_type}
      %vf = arith.extf %v : {t} to f32
      %xf = arith.extf %in : {t} to f32
      %p = arith.mulf %xf, %vf : f32
      %s = arith.addf %out, %p : f32
      linalg.yield %s : f32
    }} -> {y_type}"""


def _rounded_rows(name: str, value: str, n: int, t: str) -> str:
    """%name = truncf(value) to T, value f32 one-token rows [?, 1, n]."""
    f32, out = f"tensor<?x1x{n}xf32>", f"tensor<?x1x{n}x{t}>"
    return f"""
    %{name}_o = tensor.empty(%m) : {out}
    %{name} = linalg.generic {{indexing_maps = [#rows, #rows], iterator_types = ["parallel", "parallel", "parallel"]}}
        ins({value} : {f32}) outs(%{name}_o : {out}) {{
    ^bb0(%in: f32, %out: {t}):
      %r = arith.truncf %in : f32 to {t}
      linalg.yield %r : {t}
    }} -> {out}"""


def _bgmv_module(t: str, k: int, n: int) -> str:
    """fuse-gathers' per-row product: each one-token row by its own slot of the table."""
    x_type, y_type, table_type = f"tensor<?x1x{k}x{t}>", f"tensor<?x1x{n}xf32>", f"tensor<{SLOTS}x{k}x{n}x{t}>"
    return f"""
module {{
  func.func @forward(%x: {x_type}, %ids: tensor<?xi64>, %table: {table_type} {{bt.kind = "resident"}}) -> {y_type}
      attributes {{bt.stage = "dynamic", bt.program = "factorized"}} {{
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : f32
    %m = tensor.dim %x, %c0 : {x_type}{_per_row("y", "%x", k, "%table", SLOTS, n, t)}
    return %y : {y_type}
  }}
}}"""


def _expand_module(t: str, k: int, n: int, w: np.ndarray, rows: int | None) -> str:
    """A multi-tenant site as fuse-gathers leaves it: the base product against a
    global weight plus the expand, the per-row product of the rounded shrink t
    (itself the per-row product of x by the A table) by the B table, rounded and
    collapsed to [M, N]; x of at most `rows` rows."""
    x_type, w_type, out = f"tensor<?x{k}x{t}>", f"tensor<{k}x{n}x{t}>", f"tensor<?x{n}x{t}>"
    a_type, b_type = f"tensor<{SLOTS}x{k}x{RANK}x{t}>", f"tensor<{SLOTS}x{RANK}x{n}x{t}>"
    return f"""{_MAP}
#rows = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
module {{
  util.global private @w = {_dense(w)} : {w_type}
  func.func @forward(%x: {x_type}{_rows_bound(k, rows)}, %ids: tensor<?xi64>, %a: {a_type} {{bt.kind = "resident"}},
                     %b: {b_type} {{bt.kind = "resident"}}) -> {out}
      attributes {{bt.stage = "dynamic", bt.program = "factorized"}} {{
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : f32
    %w = util.global.load @w : {w_type}
    %m = tensor.dim %x, %c0 : {x_type}{_product("base", "%x", x_type, "%w", w_type, n, t)}
    %x1 = tensor.expand_shape %x [[0], [1, 2]] output_shape [%m, 1, {k}] : {x_type} into tensor<?x1x{k}x{t}>{
        _per_row("shrink", "%x1", k, "%a", SLOTS, RANK, t)}{_rounded_rows("shrunk", "%shrink", RANK, t)}{
        _per_row("expand", "%shrunk", RANK, "%b", SLOTS, n, t)}{_rounded_rows("expanded", "%expand", n, t)}
    %low_rank = tensor.collapse_shape %expanded [[0, 1], [2]] : tensor<?x1x{n}x{t}> into {out}{
        _elementwise("y", "addf", ["%base", "%low_rank"], n, t)}
    return %y : {out}
  }}
}}"""


# -- compile, rewrite, run ------------------------------------------------------------

def _rewritten(text: str) -> tuple:
    """(the module after use-custom-kernels{lowering=reference}, its stats)."""
    with ir.Context():
        module = ir.Module.parse(text)
        stats = run_passes(module, "use-custom-kernels{lowering=reference}")
        return str(module), dict(stats)


def _load(text: str):
    vmfb = iree_compiler.compile_str(text, target_backends=["llvm-cpu"],
                                     extra_args=["--iree-llvmcpu-target-cpu=host"])
    config = iree_rt.Config("local-task")
    context = iree_rt.SystemContext(config=config)
    context.add_vm_module(iree_rt.VmModule.copy_buffer(context.instance, vmfb))
    return context.modules.module


def _rel_err(actual, expected) -> float:
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


@pytest.mark.parametrize("pattern,t", CASES, ids=[f"{p}-{t}" for p, t in CASES])
def test_reference_rewrite_computes_the_original(pattern, t):
    print(f"seed {SEED} (STAGEML_SEED={SEED} repeats it)")
    rng = _rng(pattern, t)
    kernel = pattern.split("-")[0]
    bounded = BOUNDED_ROWS if "-bounded-" in pattern else None
    if kernel in WGMMA or kernel == "lora_by_expand":
        k, n = map(int, pattern.split("-")[-1].split("x"))
    else:
        k, n = TILE * int(rng.integers(1, 4)), TILE * int(rng.integers(1, 5))
    if kernel in GEMMS:
        text = _gemm_module(t, k, n)
    elif kernel in ("lora", "lora_by_expand"):
        w = _random(rng, (k, n), t, k ** -0.5)
        # exact in T, and at least sqrt(2) away from 1 by ratio: a dropped scale shows
        scale = float(DTYPES[t](2.0 ** (rng.choice([-1, 1]) * rng.uniform(0.5, 2.0))))
        text = _lora_module(t, k, n, w, scale, pattern.split("-")[1], bounded)
    elif kernel == "gemm_expand":
        text = _expand_module(t, k, n, _random(rng, (k, n), t, k ** -0.5), bounded)
    else:
        text = _bgmv_module(t, k, n)
    rewritten, stats = _rewritten(text)
    called = ("gemm_lora",) if bounded else KERNELS.get(kernel, (kernel,))
    assert stats == {f"stageml_{c}": 1 for c in called}
    for c in called:
        assert f"call @stageml_{c}_{t}_reference(" in rewritten  # the match happened: the reference runs
    assert "linalg.matmul" not in rewritten.split("func.func private @stageml_")[0]
    original, reference = _load(text), _load(rewritten)

    bound = F32_BOUND if kernel == "bgmv" else BOUNDS[t]
    tried = WGMMA_ROWS if kernel in WGMMA or kernel == "lora_by_expand" else ROWS
    for rows in tried if bounded is None else (*tried[:-1], bounded):
        if kernel in GEMMS:
            w, x = _random(rng, (k, n), t, k ** -0.5), _random(rng, (rows, k), t)
            tiles = reference["adapter"](w).to_host()
            assert tiles.dtype == w.dtype and np.array_equal(tiles.view(np.uint16), _tiles(w).view(np.uint16))
            outputs = [original["forward"](original["adapter"](w).to_host(), x).to_host(),
                       reference["forward"](tiles, x).to_host()]
        elif kernel in ("lora", "lora_by_expand"):
            x = _random(rng, (rows, k), t)
            a, b = _random(rng, (k, RANK), t, k ** -0.5), _random(rng, (RANK, n), t, RANK ** -0.5)
            outputs = [m["forward"](x, a, b).to_host() for m in (original, reference)]
        elif kernel == "gemm_expand":
            x, ids = _random(rng, (rows, k), t), rng.integers(0, SLOTS, rows).astype(np.int64)
            a, b = _random(rng, (SLOTS, k, RANK), t, k ** -0.5), _random(rng, (SLOTS, RANK, n), t, RANK ** -0.5)
            outputs = [m["forward"](x, ids, a, b).to_host() for m in (original, reference)]
        else:
            x, table = _random(rng, (rows, 1, k), t), _random(rng, (SLOTS, k, n), t, k ** -0.5)
            ids = rng.integers(0, SLOTS, rows).astype(np.int64)
            outputs = [m["forward"](x, ids, table).to_host() for m in (original, reference)]
        expected, actual = outputs
        assert actual.shape == expected.shape and actual.dtype == expected.dtype
        err = _rel_err(actual, expected)
        assert err <= bound, f"{pattern} {t} K={k} N={n} rows={rows}: rel. err {err:.2e} > {bound:.0e} (seed {SEED})"


def _expand_reference(t: str) -> str:
    """reference.mlir with @run, a public call of stageml_gemm_expand_T's reference."""
    x, w, table = f"tensor<?x?x{t}>", f"tensor<?x?x8x64x8x{t}>", f"tensor<?x?x?x{t}>"
    operands = f"{x}, {w}, tensor<?x1x?xf32>, tensor<?xi64>, {table}, i32, i32, i32, i32, i32"
    return use_custom_kernels.REFERENCES.read_text() + f"""
func.func @run(%x: {x}, %w: {w}, %t: tensor<?x1x?xf32>, %ids: tensor<?xi64>, %table: {table},
               %m: i32, %k: i32, %n: i32, %r: i32, %rows: i32) -> {x} {{
  %y = func.call @stageml_gemm_expand_{t}_reference(%x, %w, %t, %ids, %table, %m, %k, %n, %r, %rows)
      : ({operands}) -> {x}
  return %y : {x}
}}"""


# (M, rows of t, ids given): the ids for every row; fewer (the rest slot 0); more; t with rows past M
EXPAND_ROWS = [(5, 5, 5), (7, 7, 3), (4, 4, 6), (300, 302, 100), (1, 1, 0)]


@pytest.mark.parametrize("t", DTYPES)
def test_gemm_expand_reference_computes_its_semantics(t):
    """y[m] = T(x[m] @ W + t[m, 0] @ table[slot(m)]), slot(m) = ids[m] for m < rows,
    else 0, against f64 (numpy), w in the kernels' tiles."""
    print(f"seed {SEED} (STAGEML_SEED={SEED} repeats it)")
    rng = _rng("gemm_expand-reference", t)
    k, n, rank, slots = 256, 192, 5, 4
    module = _load(_expand_reference(t))
    for m, t_rows, given in EXPAND_ROWS:
        x, w = _random(rng, (m, k), t), _random(rng, (k, n), t, k ** -0.5)
        t_f32 = rng.standard_normal((t_rows, 1, rank)).astype(np.float32)
        t_f32[m:] = 1e30  # not read
        table = _random(rng, (slots, rank, n), t, rank ** -0.5)  # slot 0 too: the rows past the ids read it
        ids = rng.integers(1, slots, given).astype(np.int64)
        y = module["run"](x, _tiles(w), t_f32, ids, table, m, k, n, rank, given).to_host()
        slot = np.zeros(m, np.int64)
        slot[:min(m, given)] = ids[:m]
        expected = (x.astype(np.float64) @ w.astype(np.float64)
                    + np.einsum("mr,mrn->mn", t_f32[:m, 0].astype(np.float64), table.astype(np.float64)[slot]))
        assert y.shape == (m, n) and y.dtype == DTYPES[t]
        err = _rel_err(y, expected)
        assert err <= BOUNDS[t], f"{t} M={m} rows={given}: rel. err {err:.2e} > {BOUNDS[t]:.0e} (seed {SEED})"


def _lora_reference(t: str) -> str:
    """reference.mlir with @run, a public call of stageml_gemm_lora_T's reference."""
    x, w, table = f"tensor<?x?x{t}>", f"tensor<?x?x8x64x8x{t}>", f"tensor<?x?x?x{t}>"
    operands = f"{x}, {w}, tensor<?xi64>, {table}, {table}, i32, i32, i32, i32, i32, i32, i32"
    return use_custom_kernels.REFERENCES.read_text() + f"""
func.func @run(%x: {x}, %w: {w}, %ids: tensor<?xi64>, %a: {table}, %b: {table},
               %m: i32, %k: i32, %n: i32, %r: i32, %rows: i32, %scale: i32) -> {x} {{
  %site = arith.constant 0 : i32
  %y = func.call @stageml_gemm_lora_{t}_reference(%x, %w, %ids, %a, %b, %m, %k, %n, %r, %rows, %scale, %site)
      : ({operands}) -> {x}
  return %y : {x}
}}"""


@pytest.mark.parametrize("t", DTYPES)
def test_gemm_lora_reference_computes_its_semantics(t):
    """y[m] = T(x[m] @ W + (s * x[m] @ a[slot(m)]) @ b[slot(m)]), slot(m) = ids[m] for m < rows,
    else 0, against f64 (numpy), w in the kernels' tiles."""
    print(f"seed {SEED} (STAGEML_SEED={SEED} repeats it)")
    rng = _rng("gemm_lora-reference", t)
    k, n, rank, slots, scale = 256, 192, 5, 4, 0.75
    module = _load(_lora_reference(t))
    for m, given in ((5, 5), (7, 3), (4, 6), (1, 0), (150, 150)):
        x, w = _random(rng, (m, k), t), _random(rng, (k, n), t, k ** -0.5)
        a, b = _random(rng, (slots, k, rank), t, k ** -0.5), _random(rng, (slots, rank, n), t, rank ** -0.5)
        ids = rng.integers(1, slots, given).astype(np.int64)
        bits = int(np.float32(scale).view(np.int32))
        y = module["run"](x, _tiles(w), ids, a, b, m, k, n, rank, given, bits).to_host()
        slot = np.zeros(m, np.int64)
        slot[:min(m, given)] = ids[:m]
        f64 = {name: v.astype(np.float64) for name, v in (("x", x), ("w", w), ("a", a), ("b", b))}
        shrink = scale * np.einsum("mk,mkr->mr", f64["x"], f64["a"][slot])
        expected = f64["x"] @ f64["w"] + np.einsum("mr,mrn->mn", shrink, f64["b"][slot])
        assert y.shape == (m, n) and y.dtype == DTYPES[t]
        err = _rel_err(y, expected)
        assert err <= BOUNDS[t], f"{t} M={m} rows={given}: rel. err {err:.2e} > {BOUNDS[t]:.0e} (seed {SEED})"
