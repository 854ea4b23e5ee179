"""Builds kernels.cu into the PTX that hopper.mlir's `@stageml_sm90` names.

    python -m stageml.compiler.sm90.build [OUT_DIR]     # CMake's `stageml_sm90_kernels` runs this

The PTX is rebuilt when kernels.cu or the flags change (a hash of both sits
next to it). `nvcc` is found as $STAGEML_NVCC, else on PATH. The flags name
compute_90a, Hopper's PTX with its architecture-specific instructions; the
driver assembles it for the GPU when the module loads.
"""

import hashlib
import os
import pathlib
import shutil
import subprocess
import sys

from stageml.errors import CompileError

SOURCE = pathlib.Path(__file__).with_name("kernels.cu")
PTX = "stageml_sm90.ptx"
FLAGS = ("-ptx", "-gencode=arch=compute_90a,code=compute_90a", "-O3", "-std=c++17")
DEFAULT_DIR = pathlib.Path(__file__).resolve().parents[2] / "build" / "sm90"


def nvcc() -> str | None:
    return os.environ.get("STAGEML_NVCC") or shutil.which("nvcc")


def build(out_dir: pathlib.Path | None = None) -> pathlib.Path:
    """The directory (default: build/sm90) holding an up-to-date stageml_sm90.ptx, built if needed."""
    out_dir = pathlib.Path(out_dir or DEFAULT_DIR)
    ptx, stamp = out_dir / PTX, out_dir / (PTX + ".sha256")
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode()).hexdigest()
    if ptx.is_file() and stamp.is_file() and stamp.read_text() == digest:
        return out_dir
    compiler = nvcc()
    if compiler is None or not os.path.isfile(compiler):
        raise CompileError("the sm90 target's custom kernels need nvcc (CUDA 12.4 or newer) to build "
                           f"{SOURCE.name}: install the CUDA toolkit or set STAGEML_NVCC, "
                           "or compile with --no-custom-kernels")
    out_dir.mkdir(parents=True, exist_ok=True)
    partial = ptx.with_suffix(".ptx.partial")
    done = subprocess.run([compiler, *FLAGS, "-o", str(partial), str(SOURCE)], capture_output=True, text=True)
    if done.returncode != 0:
        first = next((l for l in done.stderr.splitlines() if "error" in l), done.stderr.strip()[:200])
        raise CompileError(f"nvcc failed to build {SOURCE.name} ({first}): check the CUDA toolkit "
                           "(12.4 or newer), or compile with --no-custom-kernels")
    partial.replace(ptx)
    stamp.write_text(digest)
    return out_dir


if __name__ == "__main__":
    try:
        print(build(sys.argv[1] if len(sys.argv) > 1 else None) / PTX)
    except CompileError as e:
        sys.exit(f"error: {e}")
