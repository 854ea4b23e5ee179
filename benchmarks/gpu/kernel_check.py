"""StageML's sm90 kernels (compiler/sm90/kernels.cu) on an H200, without IREE.

    nvcc -ptx -gencode=arch=compute_90a,code=compute_90a -O3 -std=c++17 \\
        -o kernels.ptx compiler/sm90/kernels.cu
    python3 benchmarks/gpu/kernel_check.py kernels.ptx [--quick]

Needs PyTorch (CUDA) and CuPy. The PTX is loaded with cupy.RawModule and
launched on PyTorch's current stream with the grid kernels.cu documents
(`grid` below), on PyTorch tensors.

1. Checks, each on fresh random inputs (x ~ N(0,1), w and a ~ N(0,1/K),
   b ~ N(0,1/R)) with y poisoned with NaN, against a float64 reference from
   the same rounded inputs: relative error ||y - ref|| / ||ref|| <= 2e-3
   (fp16), <= 1e-2 (bf16), no NaN. Shapes: K = N = 4096 at M = 1, 16, 64,
   256; odd shapes covering every path and tail; misaligned pointers (a
   view one element into its buffer), which x or w send to the scalar path;
   M = 0, which must leave y alone. BGMV (stageml_bgmv: rows of one token,
   each by its own slot's factor, f32 out) against einsum: rel. err <= 1e-4.
2. Timings, K = N = 4096: device time from CUDA events around each call,
   median of 100 calls (50 with --quick) after 10 warm-up calls, while a
   sleep kernel holds the stream until all calls are queued, so host launch
   cost never shows. Every call reads a different one of 4 copies of w (and
   a, b): 128 MiB outgrow the L2, so every call reads its weights from HBM.
   The kernels read w in their strip layout (packed once beforehand, as the
   sm90 pipeline does). PyTorch (cuBLAS) runs the same rotation on the
   [K, N] weights: torch.matmul(x, w, out=y), and
   for LoRA eager x @ w + s * (x @ a) @ b. HBM floor: bytes of w (+ a, b),
   x and y once / 4.8 TB/s.

Exit status 1 when a check fails.
"""

import argparse
import math
import os
import statistics
import sys

import cupy
import numpy as np
import torch

HBM_BYTES_PER_S = 4.8e12
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}
DTYPES_NAME = {v: k for k, v in DTYPES.items()}
BOUNDS = {"f16": 2e-3, "bf16": 1e-2}
STREAM_MAX_M, STREAM_COLS, TILE = 64, 32, 64  # kernels.cu's grid constants
THREADS = (256, 1, 1)
SCALE = 0.5
RANK = 16  # timed LoRA rank
COPIES = 4
TIMED_M = (1, 16, 64, 256)
TIMED_KN = 4096
FAILURES = []


def grid(M: int, N: int) -> tuple:
    """The launch grid of both kernels for an [M, K] @ [K, N] product (blocks of 256 threads)."""
    if M <= STREAM_MAX_M:
        return (math.ceil(N / STREAM_COLS), 1, 1)
    return (math.ceil(N / TILE), math.ceil(M / TILE), 1)


class Kernels:
    def __init__(self, ptx: str):
        module = cupy.RawModule(path=ptx)
        self.fns = {f"stageml_{k}_{s}": module.get_function(f"stageml_{k}_{s}")
                    for k in ("gemm", "lora", "bgmv") for s in DTYPES}

    def gemm(self, dtype: str, x, w, y, M: int, K: int, N: int) -> None:
        self._launch(f"stageml_gemm_{dtype}", (x, w, y), M, N, [M, K, N])

    def lora(self, dtype: str, x, w, a, b, y, M: int, K: int, N: int, R: int, scale: float) -> None:
        bits = int(np.float32(scale).view(np.uint32))
        self._launch(f"stageml_lora_{dtype}", (x, w, a, b, y), M, N, [M, K, N, R, bits])

    def bgmv(self, dtype: str, x, ids, table, y, B: int, K: int, N: int) -> None:
        self._launch(f"stageml_bgmv_{dtype}", (x, ids, table, y), B, N, [B, K, N],
                     ((N + STREAM_COLS - 1) // STREAM_COLS, max(B, 1), 1))

    def _launch(self, name: str, buffers, M: int, N: int, constants: list, blocks=None) -> None:
        args = tuple(np.uint64(t.data_ptr()) for t in buffers) + tuple(np.uint32(c) for c in constants)
        with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            self.fns[name](blocks or grid(M, N), THREADS, args)


# --- checks ---------------------------------------------------------------------

def tensor(shape, dtype: str, std: float, misaligned: bool = False) -> torch.Tensor:
    """N(0, std^2) of `shape`; `misaligned`: a view one element into its buffer."""
    n = math.prod(shape)
    buf = torch.empty(n + 1, device="cuda", dtype=DTYPES[dtype])
    t = (buf[1:] if misaligned else buf[:n]).view(shape)
    return t.copy_(torch.randn(shape, device="cuda") * std)


def strips(w: torch.Tensor, misaligned: bool = False) -> torch.Tensor:
    """[K, N] w in the kernels' strip layout [N/32, K, 32] (kernels.cu)."""
    K, N = w.shape
    packed = tensor((N // 32, K, 32), DTYPES_NAME[w.dtype], 0.0, misaligned)
    return packed.copy_(w.view(K, N // 32, 32).permute(1, 0, 2))


def check(kernels: Kernels, kind: str, dtype: str, M: int, K: int, N: int, R: int = 0, misaligned=()) -> None:
    x = tensor((M, K), dtype, 1.0, "x" in misaligned)
    w = tensor((K, N), dtype, K ** -0.5)
    wp = strips(w, "w" in misaligned)
    y = tensor((max(M, 1), N), dtype, 0.0, "y" in misaligned).fill_(float("nan"))
    if kind == "gemm":
        kernels.gemm(dtype, x, wp, y, M, K, N)
        ref = x.double() @ w.double()
    else:
        a = tensor((K, R), dtype, K ** -0.5, "a" in misaligned)
        b = tensor((R, N), dtype, R ** -0.5, "b" in misaligned)
        kernels.lora(dtype, x, wp, a, b, y, M, K, N, R, SCALE)
        ref = x.double() @ w.double() + SCALE * ((x.double() @ a.double()) @ b.double())
    torch.cuda.synchronize()
    what = f"{kind} {dtype} M={M} K={K} N={N}" + (f" R={R}" if kind == "lora" else "")
    what += f" misaligned {','.join(misaligned)}" if misaligned else ""
    if M == 0:
        ok, detail = bool(y.isnan().all()), "y untouched"
    else:
        err = float(torch.linalg.norm(y.double() - ref) / torch.linalg.norm(ref))
        ok = bool(torch.isfinite(y).all()) and err <= BOUNDS[dtype]
        detail = f"rel. err {err:.2e} (bound {BOUNDS[dtype]:.0e})" + ("" if torch.isfinite(y).all() else ", NaN/inf")
    print(f"{'PASS' if ok else 'FAIL'} {what}: {detail}", flush=True)
    if not ok:
        FAILURES.append(what)


def check_bgmv(kernels: Kernels, dtype: str, B: int, K: int, N: int, slots: int = 5) -> None:
    """Rows of one token, each against its own slot's [K, N] factor."""
    x = tensor((B, K), dtype, 1.0)
    table = tensor((slots, K, N), dtype, K ** -0.5)
    ids = torch.randint(0, slots, (B,), device="cuda")
    y = torch.full((max(B, 1), N), float("nan"), device="cuda")
    kernels.bgmv(dtype, x, ids, table, y, B, K, N)
    torch.cuda.synchronize()
    ref = torch.einsum("bk,bkn->bn", x.double(), table.double()[ids])
    err = float(torch.linalg.norm(y[:B].double() - ref) / torch.linalg.norm(ref))
    ok = bool(torch.isfinite(y[:B]).all()) and err <= 1e-4  # f32 accumulation and output
    print(f"{'PASS' if ok else 'FAIL'} bgmv {dtype} B={B} K={K} N={N}: rel. err {err:.2e} (bound 1e-04)", flush=True)
    if not ok:
        FAILURES.append(f"bgmv {dtype} B={B} K={K} N={N}")


def checks(kernels: Kernels, quick: bool) -> None:
    timed = [(m, TIMED_KN, TIMED_KN) for m in TIMED_M]
    odd = [(3, 16, 64), (5, 128, 160), (70, 264, 192), (1, 11008, 4096), (2, 4104, 4096), (1, 8, 32),
           (16, 264, 96), (17, 520, 96), (33, 72, 64), (64, 136, 64), (65, 40, 96), (130, 520, 160), (100, 8, 32)]
    ranks = (4, 8, 16, 32)
    for dtype in DTYPES:
        for i, (M, K, N) in enumerate(timed + (odd[:4] if quick else odd)):
            check(kernels, "gemm", dtype, M, K, N)
            for R in ((RANK,) if (M, K, N) in timed else ranks if not quick else (ranks[i % 4],)):
                check(kernels, "lora", dtype, M, K, N, R)
        for M, K, N, R in ((1, 256, 64, 1), (3, 136, 96, 5), (80, 136, 96, 5), (66, 64, 64, 6)):
            check(kernels, "lora", dtype, M, K, N, R)  # R % 4 != 0: a read element by element
        check(kernels, "gemm", dtype, 5, 128, 160, misaligned=("x",))
        check(kernels, "gemm", dtype, 70, 264, 192, misaligned=("w",))
        check(kernels, "gemm", dtype, 3, 256, 96, misaligned=("y",))
        check(kernels, "lora", dtype, 3, 256, 96, 8, misaligned=("a", "b", "y"))
        check(kernels, "lora", dtype, 80, 136, 96, 8, misaligned=("a", "b", "y"))
        check(kernels, "lora", dtype, 2, 64, 64, 4, misaligned=("x",))
        check(kernels, "lora", dtype, 66, 64, 64, 4, misaligned=("w",))
        check(kernels, "gemm", dtype, 0, 64, 64)
        check(kernels, "lora", dtype, 0, 64, 64, 4)
        for B, K, N in ((1, 4096, 16), (32, 4096, 16), (32, 16, 4096), (7, 40, 72), (3, 8, 8)):
            check_bgmv(kernels, dtype, B, K, N)


# --- timing ---------------------------------------------------------------------

def device_us(call, calls: int, warmup: int = 10) -> float:
    """Median device µs of call(i), from CUDA events around each of `calls` calls."""
    for i in range(warmup):
        call(i)
    torch.cuda.synchronize()
    cycles = calls * 200_000  # ~100 µs of host time per call, at ~2 GHz
    for _ in range(4):
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
        held = torch.cuda.Event()
        torch.cuda._sleep(cycles)
        held.record()
        for i in range(calls):
            starts[i].record()
            call(i)
            ends[i].record()
        drained = held.query()  # the sleep ended before all calls were queued: the GPU may have idled
        torch.cuda.synchronize()
        if not drained:
            break
        cycles *= 4
    else:
        print("warning: the host could not queue calls ahead of the GPU; times include launch gaps")
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))


def timings(kernels: Kernels, dtype: str, calls: int) -> list:
    """Table rows for K = N = TIMED_KN at each TIMED_M."""
    K = N = TIMED_KN
    ws = [tensor((K, N), dtype, K ** -0.5) for _ in range(COPIES)]
    wps = [strips(w) for w in ws]  # the same weights in the kernels' layout
    As = [tensor((K, RANK), dtype, K ** -0.5) for _ in range(COPIES)]
    bs = [tensor((RANK, N), dtype, RANK ** -0.5) for _ in range(COPIES)]
    rows = []
    for M in TIMED_M:
        x = tensor((M, K), dtype, 1.0)
        y = torch.empty(M, N, device="cuda", dtype=DTYPES[dtype])
        gemm = device_us(lambda i: kernels.gemm(dtype, x, wps[i % COPIES], y, M, K, N), calls)
        cublas = device_us(lambda i: torch.matmul(x, ws[i % COPIES], out=y), calls)
        lora = device_us(lambda i: kernels.lora(dtype, x, wps[i % COPIES], As[i % COPIES], bs[i % COPIES], y,
                                                M, K, N, RANK, SCALE), calls)
        eager = device_us(lambda i: x @ ws[i % COPIES] + SCALE * ((x @ As[i % COPIES]) @ bs[i % COPIES]), calls)
        io = (M * K + M * N) * 2
        rows.append(("gemm", dtype, M, gemm, cublas, (K * N * 2 + io) / HBM_BYTES_PER_S * 1e6, None))
        rows.append(("lora", dtype, M, lora, eager, ((K * N + K * RANK + RANK * N) * 2 + io) / HBM_BYTES_PER_S * 1e6,
                     lora / gemm))
        print(f"timed {dtype} M={M}: gemm {gemm:.1f} µs (cuBLAS {cublas:.1f}), "
              f"lora {lora:.1f} µs (eager {eager:.1f})", flush=True)
    return rows


def table(rows: list) -> str:
    lines = ["| kernel | dtype | M | stageml µs | torch µs | stageml / torch | HBM floor µs | stageml / floor "
             "| lora / gemm |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for kind, dtype, M, ours, theirs, floor, vs_gemm in rows:
        torch_name = "cuBLAS" if kind == "gemm" else "eager"
        lines.append(f"| {kind} | {dtype} | {M} | {ours:.1f} | {theirs:.1f} ({torch_name}) | {ours / theirs:.2f} "
                     f"| {floor:.1f} | {ours / floor:.2f} | {'' if vs_gemm is None else f'{vs_gemm:.2f}'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ptx", help="kernels.cu built to PTX (compute_90a)")
    parser.add_argument("--quick", action="store_true", help="fewer odd shapes and ranks, 50 timed calls")
    parser.add_argument("--report", metavar="MD", help="also write the table to this file")
    args = parser.parse_args()
    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, cupy {cupy.__version__}, seed {seed}",
          flush=True)
    kernels = Kernels(args.ptx)
    checks(kernels, args.quick)
    rows = []
    for dtype in DTYPES:
        rows += timings(kernels, dtype, 50 if args.quick else 100)
        torch.cuda.empty_cache()
    print()
    print(table(rows))
    if args.report:
        with open(args.report, "w") as f:
            f.write(table(rows) + "\n")
    if FAILURES:
        print(f"\n{len(FAILURES)} check(s) failed: {'; '.join(FAILURES)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
