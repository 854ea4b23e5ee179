"""What streaming a weight from HBM costs on this GPU, under kernel_check.py's timer, beside
StageML's wgmma GEMM and cuBLAS reading the same bytes.

    (here)   nvcc -cubin -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 \\
                 -o DIR/stream_floor.cubin benchmarks/gpu/stream_floor.cu
    (there)  python3 benchmarks/gpu/stream_floor.py DIR/stream_floor.cubin [--report MD]

For weights of 32, 64 and 128 MiB (K = 4096 and N = 4096, 8192, 16384 in f16), each probe of
stream_floor.cu and each GEMM is timed by `kernel_check.device_us` (CUDA events around each call
while a sleep kernel holds the stream, 10 warm-up calls, median of 100) over 4 copies rotated
past the L2, in `--rounds` interleaved rounds (the table: the median of the round medians). A
line t = fixed + bytes / bandwidth is fitted to each row's three sizes: `fixed` is what a call
costs beyond its bytes (launch, ramp, tail), `bandwidth` the rate its bytes stream at.

Checks first: every probe's sum of the buffer's 32-bit words (mod 2^32) against torch's, every
GEMM against float64 (f16 <= 2e-3). Exits 1 on any failure.
"""
import argparse
import math
import os
import statistics
import sys

import cupy
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_check as kc  # noqa: E402

K = 4096
SIZES_MIB = (32, 64, 128)
GEMM_ROWS = (1, 16, 64, 256)
KIB = 1024


def fit(xs: list, ys: list) -> tuple:
    """Least squares y = a + x / b: (a, b)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, (1 / slope if slope > 0 else math.inf)


class Probes:
    def __init__(self, cubin: str):
        module = cupy.RawModule(path=cubin)
        self.fns = {n: module.get_function(n) for n in
                    ("probe_empty", "probe_empty_pair", "probe_ldg4", "probe_ldg8", "probe_bulk", "probe_bulk_pair")}
        for n in ("probe_empty_pair", "probe_bulk", "probe_bulk_pair"):
            self.fns[n].max_dynamic_shared_size_bytes = kc.WG_SMEM
        self.sum = torch.zeros(1, dtype=torch.int32, device="cuda")

    def launch(self, name: str, grid: int, threads: int, args: tuple = (), smem: int = 0) -> None:
        with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            self.fns[name]((grid,), (threads,), args, shared_mem=smem)

    def variants(self, sms: int) -> dict:
        """{name: call(buffer)} of every probe configuration timed."""
        out = {"empty, 1 block": lambda buf: self.launch("probe_empty", 1, 256),
               f"empty, {2 * (sms // 2)} blocks of 256": lambda buf: self.launch("probe_empty", 2 * (sms // 2), 256),
               "empty, the GEMM's launch (128 blocks, clusters of 2, 193 KiB)":
                   lambda buf: self.launch("probe_empty_pair", 128, kc.WG_THREADS[0], (), kc.WG_SMEM)}
        for u in (4, 8):
            for per_sm in (1, 2, 4):
                out[f"ldg {u} x 16 B in flight, {per_sm} x {sms} blocks of 512"] = (
                    lambda buf, u=u, g=per_sm * sms: self.launch(
                        f"probe_ldg{u}", g, 512, (np.uint64(buf.data_ptr()), np.uint64(buf.numel() // 16),
                                                  np.uint64(self.sum.data_ptr()))))
        for pair in (False, True):
            for grid in (128, 2 * (sms // 2)):
                for stage, stages in ((16, 6), (16, 8), (16, 12), (32, 6)):
                    name = (f"bulk {'pairs' if pair else 'blocks'}, {grid} blocks, {stages} x {stage} KiB")
                    out[name] = (lambda buf, pair=pair, grid=grid, stage=stage, stages=stages: self.launch(
                        "probe_bulk_pair" if pair else "probe_bulk", grid, kc.WG_THREADS[0],
                        (np.uint64(buf.data_ptr()), np.uint32(math.ceil(buf.numel() / grid / 16) * 16),
                         np.uint64(buf.numel()), np.uint32(stage * KIB), np.int32(stages),
                         np.uint64(self.sum.data_ptr())), stage * KIB * stages + 2 * 8 * stages))
        return out


def word_sum(buf: torch.Tensor) -> int:
    return int(buf.view(torch.int32).to(torch.int64).sum()) % 2 ** 32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cubin")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--report")
    args = parser.parse_args()
    torch.manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    probes, gemms = Probes(args.cubin), kc.Kernels(args.cubin)
    failures = []

    # the weights: 4 copies a size, in StageML's tile layout (probes and stageml_gemm_wgmma) and as [K, N]
    weights = {}
    for mib in SIZES_MIB:
        N = mib * 2 ** 20 // (2 * K)
        plain = [kc.tensor((K, N), "f16", K ** -0.5) for _ in range(kc.COPIES)]
        weights[mib] = (N, plain, [kc.strips(w) for w in plain])
    variants = probes.variants(sms)

    # checks
    for name, call in variants.items():
        if name.startswith("empty"):
            continue
        buf = weights[SIZES_MIB[0]][2][0].view(torch.uint8).view(-1)
        probes.sum.zero_()
        call(buf)
        got, want = int(probes.sum.item()) % 2 ** 32, word_sum(buf)
        print(f"{'PASS' if got == want else 'FAIL'} {name}: word sum {got:#x}, expected {want:#x}", flush=True)
        if got != want:
            failures.append(name)
    for M in GEMM_ROWS:
        N, plain, tiled = weights[SIZES_MIB[0]]
        x = kc.tensor((M, K), "f16", 1.0)
        y = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float16)
        gemms.gemm_wgmma("f16", x, tiled[0], y, M, K, N)
        ref = x.double() @ plain[0].double()
        err = kc.rel_err(y, ref)
        print(f"{'PASS' if err <= 2e-3 else 'FAIL'} stageml_gemm_wgmma f16 {M} x {K} @ {K} x {N}: "
              f"rel. err {err:.2e} (bound 2e-03)", flush=True)
        if not err <= 2e-3:
            failures.append(f"stageml_gemm_wgmma {M} rows")

    # timings: every row at every size, rounds interleaved
    rows = {}
    for mib in SIZES_MIB:
        N, plain, tiled = weights[mib]
        bufs = [t.view(torch.uint8).view(-1) for t in tiled]
        calls = {name: (lambda i, c=call: c(bufs[i % kc.COPIES])) for name, call in variants.items()}
        for M in GEMM_ROWS:
            x = kc.tensor((M, K), "f16", 1.0)
            y = torch.empty(M, N, device="cuda", dtype=torch.float16)
            calls[f"stageml_gemm_wgmma, {M} rows"] = (
                lambda i, x=x, y=y, M=M, N=N: gemms.gemm_wgmma("f16", x, tiled[i % kc.COPIES], y, M, K, N))
            calls[f"cuBLAS (torch.matmul), {M} rows"] = (
                lambda i, x=x, y=y: torch.matmul(x, plain[i % kc.COPIES], out=y))
        for n, t in kc.device_rounds(calls, args.rounds).items():
            rows.setdefault(n, {})[mib] = t
        print(f"{mib} MiB timed", flush=True)

    peak = kc.hbm_bytes_per_s()
    lines = [f"## Streaming a weight from HBM (stream_floor.py): {torch.cuda.get_device_name()}, {sms} SMs",
             "", f"µs per call, f16 weights of K = {K} rows (kernel_check.py's timer, 4 copies rotated; the median of "
             f"{args.rounds} interleaved rounds of 100 calls); fixed µs and TB/s fitted over the three sizes; "
             f"the floor: bytes / the HBM peak, {peak / 1e12:.2f} TB/s.", "",
             "| call | " + " | ".join(f"{m} MiB" for m in SIZES_MIB) + " | fixed µs | TB/s | 32 MiB / floor |",
             "|---|" + "---:|" * (len(SIZES_MIB) + 3)]
    for name, by_size in rows.items():
        ts = [by_size[m] for m in SIZES_MIB]
        fixed, bw = fit([m * 2 ** 20 for m in SIZES_MIB], [t * 1e-6 for t in ts])
        floor = SIZES_MIB[0] * 2 ** 20 / peak * 1e6
        lines.append(f"| {name} | " + " | ".join(f"{t:.1f}" for t in ts) +
                     f" | {fixed * 1e6:.1f} | {bw / 1e12:.2f} | {ts[0] / floor:.2f}x |")
    lines += ["", "Checks (each probe's word sum, each GEMM against float64): " +
              ("all passed." if not failures else "failed: " + ", ".join(failures))]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.report:
        with open(args.report, "w") as f:
            f.write(text)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
