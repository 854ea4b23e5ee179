"""StageML's sm90 kernels (compiler/sm90/kernels.cu) on a Hopper GPU, without
IREE: the PTX launched with CuPy (benchmarks/gpu/kernel_check.py's launcher)
on PyTorch tensors, against float64 PyTorch on the same rounded inputs.

    STAGEML_SM90_PTX=build/sm90/stageml_sm90.ptx python -m pytest -m gpu tests/test_kernels_gpu.py

Without STAGEML_SM90_PTX the PTX is built with nvcc (compiler/sm90/build.py).
Skipped without a CUDA GPU, on a GPU that is not sm_90 (the PTX is
compute_90a), and without CuPy.

Each check on fresh random inputs (x ~ N(0,1), w and a ~ N(0,1/K),
b ~ N(0,1/R)) with y poisoned with NaN: relative error ||y - ref|| / ||ref||
<= 2e-3 (fp16), <= 1e-2 (bf16), no NaN. Shapes: K = N = 4096 at the timed
row counts; odd shapes covering every path and tail; ranks that are not a
multiple of 4 (a read element by element); misaligned pointers (a view one
element into its buffer), which x or w send to the scalar path; M = 0, which
must leave y alone. The wgmma GEMM at every token-tile size and its edges
(1-513 rows, more than one tile along z) and on ragged model shapes; the
fused expand (each row's own slot, slot 0 the base model, rows past the ids
taking slot 0); the fused shrink and expand (the same, and more blocks than SMs,
and calls of one site back to back). BGMV (rows of one token, each by its own slot's factor,
f32 out) against einsum: rel. err <= 1e-4. The seed is printed;
STAGEML_SEED=<seed> repeats a run.
"""

import os
import pathlib
import secrets
import sys
import zlib

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("the kernel checks need a CUDA GPU: torch.cuda.is_available() is False", allow_module_level=True)
if torch.cuda.get_device_capability() != (9, 0):
    pytest.skip(f"the kernels are compute_90a PTX, which needs a Hopper GPU (sm_90), not "
                f"{torch.cuda.get_device_name()}", allow_module_level=True)
pytest.importorskip("cupy", reason="the kernel checks launch the PTX with CuPy, which is not installed")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"))
import kernel_check as kc  # noqa: E402

SEED = int(os.environ.get("STAGEML_SEED") or secrets.randbits(32))
BOUNDS = {"f16": 2e-3, "bf16": 1e-2}
BGMV_BOUND = 1e-4  # f32 accumulation and output
SCALE = kc.SCALE

TIMED = [(m, kc.TIMED_KN, kc.TIMED_KN) for m in kc.TIMED_M]
ODD = [(3, 64, 64), (5, 128, 192), (70, 320, 192), (1, 11008, 4096), (2, 4160, 4096), (1, 64, 64),
       (16, 320, 128), (17, 576, 128), (33, 64, 64), (64, 128, 64), (65, 64, 128), (130, 576, 192), (100, 64, 64)]
RANKS = (4, 8, 16, 32)

# (M, K, N, misaligned)
GEMM = ([(M, K, N, ()) for M, K, N in TIMED + ODD]
        + [(5, 128, 192, ("x",)), (70, 320, 192, ("w",)), (3, 256, 128, ("y",)), (0, 64, 64, ())])
# stageml_gemm_wgmma (N % 64 == 0, K % 256 == 0): every token-tile size and its edges, more
# than one tile along z, K-quarters of one stage, ragged shapes of the kind a model has
WGMMA = ([(M, 4096, 4096, ()) for M in (1, 2, 3, 4, 5, 8, 9, 16, 17, 31, 32, 33, 63, 64, 65, 100, 127, 128,
                                          129, 130, 161, 193, 200, 255, 256, 257, 300, 513)]
         + [(5, 256, 64, ()), (37, 512, 384, ()), (300, 768, 192, ()), (1, 11008, 4096, ()), (17, 4096, 11008, ()),
            (129, 512, 320, ()), (513, 256, 64, ()),  # column pairs sharing x, one block past N
            (5, 512, 256, ("x",)), (70, 256, 128, ("w",)), (3, 256, 64, ("y",)), (0, 256, 128, ())])
# (M, K, N, R, misaligned)
LORA = ([(M, K, N, kc.RANK, ()) for M, K, N in TIMED] + [(M, K, N, R, ()) for M, K, N in ODD for R in RANKS]
        + [(1, 256, 64, 1, ()), (3, 128, 128, 5, ()), (80, 128, 128, 5, ()), (66, 64, 64, 6, ())]  # R % 4 != 0
        + [(3, 256, 128, 8, ("a", "b", "y")), (80, 128, 128, 8, ("a", "b", "y")), (2, 64, 64, 4, ("x",)),
           (66, 64, 64, 4, ("w",)), (0, 64, 64, 4, ())])
# (B, K, N)
BGMV = [(1, 4096, 16), (32, 4096, 16), (32, 16, 4096), (7, 40, 72), (3, 8, 8),
        (2, 4096, 8), (3, 1000, 16), (1, 520, 48),  # the vector path (N <= 16 strips, K >= 512), ragged K, mixed strips
        (70, 4096, 16), (257, 1000, 16), (13, 40, 72),  # more rows
        (64, 4096, 16), (65, 4096, 16), (256, 4096, 16), (256, 4096, 32), (300, 1024, 48), (200, 4096, 24),
        (133, 128, 8), (140, 4096, 16, ("x",))]  # 16-row tiles: by mma (K % 128 == 0, x 4-byte aligned), else by row


def _id(case) -> str:
    *dims, misaligned = case if isinstance(case[-1], tuple) else (*case, ())
    return "x".join(map(str, dims)) + (f"-misaligned-{''.join(misaligned)}" if misaligned else "")


@pytest.fixture(scope="module")
def kernels():
    ptx = os.environ.get("STAGEML_SM90_PTX")
    if not ptx:
        from stageml.compiler.sm90 import build
        from stageml.errors import CompileError
        try:
            ptx = str(build.build() / build.PTX)
        except CompileError as e:
            pytest.skip(f"no PTX: set STAGEML_SM90_PTX, or {e}")
    print(f"{torch.cuda.get_device_name()}, PTX {ptx}, seed {SEED} (STAGEML_SEED={SEED} repeats it)")
    return kc.Kernels(ptx)


@pytest.fixture(autouse=True)
def _seeded(request):
    torch.manual_seed(SEED ^ zlib.crc32(request.node.name.encode()))


def _check(kernels, kind: str, dtype: str, M: int, K: int, N: int, R: int = 0, misaligned=()) -> None:
    x = kc.tensor((M, K), dtype, 1.0, "x" in misaligned)
    w = kc.tensor((K, N), dtype, K ** -0.5)
    wp = kc.strips(w, "w" in misaligned)
    y = kc.tensor((max(M, 1), N), dtype, 0.0, "y" in misaligned).fill_(float("nan"))
    if kind in ("gemm", "gemm_wgmma"):
        getattr(kernels, kind)(dtype, x, wp, y, M, K, N)
        ref = x.double() @ w.double()
    else:
        a = kc.tensor((K, R), dtype, K ** -0.5, "a" in misaligned)
        b = kc.tensor((R, N), dtype, R ** -0.5, "b" in misaligned)
        kernels.lora(dtype, x, wp, a, b, y, M, K, N, R, SCALE)
        ref = x.double() @ w.double() + SCALE * ((x.double() @ a.double()) @ b.double())
    torch.cuda.synchronize()
    what = f"{kind} {dtype} M={M} K={K} N={N}" + (f" R={R}" if kind == "lora" else "") + f" (seed {SEED})"
    if M == 0:
        assert bool(y.isnan().all()), f"{what}: M = 0 wrote y"
        return
    assert bool(torch.isfinite(y).all()), f"{what}: NaN/inf in y"
    err = float(torch.linalg.norm(y.double() - ref) / torch.linalg.norm(ref))
    assert err <= BOUNDS[dtype], f"{what}: rel. err {err:.2e} > {BOUNDS[dtype]:.0e}"


@pytest.mark.parametrize("dtype", kc.DTYPES)
@pytest.mark.parametrize("M,K,N,misaligned", GEMM, ids=map(_id, GEMM))
def test_gemm(kernels, dtype, M, K, N, misaligned):
    _check(kernels, "gemm", dtype, M, K, N, misaligned=misaligned)


@pytest.mark.parametrize("dtype", kc.DTYPES)
@pytest.mark.parametrize("M,K,N,misaligned", WGMMA, ids=map(_id, WGMMA))
def test_gemm_wgmma(kernels, dtype, M, K, N, misaligned):
    _check(kernels, "gemm_wgmma", dtype, M, K, N, misaligned=misaligned)


# stageml_gemm_expand: (M, K, N, R, ids given, misaligned); slot 0 is the base model (zeros)
EXPAND = [(M, 4096, 4096, 16, M, ()) for M in (1, 7, 32, 128, 140, 256, 300)] + [
    (5, 256, 64, 8, 5, ()), (37, 512, 384, 13, 37, ()), (9, 256, 128, 4, 4, ()), (3, 256, 128, 16, 3, ("x",)),
    (200, 512, 192, 8, 150, ()), (300, 256, 64, 4, 300, ()),  # column pairs sharing x, one block past N
    (0, 256, 128, 16, 0, ())]


@pytest.mark.parametrize("dtype", kc.DTYPES)
@pytest.mark.parametrize("M,K,N,R,rows,misaligned", EXPAND, ids=map(_id, EXPAND))
def test_gemm_expand(kernels, dtype, M, K, N, R, rows, misaligned, slots=6):
    """The base product of each row plus its own slot's expand t[m] @ table[ids[m]]."""
    x = kc.tensor((M, K), dtype, 1.0, "x" in misaligned)
    w = kc.tensor((K, N), dtype, K ** -0.5)
    t = torch.randn(max(M, 1), R, device="cuda")
    table = kc.tensor((slots, R, N), dtype, R ** -0.5)
    table[0] = 0
    ids = torch.randint(0, slots, (max(rows, 1),), device="cuda")
    ids[: max(rows, 1) // 3] = 0  # rows of the base model among the tenants'
    y = torch.full((max(M, 1), N), float("nan"), device="cuda", dtype=kc.DTYPES[dtype])
    kernels.gemm_expand(dtype, x, kc.strips(w), t, ids, table, y, M, K, N, R, rows)
    torch.cuda.synchronize()
    what = f"gemm_expand {dtype} M={M} K={K} N={N} R={R} ids={rows} (seed {SEED})"
    if M == 0:
        assert bool(y.isnan().all()), f"{what}: M = 0 wrote y"
        return
    slot = torch.zeros(M, dtype=torch.long, device="cuda")
    slot[: min(rows, M)] = ids[: min(rows, M)]
    ref = x.double() @ w.double() + torch.einsum("mr,mrn->mn", t[:M].double(), table.double()[slot])
    assert bool(torch.isfinite(y).all()), f"{what}: NaN/inf in y"
    err = float(torch.linalg.norm(y.double() - ref) / torch.linalg.norm(ref))
    assert err <= BOUNDS[dtype], f"{what}: rel. err {err:.2e} > {BOUNDS[dtype]:.0e}"


# stageml_gemm_lora: (M, K, N, R, ids given, misaligned); slot 0 is the base model (zeros). More
# blocks than SMs (N = 14336: 448 at 1-128 rows), ranks that are no multiple of 8 (a read
# element by element), ragged K (a last shrink chunk of 256), ranks 24 and 32 at 65-128 rows, few
# blocks for many shrink units (N = 64), x misaligned past 32 rows
GEMM_LORA = [(M, 4096, 4096, 16, M, ()) for M in (1, 7, 32, 128, 140, 256, 300)] + [
    (1, 4096, 14336, 16, 1, ()), (64, 4096, 14336, 8, 64, ()), (5, 256, 64, 8, 5, ()), (37, 768, 384, 13, 37, ()),
    (9, 256, 128, 4, 4, ()), (3, 256, 128, 16, 3, ("x",)), (200, 512, 192, 32, 150, ()), (300, 256, 64, 5, 300, ()),
    (0, 256, 128, 16, 0, ()), (100, 512, 192, 24, 100, ()), (77, 512, 128, 32, 60, ()), (128, 4096, 64, 16, 128, ()),
    (50, 1024, 128, 16, 50, ("x",))]


def _gemm_lora_case(dtype, M, K, N, R, rows, misaligned, slots=6, scale=1.0, order="random"):
    """Inputs of stageml_gemm_lora and the float64 reference of its result; the rows' slots in
    random order (a third of them slot 0), all one tenant's, or each row its own."""
    if order == "distinct":
        slots = max(rows, 1) + 1
    x = kc.tensor((M, K), dtype, 1.0, "x" in misaligned)
    w = kc.tensor((K, N), dtype, K ** -0.5)
    a = kc.tensor((slots, K, R), dtype, K ** -0.5)
    b = kc.tensor((slots, R, N), dtype, R ** -0.5)
    a[0], b[0] = 0, 0
    ids = torch.randint(0, slots, (max(rows, 1),), device="cuda")
    ids[: max(rows, 1) // 3] = 0  # rows of the base model among the tenants'
    if order == "one tenant":
        ids[:] = 1
    elif order == "distinct":
        ids = torch.randperm(max(rows, 1), device="cuda") + 1
    slot = torch.zeros(M, dtype=torch.long, device="cuda")
    slot[: min(rows, M)] = ids[: min(rows, M)]
    t = scale * torch.einsum("mk,mkr->mr", x.double(), a.double()[slot])
    ref = x.double() @ w.double() + torch.einsum("mr,mrn->mn", t, b.double()[slot])
    return (x, kc.strips(w), ids, a, b), ref


def _assert_close(y, ref, what, dtype):
    assert bool(torch.isfinite(y).all()), f"{what}: NaN/inf in y"
    err = float(torch.linalg.norm(y.double() - ref) / torch.linalg.norm(ref))
    assert err <= BOUNDS[dtype], f"{what}: rel. err {err:.2e} > {BOUNDS[dtype]:.0e}"


@pytest.mark.parametrize("dtype", kc.DTYPES)
@pytest.mark.parametrize("M,K,N,R,rows,misaligned", GEMM_LORA, ids=map(_id, GEMM_LORA))
def test_gemm_lora(kernels, dtype, M, K, N, R, rows, misaligned):
    """Each row's base product plus its own slot's LoRA, shrink and expand in one kernel; the
    scratch poisoned with NaN (the kernel must write every partial sum it reads)."""
    inputs, ref = _gemm_lora_case(dtype, M, K, N, R, rows, misaligned, scale=0.5)
    y = torch.full((max(M, 1), N), float("nan"), device="cuda", dtype=kc.DTYPES[dtype])
    ws = torch.full((kc.lora_scratch(M, K, R),), float("nan"), device="cuda")
    kernels.gemm_lora(dtype, *inputs, y, M, K, N, R, rows, scale=0.5, ws=ws, site=M)
    torch.cuda.synchronize()
    what = f"gemm_lora {dtype} M={M} K={K} N={N} R={R} ids={rows} (seed {SEED})"
    if M == 0:
        assert bool(y.isnan().all()), f"{what}: M = 0 wrote y"
        return
    _assert_close(y[:M], ref, what, dtype)


@pytest.mark.parametrize("dtype", kc.DTYPES)
@pytest.mark.parametrize("order", ["one tenant", "distinct"])
@pytest.mark.parametrize("M,R", [(32, 16), (40, 16), (128, 16), (128, 8), (96, 32), (128, 13)])
def test_gemm_lora_slot_orders(kernels, dtype, order, M, R):
    """Every row one tenant's (all rows read one slot's factors) or each row its own slot (as many
    slots as rows); 40 rows: the shrink warp alone past 32 rows."""
    inputs, ref = _gemm_lora_case(dtype, M, 2048, 1024, R, M, (), order=order)
    y = torch.full((M, 1024), float("nan"), device="cuda", dtype=kc.DTYPES[dtype])
    kernels.gemm_lora(dtype, *inputs, y, M, 2048, 1024, R, M, site=5)
    torch.cuda.synchronize()
    _assert_close(y, ref, f"gemm_lora {dtype} M={M} R={R} {order} (seed {SEED})", dtype)


@pytest.mark.parametrize("dtype", kc.DTYPES)
def test_gemm_lora_calls_in_a_row(kernels, dtype):
    """Calls of one site back to back, of different shapes, with no host sync between them: each
    starts from the counters the one before left (its last block zeroes them)."""
    cases = [(M, 1024, 1024, 16, M, ()) for M in (1, 33, 200, 2, 128, 300, 7)]
    runs = []
    for case in cases:
        inputs, ref = _gemm_lora_case(dtype, *case)
        y = torch.empty(case[0], case[2], device="cuda", dtype=kc.DTYPES[dtype])
        kernels.gemm_lora(dtype, *inputs, y, *case[:5], site=3)
        runs.append((case, y, ref))
    torch.cuda.synchronize()
    for case, y, ref in runs:
        _assert_close(y, ref, f"gemm_lora {dtype} {case} in a row (seed {SEED})", dtype)


@pytest.mark.parametrize("dtype", kc.DTYPES)
@pytest.mark.parametrize("M,K,N,R,misaligned", LORA, ids=map(_id, LORA))
def test_lora(kernels, dtype, M, K, N, R, misaligned):
    _check(kernels, "lora", dtype, M, K, N, R, misaligned)


@pytest.mark.parametrize("dtype", kc.DTYPES)
@pytest.mark.parametrize("case", BGMV, ids=map(_id, BGMV))
@pytest.mark.parametrize("order", ["random", "segments", "round-robin"])
def test_bgmv(kernels, dtype, case, order, slots=20):
    """Rows of one token, each against its own slot's [K, N] factor; the slots in random
    order, in contiguous segments (a prompt's rows), or row i by slot i mod 20 (every
    16-row tile has 16 distinct slots)."""
    B, K, N, misaligned = case if len(case) == 4 else (*case, ())
    x = kc.tensor((B, K), dtype, 1.0, "x" in misaligned)
    table = kc.tensor((slots, K, N), dtype, K ** -0.5)
    ids = torch.randint(0, slots, (B,), device="cuda")
    if order == "segments":
        ids = ids.sort().values
    elif order == "round-robin":
        ids = torch.arange(B, device="cuda") % slots
    y = torch.full((max(B, 1), N), float("nan"), device="cuda")
    kernels.bgmv(dtype, x, ids, table, y, B, K, N)
    torch.cuda.synchronize()
    ref = torch.einsum("bk,bkn->bn", x.double(), table.double()[ids])
    assert bool(torch.isfinite(y[:B]).all()), f"bgmv {dtype} B={B} K={K} N={N} (seed {SEED}): NaN/inf in y"
    err = float(torch.linalg.norm(y[:B].double() - ref) / torch.linalg.norm(ref))
    assert err <= BGMV_BOUND, f"bgmv {dtype} B={B} K={K} N={N} (seed {SEED}): rel. err {err:.2e} > {BGMV_BOUND:.0e}"
