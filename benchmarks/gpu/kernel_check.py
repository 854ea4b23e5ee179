"""StageML's sm90 kernels (compiler/sm90/kernels.cu) on an H200, without IREE: timings.

    nvcc -ptx -gencode=arch=compute_90a,code=compute_90a -O3 -std=c++17 \\
        -o kernels.ptx compiler/sm90/kernels.cu
    python3 benchmarks/gpu/kernel_check.py kernels.ptx [--quick] [--report MD]

Needs PyTorch (CUDA) and CuPy. The PTX is loaded with cupy.RawModule and
launched on PyTorch's current stream with the grid kernels.cu documents
(`grid` below), on PyTorch tensors. This file is also the launcher
(`Kernels`, `tensor`, `strips`) of the kernels' correctness checks, which
are pytest tests: `STAGEML_SM90_PTX=kernels.ptx python3 -m pytest -m gpu
tests/test_kernels_gpu.py`.

Timings, K = N = 4096: device time from CUDA events around each call,
median of 100 calls (50 with --quick) after 10 warm-up calls, while a
sleep kernel holds the stream until all calls are queued, so host launch
cost never shows. Every call reads a different one of 4 copies of w (and
a, b): 128 MiB outgrow the L2, so every call reads its weights from HBM.
The kernels read w in their strip layout (packed once beforehand, as the
sm90 pipeline does). PyTorch (cuBLAS) runs the same rotation on the
[K, N] weights: torch.matmul(x, w, out=y), and
for LoRA eager x @ w + s * (x @ a) @ b. HBM floor: bytes of w (+ a, b),
x and y once / the GPU's HBM peak (`hbm_bytes_per_s`: 4.8 TB/s on an H200,
3.35 TB/s on an H100 SXM).
"""

import argparse
import math
import os
import statistics

import cupy
import numpy as np
import torch

HBM_PEAKS = {"H100 80GB HBM3": 3.35e12, "H200": 4.8e12}  # bytes/s, the vendor's figures, by device name
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}
DTYPES_NAME = {v: k for k, v in DTYPES.items()}
STREAM_MAX_M, STREAM_COLS, TILE = 64, 32, 64  # kernels.cu's grid constants
STRIP, TILE_W = 8, 64  # w's tile layout [N/64][K/64][8][64][8]: 64x64 tiles of 8-column strips
WG_COLS, WG_PAIR, WG_SPLIT_MAX_M, WG_SMEM = 64, 2, 128, 197632  # stageml_gemm_wgmma's grid and shared memory
WG_THREADS = (288, 1, 1)  # stageml_gemm_wgmma's block: 2 warpgroups and a producer warp
LORA_THREADS = (320, 1, 1)  # stageml_gemm_lora's: and a warp for the shrink
BGMV_SPLIT = 8  # stageml_bgmv's k-chunks: its cluster along z
LORA_SMEM = 230656  # stageml_gemm_lora's dynamic shared memory: and the shrink's factor buffers
BGMV_TILED_FROM, BGMV_TILE = 64, 16  # past 64 rows, stageml_bgmv's blocks take 16 rows each
THREADS = (256, 1, 1)
SCALE = 0.5
RANK = 16  # timed LoRA rank
COPIES = 4
TIMED_M = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TIMED_KN = 4096


def grid(M: int, N: int) -> tuple:
    """The launch grid of both kernels for an [M, K] @ [K, N] product (blocks of 256 threads)."""
    if M <= STREAM_MAX_M:
        return (math.ceil(N / STREAM_COLS), 1, 1)
    return (math.ceil(N / TILE), math.ceil(M / TILE), 1)


def wgmma_grid(M: int, N: int) -> tuple:
    """stageml_gemm_wgmma's grid (kernels.cu): clusters of 2 blocks along x, the 2 halves of K of
    64 columns where M <= 128, else 2 column tiles of 64 over tiles of 128 rows (256 past 256 rows)."""
    if M <= WG_SPLIT_MAX_M:
        return (WG_PAIR * math.ceil(N / WG_COLS), 1, 1)
    rows = 128 if M <= 256 else 256
    return (WG_PAIR * math.ceil(N / (WG_PAIR * WG_COLS)), 1, math.ceil(M / rows))


def lora_scratch(M: int, K: int, R: int) -> int:
    """stageml_gemm_lora's ws: f32 elements of the shrink's partial sums [ceil(K / kc), M, R], kc the
    k-rows of a unit (kernels.cu)."""
    kc = min(1024, 14336 // (2 * R) // 32 * 32)
    return max(math.ceil(K / kc) * M * R, 1)


class Kernels:
    def __init__(self, ptx: str):
        module = cupy.RawModule(path=ptx)
        self.fns = {f"stageml_{k}_{s}": module.get_function(f"stageml_{k}_{s}")
                    for k in ("gemm", "gemm_wgmma", "gemm_expand", "gemm_lora", "lora", "bgmv") for s in DTYPES}
        for k in ("gemm_wgmma", "gemm_expand", "gemm_lora"):
            for s in DTYPES:
                self.fns[f"stageml_{k}_{s}"].max_dynamic_shared_size_bytes = LORA_SMEM if k == "gemm_lora" else WG_SMEM

    def gemm(self, dtype: str, x, w, y, M: int, K: int, N: int) -> None:
        self._launch(f"stageml_gemm_{dtype}", (x, w, y), M, N, [M, K, N])

    def gemm_wgmma(self, dtype: str, x, w, y, M: int, K: int, N: int) -> None:
        """N % 64 == 0 and K % 256 == 0 (kernels.cu)."""
        self._launch(f"stageml_gemm_wgmma_{dtype}", (x, w, y), M, N, [M, K, N], wgmma_grid(M, N), WG_SMEM,
                     WG_THREADS)

    def gemm_expand(self, dtype: str, x, w, t, ids, table, y, M: int, K: int, N: int, R: int, rows: int) -> None:
        """y = x @ w + t @ table[ids] (t f32 [M, R], table [S, R, N]); N % 64 == 0 and K % 256 == 0."""
        self._launch(f"stageml_gemm_expand_{dtype}", (x, w, t, ids, table, y), M, N, [M, K, N, R, rows],
                     wgmma_grid(M, N), WG_SMEM, WG_THREADS)

    def gemm_lora(self, dtype: str, x, w, ids, a, b, y, M: int, K: int, N: int, R: int, rows: int,
                  scale: float = 1.0, ws=None, site: int = 0) -> None:
        """y = x @ w + (scale * x @ a[slot]) @ b[slot] (a [S, K, R], b [S, R, N], slot(m) = ids[m] for
        m < rows, else 0); N % 64 == 0, K % 256 == 0, R <= 32. ws: the shrink's scratch (allocated
        here unless given, f32 of lora_scratch(M, K, R) elements)."""
        if ws is None:
            ws = torch.empty(lora_scratch(M, K, R), device="cuda")
        bits = int(np.float32(scale).view(np.uint32))
        self._launch(f"stageml_gemm_lora_{dtype}", (x, w, ids, a, b, y, ws), M, N, [M, K, N, R, rows, bits, site],
                     wgmma_grid(M, N), LORA_SMEM, LORA_THREADS)

    def lora(self, dtype: str, x, w, a, b, y, M: int, K: int, N: int, R: int, scale: float) -> None:
        bits = int(np.float32(scale).view(np.uint32))
        self._launch(f"stageml_lora_{dtype}", (x, w, a, b, y), M, N, [M, K, N, R, bits])

    def bgmv(self, dtype: str, x, ids, table, y, B: int, K: int, N: int) -> None:
        rows = math.ceil(B / BGMV_TILE) if B > BGMV_TILED_FROM else max(B, 1)
        self._launch(f"stageml_bgmv_{dtype}", (x, ids, table, y), B, N, [B, K, N],
                     ((N + STREAM_COLS - 1) // STREAM_COLS, rows, BGMV_SPLIT))

    def _launch(self, name: str, buffers, M: int, N: int, constants: list, blocks=None, smem: int = 0,
                threads: tuple = THREADS) -> None:
        args = tuple(np.uint64(t.data_ptr()) for t in buffers) + tuple(np.uint32(c) for c in constants)
        with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            self.fns[name](blocks or grid(M, N), threads, args, shared_mem=smem)


# --- inputs (shared with tests/test_kernels_gpu.py) ------------------------------

def tensor(shape, dtype: str, std: float, misaligned: bool = False) -> torch.Tensor:
    """N(0, std^2) of `shape`; `misaligned`: a view one element into its buffer."""
    n = math.prod(shape)
    buf = torch.empty(n + 1, device="cuda", dtype=DTYPES[dtype])
    t = (buf[1:] if misaligned else buf[:n]).view(shape)
    return t.copy_(torch.randn(shape, device="cuda") * std)


def strips(w: torch.Tensor, misaligned: bool = False) -> torch.Tensor:
    """[K, N] w in the kernels' tile layout [N/64, K/64, 8, 64, 8] (kernels.cu)."""
    K, N = w.shape
    shape = (N // TILE_W, K // TILE_W, TILE_W // STRIP, TILE_W, STRIP)
    packed = tensor(shape, DTYPES_NAME[w.dtype], 0.0, misaligned)
    return packed.copy_(w.view(K // TILE_W, TILE_W, N // TILE_W, TILE_W // STRIP, STRIP).permute(2, 0, 3, 1, 4))


def hbm_bytes_per_s() -> float:
    """The current GPU's HBM peak: the vendor's figure where HBM_PEAKS names the device, else its
    memory clock x bus width (two transfers a clock) where the runtime still reports the clock."""
    name = torch.cuda.get_device_name()
    for key, peak in HBM_PEAKS.items():
        if key in name:
            return peak
    props = cupy.cuda.runtime.getDeviceProperties(torch.cuda.current_device())
    if not props.get("memoryClockRate") or not props.get("memoryBusWidth"):
        raise SystemExit(f"{name}: no HBM peak known; add the vendor's figure to HBM_PEAKS in {__file__}")
    return 2 * props["memoryClockRate"] * 1e3 * props["memoryBusWidth"] / 8


def rel_err(y, ref) -> float:
    """||y - ref|| / ||ref|| (ref float64); a NaN anywhere in y counts as inf."""
    e = float((y.double() - ref).norm() / ref.norm())
    return e if e == e else float("inf")


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


def device_rounds(calls: dict, rounds: int) -> dict:
    """{name: the median of `rounds` interleaved device_us(call, 100) medians} of calls {name: call(i)},
    the order rotated each round, so the calls compared share the GPU's slow and fast spells."""
    times = {n: [] for n in calls}
    names = list(calls)
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            times[n].append(device_us(calls[n], 100))
    return {n: statistics.median(v) for n, v in times.items()}


def timings(kernels: Kernels, dtype: str, calls: int) -> list:
    """Table rows for K = N = TIMED_KN at each TIMED_M."""
    K = N = TIMED_KN
    ws = [tensor((K, N), dtype, K ** -0.5) for _ in range(COPIES)]
    wps = [strips(w) for w in ws]  # the same weights in the kernels' layout
    As = [tensor((K, RANK), dtype, K ** -0.5) for _ in range(COPIES)]
    bs = [tensor((RANK, N), dtype, RANK ** -0.5) for _ in range(COPIES)]
    rows, hbm = [], hbm_bytes_per_s()
    for M in TIMED_M:
        x = tensor((M, K), dtype, 1.0)
        y = torch.empty(M, N, device="cuda", dtype=DTYPES[dtype])
        gemm = device_us(lambda i: kernels.gemm(dtype, x, wps[i % COPIES], y, M, K, N), calls)
        wgmma = device_us(lambda i: kernels.gemm_wgmma(dtype, x, wps[i % COPIES], y, M, K, N), calls)
        cublas = device_us(lambda i: torch.matmul(x, ws[i % COPIES], out=y), calls)
        lora = device_us(lambda i: kernels.lora(dtype, x, wps[i % COPIES], As[i % COPIES], bs[i % COPIES], y,
                                                M, K, N, RANK, SCALE), calls)
        eager = device_us(lambda i: x @ ws[i % COPIES] + SCALE * ((x @ As[i % COPIES]) @ bs[i % COPIES]), calls)
        io = (M * K + M * N) * 2
        rows.append(("gemm", dtype, M, gemm, cublas, (K * N * 2 + io) / hbm * 1e6, None))
        rows.append(("gemm_wgmma", dtype, M, wgmma, cublas, (K * N * 2 + io) / hbm * 1e6, None))
        rows.append(("lora", dtype, M, lora, eager, ((K * N + K * RANK + RANK * N) * 2 + io) / hbm * 1e6,
                     lora / gemm))
        print(f"timed {dtype} M={M}: gemm {gemm:.1f} µs, gemm_wgmma {wgmma:.1f} µs (cuBLAS {cublas:.1f}), "
              f"lora {lora:.1f} µs (eager {eager:.1f})", flush=True)
    return rows


BGMV_TIMED = (1, 32, 64, 65, 128, 256, 512)  # rows of the timed shrink
SHRINK_SLOTS = 33  # 32 tenants and the base model


def shrink_ids(B: int, order: str) -> torch.Tensor:
    """Slots of B rows: "prefill", 4 tenants of B/4 contiguous rows; "decode", row i by tenant i mod 32."""
    if order == "prefill":
        return 1 + torch.arange(B, device="cuda") * 4 // max(B, 1)
    return 1 + torch.arange(B, device="cuda") % (SHRINK_SLOTS - 1)


def shrink_timings(kernels: Kernels, dtype: str, calls: int) -> list:
    """A LoRA shrink, x [B, 4096] @ A[slot] [4096, RANK] (f32 out), by stageml_bgmv and by torch
    (the rows' factors gathered, then bmm), for both slot orders."""
    K = TIMED_KN
    tables = [tensor((SHRINK_SLOTS, K, RANK), dtype, K ** -0.5) for _ in range(COPIES)]
    rows, hbm = [], hbm_bytes_per_s()
    for B in BGMV_TIMED:
        for order in ("decode", "prefill"):
            x, ids = tensor((B, K), dtype, 1.0), shrink_ids(B, order)
            y = torch.empty(B, RANK, device="cuda")
            ours = device_us(lambda i: kernels.bgmv(dtype, x, ids, tables[i % COPIES], y, B, K, RANK), calls)
            eager = device_us(lambda i: torch.bmm(x[:, None], tables[i % COPIES][ids])[:, 0].float(), calls)
            distinct = len(set(ids.tolist()))
            floor = ((B * K + distinct * K * RANK) * 2 + B * RANK * 4) / hbm * 1e6
            rows.append((dtype, B, order, ours, eager, floor))
            print(f"timed shrink {dtype} B={B} {order}: bgmv {ours:.1f} µs (gather + bmm {eager:.1f})", flush=True)
    return rows


def shrink_table(rows: list) -> str:
    lines = [f"LoRA shrink alone (stageml_bgmv, K = {TIMED_KN}, rank {RANK}, {SHRINK_SLOTS} slots; decode: row i by "
             "tenant i mod 32; prefill: 4 tenants of contiguous rows); torch: the rows' factors gathered, then bmm.",
             "", "| dtype | rows | order | stageml µs | torch µs | stageml / torch | HBM floor µs |",
             "|---|---:|---|---:|---:|---:|---:|"]
    lines += [f"| {dtype} | {B} | {order} | {ours:.1f} | {eager:.1f} | {ours / eager:.2f} | {floor:.1f} |"
              for dtype, B, order, ours, eager, floor in rows]
    return "\n".join(lines)


SITE_TIMED = ((1, "decode"), (8, "decode"), (32, "decode"), (128, "decode"), (256, "prefill"))


def site_timings(kernels: Kernels, dtype: str, calls: int) -> list:
    """A multi-tenant LoRA site, x [M, 4096] @ W + (x @ A[slot]) @ B[slot] (rank RANK, SHRINK_SLOTS
    slots, the slots as in shrink_ids): the base product alone (stageml_gemm_wgmma), the shrink
    and the expand as two kernels (stageml_bgmv, then stageml_gemm_expand), and in one
    (stageml_gemm_lora)."""
    K = N = TIMED_KN
    wps = [strips(tensor((K, N), dtype, K ** -0.5)) for _ in range(COPIES)]
    As = [tensor((SHRINK_SLOTS, K, RANK), dtype, K ** -0.5) for _ in range(COPIES)]
    Bs = [tensor((SHRINK_SLOTS, RANK, N), dtype, RANK ** -0.5) for _ in range(COPIES)]
    rows = []
    for M, order in SITE_TIMED:
        x, ids = tensor((M, K), dtype, 1.0), shrink_ids(M, order)
        y = torch.empty(M, N, device="cuda", dtype=DTYPES[dtype])
        t = torch.empty(M, RANK, device="cuda")
        ws = torch.empty(lora_scratch(M, K, RANK), device="cuda")

        def two(i):
            kernels.bgmv(dtype, x, ids, As[i % COPIES], t, M, K, RANK)
            kernels.gemm_expand(dtype, x, wps[i % COPIES], t, ids, Bs[i % COPIES], y, M, K, N, RANK, M)

        base = device_us(lambda i: kernels.gemm_wgmma(dtype, x, wps[i % COPIES], y, M, K, N), calls)
        split = device_us(two, calls)
        fused = device_us(lambda i: kernels.gemm_lora(dtype, x, wps[i % COPIES], ids, As[i % COPIES],
                                                      Bs[i % COPIES], y, M, K, N, RANK, M, ws=ws), calls)
        rows.append((dtype, M, order, base, split, fused))
        print(f"timed site {dtype} M={M} {order}: base {base:.1f} µs, bgmv + gemm_expand {split:.1f} µs, "
              f"gemm_lora {fused:.1f} µs", flush=True)
    return rows


def site_table(rows: list) -> str:
    lines = [f"A multi-tenant LoRA site (K = N = {TIMED_KN}, rank {RANK}, {SHRINK_SLOTS} slots, slots as above): "
             "the base product alone (stageml_gemm_wgmma), the shrink and the expand as two kernels "
             "(stageml_bgmv + stageml_gemm_expand, back to back) and as one (stageml_gemm_lora).",
             "", "| dtype | rows | order | base µs | two kernels µs | one kernel µs | one / base | one / two |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {dtype} | {M} | {order} | {base:.1f} | {split:.1f} | {fused:.1f} | {fused / base:.2f} "
              f"| {fused / split:.2f} |" for dtype, M, order, base, split, fused in rows]
    return "\n".join(lines)


def table(rows: list) -> str:
    lines = ["| kernel | dtype | M | stageml µs | torch µs | stageml / torch | HBM floor µs | stageml / floor "
             "| lora / gemm |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for kind, dtype, M, ours, theirs, floor, vs_gemm in rows:
        torch_name = "eager" if kind == "lora" else "cuBLAS"
        lines.append(f"| {kind} | {dtype} | {M} | {ours:.1f} | {theirs:.1f} ({torch_name}) | {ours / theirs:.2f} "
                     f"| {floor:.1f} | {ours / floor:.2f} | {'' if vs_gemm is None else f'{vs_gemm:.2f}'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ptx", help="kernels.cu built to PTX (compute_90a)")
    parser.add_argument("--quick", action="store_true", help="50 timed calls instead of 100")
    parser.add_argument("--report", metavar="MD", help="also write the table to this file")
    parser.add_argument("--sites-only", action="store_true", help="time only the multi-tenant LoRA site")
    args = parser.parse_args()
    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, cupy {cupy.__version__}, seed {seed}",
          flush=True)
    kernels = Kernels(args.ptx)
    rows, shrinks, sites = [], [], []
    for dtype in DTYPES:
        calls = 50 if args.quick else 100
        if not args.sites_only:
            rows += timings(kernels, dtype, calls)
            shrinks += shrink_timings(kernels, dtype, calls)
        sites += site_timings(kernels, dtype, calls)
        torch.cuda.empty_cache()
    peak = f"HBM floors at {hbm_bytes_per_s() / 1e12:.2f} TB/s ({torch.cuda.get_device_name()})."
    text = "\n\n".join(t for t in [peak] + ([table(rows), shrink_table(shrinks)] if rows else []) + [site_table(sites)])
    print()
    print(text)
    if args.report:
        with open(args.report, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
