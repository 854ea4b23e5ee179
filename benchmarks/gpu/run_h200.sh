#!/usr/bin/env bash
# StageML's proof on an H200, run on the GPU machine from the repository root:
#
#   (here)   .venv/bin/python benchmarks/gpu/prepare.py out/gpu   # compiles the artifacts
#   (there)  benchmarks/gpu/run_h200.sh out/gpu [REPORT_DIR]
#
# There it needs python3 with PyTorch (CUDA), transformers and PEFT, and the
# IREE runtime wheel in .whl/ (`pip download ... iree-base-runtime==3.13.0`,
# README "GPU targets"). First the kernels alone (kernel_check.py: CUDA
# events, against cuBLAS), then the residuals (h200.py). Writes kernels.md
# and residuals.md into REPORT_DIR (default: the artifacts' folder).
set -euo pipefail
ART=${1:-out/gpu}
REPORT=${2:-$ART}
mkdir -p "$REPORT" /tmp/pkg
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/iree_base_runtime-*.whl
ln -sfn "$PWD" /tmp/pkg/stageml
export PYTHONPATH=/tmp/pkg:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader
status=0
python3 benchmarks/gpu/kernel_check.py "$ART/stageml_sm90.ptx" | tee "$REPORT/kernels.log" || status=1
python3 benchmarks/gpu/h200.py "$ART" "$REPORT/residuals.md" | tee "$REPORT/residuals.log" || status=1
exit $status
