"""Builds of compiler/sm90/kernels.cu side by side on one GPU: the wgmma GEMM against cuBLAS, and the
multi-tenant LoRA kernels (gemm_expand, gemm_lora), every result checked against float64 first.

    (here)   nvcc -cubin -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -o DIR/NAME.cubin NAME.cu
    (there)  python3 benchmarks/gpu/compare_builds.py DIR NAME... [--rows 1,64,256] [--lora-rows 1,32]
             [--lora-builds NAME,...] [--rounds 3] [--shape K,N] [--json OUT]

DIR/NAME.cubin (or .ptx) per build; kernel_check.py's launcher and timer (CUDA events while a
sleep kernel holds the stream, 4 weight copies rotated past the L2, median of 100 calls). Each
row count is timed in `rounds` interleaved rounds, the order rotated each round; a table cell is
the median of its round medians. K = N = 4096 (--shape: others), rank 16, 33 slots; LoRA rows take slot
1 + (row mod 32), from 256 rows 4 tenants of contiguous rows (kernel_check.shrink_ids). Exits 1
if any result is off float64 by more than 2e-3 (fp16) or 1e-2 (bf16).
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_check as kc  # noqa: E402

SHAPE = (4096, 4096)  # K, N unless --shape says otherwise
SLOTS = 33
BOUNDS = {"f16": 2e-3, "bf16": 1e-2}  # relative error against float64 (tests/test_kernels_gpu.py's)


def gemm_table(builds: dict, dtype: str, rows: list, rounds: int, worst: dict, K: int, N: int) -> list:
    ws = [kc.tensor((K, N), dtype, K ** -0.5) for _ in range(kc.COPIES)]
    tiled = [kc.strips(w) for w in ws]
    lines = [f"| {dtype} M | " + " | ".join(builds) + " | cuBLAS |", "|---:|" + "---:|" * (len(builds) + 1)]
    for M in rows:
        x = kc.tensor((M, K), dtype, 1.0)
        y = torch.empty(M, N, device="cuda", dtype=kc.DTYPES[dtype])
        ref = x.double() @ ws[0].double()
        for name, k in builds.items():
            y.fill_(float("nan"))
            k.gemm_wgmma(dtype, x, tiled[0], y, M, K, N)
            torch.cuda.synchronize()
            key = f"{name} gemm {dtype}"
            worst[key] = max(worst.get(key, 0.0), kc.rel_err(y, ref))
        calls = {n: (lambda i, k=k: k.gemm_wgmma(dtype, x, tiled[i % kc.COPIES], y, M, K, N)) for n, k in builds.items()}
        calls["cuBLAS"] = lambda i: torch.matmul(x, ws[i % kc.COPIES], out=y)
        med = kc.device_rounds(calls, rounds)
        lines.append(f"| {M} | " + " | ".join(f"{med[n]:.1f}" for n in calls) + " |")
    return lines


def lora_table(builds: dict, dtype: str, rows: list, rounds: int, worst: dict, K: int, N: int) -> list:
    R = kc.RANK
    ws = [kc.tensor((K, N), dtype, K ** -0.5) for _ in range(kc.COPIES)]
    tiled = [kc.strips(w) for w in ws]
    tables = [kc.tensor((SLOTS, R, N), dtype, R ** -0.5) for _ in range(kc.COPIES)]
    As = [kc.tensor((SLOTS, K, R), dtype, K ** -0.5) for _ in range(kc.COPIES)]
    Bs = [kc.tensor((SLOTS, R, N), dtype, R ** -0.5) for _ in range(kc.COPIES)]
    heads = [f"{n} {kind}" for kind in ("expand", "lora") for n in builds]
    lines = [f"| {dtype} M | " + " | ".join(heads) + " |", "|---:|" + "---:|" * len(heads)]
    for M in rows:
        x = kc.tensor((M, K), dtype, 1.0)
        y = torch.empty(M, N, device="cuda", dtype=kc.DTYPES[dtype])
        ids = kc.shrink_ids(M, "prefill" if M >= 256 else "decode")
        t = torch.randn(M, R, device="cuda")
        scratch = torch.empty(kc.lora_scratch(M, K, R), device="cuda")
        base = x.double() @ ws[0].double()
        refs = {"expand": base + torch.einsum("mr,mrn->mn", t.double(), tables[0].double()[ids]),
                "lora": base + torch.einsum("mr,mrn->mn", torch.einsum("mk,mkr->mr", x.double(), As[0].double()[ids]),
                                            Bs[0].double()[ids])}
        calls = {}
        for name, k in builds.items():
            expand = (lambda i, k=k: k.gemm_expand(dtype, x, tiled[i % kc.COPIES], t, ids, tables[i % kc.COPIES], y,
                                                   M, K, N, R, M))
            lora = (lambda i, k=k: k.gemm_lora(dtype, x, tiled[i % kc.COPIES], ids, As[i % kc.COPIES],
                                               Bs[i % kc.COPIES], y, M, K, N, R, M, ws=scratch, site=1))
            for kind, call in (("expand", expand), ("lora", lora)):
                y.fill_(float("nan"))
                call(0)
                torch.cuda.synchronize()
                key = f"{name} {kind} {dtype}"
                worst[key] = max(worst.get(key, 0.0), kc.rel_err(y, refs[kind]))
                calls[f"{name} {kind}"] = call
        med = kc.device_rounds(calls, rounds)
        lines.append(f"| {M} | " + " | ".join(f"{med[h]:.1f}" for h in heads) + " |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir")
    parser.add_argument("builds", nargs="+")
    parser.add_argument("--rows", default="1,16,32,64,96,128,129,160,192,200,256,257,384,512")
    parser.add_argument("--lora-rows", default="1,32,64,128,129,160,200,256,257,512")
    parser.add_argument("--lora-builds", help="the builds whose LoRA kernels are timed (default: all)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shape", default=",".join(map(str, SHAPE)), help="K,N (multiples of 256 and 64)")
    parser.add_argument("--json", help="write the tables and the worst errors here")
    args = parser.parse_args()
    K, N = (int(v) for v in args.shape.split(","))
    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    builds = {}
    for name in args.builds:
        path = next((os.path.join(args.dir, name + ext) for ext in (".cubin", ".ptx")
                     if os.path.isfile(os.path.join(args.dir, name + ext))), None)
        if path is None:
            parser.error(f"no {name}.cubin or {name}.ptx in {args.dir}")
        builds[name] = kc.Kernels(path)
    lora_builds = {n: builds[n] for n in (args.lora_builds.split(",") if args.lora_builds else builds)}
    rows = [int(m) for m in args.rows.split(",") if m]
    lora_rows = [int(m) for m in args.lora_rows.split(",") if m]
    print(f"# {torch.cuda.get_device_name()}, seed {seed}, torch {torch.__version__}, K = {K}, N = {N}", flush=True)
    worst, report = {}, []
    for dtype in kc.DTYPES:
        for lines in (gemm_table(builds, dtype, rows, args.rounds, worst, K, N) if rows else [],
                      lora_table(lora_builds, dtype, lora_rows, args.rounds, worst, K, N) if lora_rows else []):
            if lines:
                print("\n" + "\n".join(lines), flush=True)
                report.append(lines)
    bad = [k for k, e in worst.items() if not e <= BOUNDS[k.split()[-1]]]
    print("\nworst rel. err.: " + " ".join(f"{k}={e:.1e}" for k, e in worst.items()))
    if bad:
        print("FAIL (error above its bound): " + ", ".join(bad))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "seed": seed, "tables": report, "worst": worst}, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
