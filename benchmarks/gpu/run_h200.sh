#!/usr/bin/env bash
# StageML's proof on an H200, run on the GPU machine from the repository root:
#
#   (here)   .venv/bin/python benchmarks/gpu/prepare.py out/gpu   # compiles the artifacts
#   (there)  benchmarks/gpu/run_h200.sh out/gpu REPORT_DIR [COMMIT]
#
# There it needs python3 with PyTorch (CUDA), CuPy, pytest, transformers and
# PEFT, and in .whl/ the IREE runtime wheel and pydantic's (pydantic, pydantic-core,
# annotated-types, typing-inspection: the manifest schema; README "GPU targets"). First the
# kernels alone: their checks (pytest -m gpu tests/test_kernels_gpu.py,
# against float64 PyTorch) and timings (kernel_check.py: CUDA events, against
# cuBLAS), what streaming a weight from HBM costs under the same timer (stream_floor.py), then
# the residuals (h200.py), the MoE residuals (moe.py), then the multi-tenant stack against
# vLLM's LoRA kernels (peer.py), then the call path's host overhead
# (call_path.py). Writes REPORT_DIR/h200.md (every table, the machine and
# COMMIT) and the full logs beside it; exits 1 if any check failed.
#
# STAGEML_H200_PARTS names the parts to run (default: "kernels floor residuals moe peer call-path"), so
# that the proof fits calls of limited length: the report is assembled from every part's output
# in REPORT_DIR, those of earlier calls included.
set -euo pipefail
ART=${1:-out/gpu}
REPORT=${2:-$ART}
COMMIT=${3:-unknown}
mkdir -p "$REPORT" /tmp/pkg
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
ln -sfn "$PWD" /tmp/pkg/stageml
export PYTHONPATH=/tmp/pkg:/tmp/site PYTHONUNBUFFERED=1
status=0
PARTS=" ${STAGEML_H200_PARTS:-kernels floor residuals moe peer call-path} "
wanted() { [[ $PARTS == *" $1 "* ]]; }
count() { local n; n=$(grep -c -- "$1" "$2" 2>/dev/null) || true; echo "${n:-0}"; }
if wanted kernels; then
  STAGEML_SM90_PTX="$ART/stageml_sm90.ptx" python3 -m pytest -m gpu -v -rs -p no:cacheprovider \
    tests/test_kernels_gpu.py > "$REPORT/kernel-checks.log" 2>&1 || status=1
  python3 benchmarks/gpu/kernel_check.py "$ART/stageml_sm90.ptx" --report "$REPORT/kernels.md" \
    > "$REPORT/kernels.log" 2>&1 || status=1
fi
if wanted floor; then
  python3 benchmarks/gpu/stream_floor.py "$ART/stream_floor.cubin" --report "$REPORT/floor.md" \
    > "$REPORT/floor.log" 2>&1 || status=1
fi
if wanted residuals; then
  python3 benchmarks/gpu/h200.py "$ART" "$REPORT/residuals.md" > "$REPORT/residuals.log" 2>&1 || status=1
fi
if wanted moe; then
  python3 benchmarks/gpu/moe.py "$ART" "$REPORT/moe.md" > "$REPORT/moe.log" 2>&1 || status=1
fi
if wanted peer; then
  python3 benchmarks/gpu/peer.py "$ART" "$REPORT/peer.md" > "$REPORT/peer.log" 2>&1 || status=1
fi
if wanted call-path; then
  python3 benchmarks/gpu/call_path.py "$ART" "$REPORT/call-path.md" > "$REPORT/call-path.log" 2>&1 || status=1
fi
{
  echo "# StageML on an $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
  echo
  echo "- GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"
  echo "- $(python3 -c 'import torch, cupy; print(f"torch {torch.__version__}, cupy {cupy.__version__}")'), IREE runtime 3.13.0"
  echo "- commit $COMMIT; artifacts compiled by benchmarks/gpu/prepare.py"
  echo "- checks (each on fresh random inputs against float64):" \
       "$(( $(count ' PASSED' "$REPORT/kernel-checks.log") + $(count '^PASS' "$REPORT/floor.log") + $(count '^PASS' "$REPORT/residuals.log") + $(count '^PASS' "$REPORT/moe.log") + $(count '^PASS' "$REPORT/peer.log") + $(count '^PASS' "$REPORT/call-path.log") )) passed," \
       "$(( $(count ' FAILED' "$REPORT/kernel-checks.log") + $(count '^FAIL' "$REPORT/floor.log") + $(count '^FAIL' "$REPORT/residuals.log") + $(count '^FAIL' "$REPORT/moe.log") + $(count '^FAIL' "$REPORT/peer.log") + $(count '^FAIL' "$REPORT/call-path.log") )) failed"
  echo
  echo "## Kernels alone, K = N = 4096 (kernel_check.py)"
  echo
  echo "Device time by CUDA events around each call while a sleep kernel holds the stream (no launch"
  echo "gaps), median of 100 calls after 10 warm-up; 4 copies of every weight rotated (128 MiB, beyond"
  echo "the L2). torch = torch.matmul (cuBLAS) for gemm, eager x@w + s*(x@a)@b for lora. HBM floor:"
  echo "bytes read and written once / the GPU's HBM peak (named below)."
  echo
  cat "$REPORT/kernels.md" 2>/dev/null || echo "(kernel_check.py failed: see kernels.log)"
  echo
  cat "$REPORT/floor.md" 2>/dev/null || echo "(stream_floor.py failed: see floor.log)"
  echo
  cat "$REPORT/residuals.md" 2>/dev/null || echo "(h200.py failed: see residuals.log)"
  echo
  cat "$REPORT/moe.md" 2>/dev/null || echo "(moe.py failed: see moe.log)"
  echo
  cat "$REPORT/peer.md" 2>/dev/null || echo "(peer.py failed: see peer.log)"
  echo
  cat "$REPORT/call-path.md" 2>/dev/null || echo "(call_path.py failed: see call-path.log)"
} > "$REPORT/h200.md"
grep -h ' FAILED' "$REPORT/kernel-checks.log" || true
grep -h '^FAIL' "$REPORT/floor.log" "$REPORT/residuals.log" "$REPORT/moe.log" "$REPORT/peer.log" "$REPORT/call-path.log" || true
cat "$REPORT/h200.md"
exit $status
