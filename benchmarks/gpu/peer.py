"""StageML's multi-tenant request path against vLLM's, on an H200.

    python3 benchmarks/gpu/peer.py ARTIFACTS_DIR [REPORT.md]    # run_h200.sh runs it

The workload: an 8-layer stack of 4096x4096 LoRA layers (r=16) with 32
tenants resident, fp16 and bf16 (workloads.TenantStack, compiled by
prepare.py with max_adapters=32). Each layer is y = x@W + (x@A_t^T)@B_t^T
for each row's tenant t. The shapes: decode, 1/8/32/128 rows over
min(rows, 32) tenants (row i uses tenant i mod n); prefill, 4 tenants x 64
tokens, 8 x 32 and 1 x 256 (contiguous segments).

- StageML: the residual's @forward_factorized (the sm90 pipeline): for the
  decode shapes the residual exported for at most 128 rows (each LoRA site one
  kernel, stageml_gemm_lora: 9 dispatches a call), for prefill the one for
  any rows (each site a BGMV shrink and the GEMM with its expand: 17). Checked
  through `run_batch` against float64, timed by iree-benchmark-module
  (median of 5 repetitions; a call's time includes its submission and wait)
  and on the GPU: its kernels' span, first start to last end, from CUPTI's
  records of 20 `run_batch` calls (what CUDA events around vLLM's graph count).
- vLLM 0.33: cuBLAS for x@W (torch.mm) plus vLLM's Triton `lora_shrink`
  and `lora_expand` (taken from its wheel by prepare.py, with the metadata
  vLLM's punica wrapper prepares), the 8 layers captured in one CUDA graph
  and replayed, timed by CUDA events (median of 200) — how vLLM runs decode.
- cuBLAS base only: the same graph without the LoRA kernels.
- HBM floor: the base weights, the active tenants' factors and the
  activations read or written once, at the GPU's HBM peak (kernel_check.hbm_bytes_per_s).
(What the same calls cost the host above their device time: call_path.py.)
Every figure is per layer (per call / 8); the stack's 256 MiB of base
weights outgrow the L2, so every call reads them from HBM.
"""

import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from h200 import (BOUNDS, DTYPES, STACK, bench_iree, bench_torch, check, finish,  # noqa: E402
                  input_flags, kernel_times, rel_err, to_numpy, write_archive)

import stageml  # noqa: E402
from kernel_check import hbm_bytes_per_s  # noqa: E402
from workloads import TenantStack  # noqa: E402

TENANTS = 32
SHAPES = [("decode", 1, 1), ("decode", 8, 8), ("decode", 32, 32), ("decode", 128, 32),
          ("prefill", 4 * 64, 4), ("prefill", 8 * 32, 8), ("prefill", 256, 1)]
RESIDUALS = {"decode": "-decode", "prefill": ""}  # each shape's residual: stack-tenants-{dtype}-sm90{suffix}


def mapping(kind: str, rows: int, tenants: int) -> list:
    """Each row's tenant (0..tenants-1)."""
    if kind == "decode":
        return [i % tenants for i in range(rows)]
    return [i * tenants // rows for i in range(rows)]


class Weights:
    """The stack's base weights and 32 tenants' factors (B pre-scaled), on the GPU."""

    def __init__(self, dtype, seed: int):
        d, r, layers = STACK["d"], STACK["r"], STACK["layers"]
        torch.manual_seed(seed)
        with torch.device("cuda"):
            self.model = TenantStack(**STACK).to(dtype).eval()
            self.a = [(torch.randn(TENANTS, r, d) * d ** -0.5).to(dtype) for _ in range(layers)]
            self.b = [(torch.randn(TENANTS, d, r) * r ** -0.5 * self.model.scale).to(dtype) for _ in range(layers)]
        self.w = [w.detach() for w in self.model.weight]

    def reference(self, x, tenants: list):
        t = torch.tensor(tenants, device="cuda")
        x = x.double()
        for w, a, b in zip(self.w, self.a, self.b):
            a_rows, b_rows = a.double()[t], b.double()[t]  # [rows, r, d], [rows, d, r]
            x = x @ w.double() + torch.einsum("nr,ndr->nd", torch.einsum("nd,nrd->nr", x, a_rows), b_rows)
        return x

    def adapter(self, tenant: int) -> dict:
        return {**{f"lora_A.{l}": a[tenant] for l, a in enumerate(self.a)},
                **{f"lora_B.{l}": b[tenant] for l, b in enumerate(self.b)}}


def vllm_ops(art_dir: str):
    sys.path.insert(0, os.path.join(art_dir, "vllm_peer"))
    from vllm.lora.ops.triton_ops.lora_expand_op import lora_expand
    from vllm.lora.ops.triton_ops.lora_kernel_metadata import LoRAKernelMeta
    from vllm.lora.ops.triton_ops.lora_shrink_op import lora_shrink
    return lora_shrink, lora_expand, LoRAKernelMeta


def vllm_graph(ops, weights: Weights, x: torch.Tensor, tenants: list, lora: bool):
    """(replay, output): the 8 layers as vLLM runs them, captured in one CUDA graph."""
    lora_shrink, lora_expand, meta_class = ops
    rows, r = x.shape[0], STACK["r"]
    meta = meta_class.make(max_loras=TENANTS, max_num_tokens=rows, device="cuda")
    meta.prepare_tensors(torch.tensor(tenants, dtype=torch.int32, device="cuda"))
    args = meta.meta_args(rows, specialize_active_lora=False)
    buffer = torch.zeros(1, rows, r, dtype=torch.float32, device="cuda")
    state = {"x": x.clone()}

    def layers():
        h = state["x"]
        for w, a, b in zip(weights.w, weights.a, weights.b):
            y = torch.mm(h, w)
            if lora:
                buffer.zero_()
                lora_shrink(h, [a], buffer, *args, 1.0)
                lora_expand(buffer, [b], y, *args, offset_start=0, add_inputs=True)
            h = y
        return h

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # Triton compiles and vLLM caches its pointer tables outside the capture
            layers()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layers()
    return graph.replay, out


def floor_us(rows: int, tenants: int, itemsize: int) -> float:
    d, r = STACK["d"], STACK["r"]
    return (d * d + tenants * 2 * d * r + 2 * rows * d) * itemsize / hbm_bytes_per_s() * 1e6


def stack_module(art_dir: str, name: str, weights: Weights) -> tuple:
    """(the .vmfb, the loaded residual, each tenant's slot) of stack-tenants-NAME, its archive
    written from `weights` and every tenant loaded (policy "factorized")."""
    vmfb = os.path.join(art_dir, f"stack-tenants-{name}.vmfb")
    write_archive(weights.model, {f"weight.{l}": f"weight.{l}" for l in range(STACK["layers"])}, vmfb[:-5] + ".irpa")
    mod = stageml.load(vmfb, policy="factorized")
    for t in range(TENANTS):
        mod.load_adapter(f"t{t}", {k: to_numpy(v) for k, v in weights.adapter(t).items()})
    return vmfb, mod, {f"t{t}": mod.stats()["adapters"][f"t{t}"]["slot"] for t in range(TENANTS)}


def run(art_dir: str, scratch: str) -> list:
    ops = vllm_ops(art_dir)
    rows_out = []
    for tag, dtype in DTYPES.items():
        weights = Weights(dtype, seed=int.from_bytes(os.urandom(4), "little"))
        residuals = {kind: stack_module(art_dir, f"{tag}-sm90{suffix}", weights) for kind, suffix in RESIDUALS.items()}
        for kind, rows, tenants in SHAPES:
            vmfb, mod, slots = residuals[kind]
            assigned = mapping(kind, rows, tenants)
            x = torch.randn(rows, STACK["d"], device="cuda", dtype=dtype)
            expected = weights.reference(x, assigned)
            shape = f"{kind} {rows} rows / {tenants} tenants"
            names = [f"t{t}" for t in assigned]
            got = mod.run_batch(to_numpy(x), names)
            check(f"peer {tag} StageML factorized, {shape}", rel_err(got, expected), BOUNDS[tag])
            got = mod.run_batch(x, names)  # torch CUDA tensors in and out
            check(f"peer {tag} StageML factorized, torch CUDA tensors, {shape}", rel_err(got, expected), BOUNDS[tag])
            replay, out = vllm_graph(ops, weights, x, assigned, lora=True)
            replay()
            torch.cuda.synchronize()
            check(f"peer {tag} vLLM, {shape}", rel_err(out, expected), BOUNDS[tag])
            base_replay, _ = vllm_graph(ops, weights, x, assigned, lora=False)
            ids = np.array([slots[f"t{t}"] for t in assigned], np.int64)
            times = kernel_times(lambda: mod.run_batch(x, names))
            row = {"dtype": tag, "shape": shape, "launches": times["kernels"],
                   "stageml": bench_iree(vmfb, input_flags([to_numpy(x), ids], scratch, "peer"),
                                         function="forward_factorized") / STACK["layers"],
                   "stageml gpu": times["span"] / STACK["layers"],
                   "vllm": bench_torch(replay) / STACK["layers"],
                   "base": bench_torch(base_replay) / STACK["layers"],
                   "floor": floor_us(rows, tenants, torch.finfo(dtype).bits // 8)}
            rows_out.append(row)
            print(row, flush=True)
        del residuals, mod, weights
        torch.cuda.empty_cache()
    return rows_out


def report(rows: list) -> str:
    lines = ["## Multi-tenant LoRA stack against vLLM 0.33, µs per layer (d=4096, r=16, 32 tenants resident)", "",
             "StageML call: @forward_factorized by iree-benchmark-module (median of 5 repetitions, submission "
             "and wait included), / 8. StageML GPU: the call's kernels on the GPU, first start to last end (CUPTI, "
             "median of 20 `run_batch` calls), / 8: what vLLM's figure counts. vLLM: cuBLAS x@W + vLLM's Triton "
             "lora_shrink + lora_expand, 8 layers in one CUDA graph, CUDA events around each replay (median of "
             "200), / 8. cuBLAS base: the same graph without LoRA. Kernels: StageML's launches a call (decode: the "
             "residual for at most 128 rows, one kernel a LoRA site; prefill: the one for any rows). Every figure "
             "checked against float64 first (see the checks above).", "",
             "| dtype | shape | kernels | StageML call | StageML GPU | vLLM | cuBLAS base | HBM floor | GPU / vLLM | "
             "call / vLLM | vLLM / base | GPU / floor |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['dtype']} | {r['shape']} | {r['launches']} | {r['stageml']:.1f} | {r['stageml gpu']:.1f} | {r['vllm']:.1f} | "
                     f"{r['base']:.1f} | {r['floor']:.1f} | {r['stageml gpu'] / r['vllm']:.2f}x | "
                     f"{r['stageml'] / r['vllm']:.2f}x | {r['vllm'] / r['base']:.2f}x | "
                     f"{r['stageml gpu'] / r['floor']:.2f}x |")
    return "\n".join(lines)


def main() -> int:
    import tempfile
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        return finish(report(run(sys.argv[1], scratch)))


if __name__ == "__main__":
    sys.exit(main())
