"""Builds kernels.cu into the PTX that hopper.mlir's `@stageml_sm90` names.

    python -m stageml.compiler.sm90.build [OUT_DIR]     # CMake's `stageml_sm90_kernels` runs this

By default the PTX goes to the user's cache, never next to the sources (an
installed package keeps those in site-packages): `cache_dir()` is
$STAGEML_CACHE_DIR, else $XDG_CACHE_HOME/stageml, else ~/.cache/stageml, then
sm90/<the first 16 hex digits of the sha256 of kernels.cu and the flags>.
An explicit OUT_DIR is rebuilt when kernels.cu or the flags change (a hash
of both sits next to the PTX). The PTX is written to a temporary file in its
directory and renamed into place, so no reader sees half of one. `nvcc` is
found as $STAGEML_NVCC, else on PATH. The flags name compute_90a, Hopper's
PTX with its architecture-specific instructions; the driver assembles it for
the GPU when the module loads.
"""

import hashlib
import os
import pathlib
import secrets
import shutil
import subprocess
import sys

from stageml.errors import CompileError

SOURCE = pathlib.Path(__file__).with_name("kernels.cu")
PTX = "stageml_sm90.ptx"
FLAGS = ("-ptx", "-gencode=arch=compute_90a,code=compute_90a", "-O3", "-std=c++17")
DEFAULT_DIR: pathlib.Path | None = None  # when set (tests do), build() uses it instead of cache_dir()


def nvcc() -> str | None:
    return os.environ.get("STAGEML_NVCC") or shutil.which("nvcc")


def digest() -> str:
    """sha256 (hex) of kernels.cu and the nvcc flags: what the PTX is built from."""
    return hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode()).hexdigest()


def cache_root() -> pathlib.Path:
    """StageML's cache: $STAGEML_CACHE_DIR, else $XDG_CACHE_HOME/stageml, else ~/.cache/stageml."""
    if explicit := os.environ.get("STAGEML_CACHE_DIR"):
        return pathlib.Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    # (the XDG spec says to ignore a relative $XDG_CACHE_HOME)
    base = pathlib.Path(xdg) if xdg and os.path.isabs(xdg) else pathlib.Path.home() / ".cache"
    return base / "stageml"


def cache_dir() -> pathlib.Path:
    """The directory where the default build() puts stageml_sm90.ptx: keyed by digest()."""
    return cache_root() / "sm90" / digest()[:16]


def _partial(path: pathlib.Path) -> pathlib.Path:
    """A name of its own, next to `path` (os.replace is atomic within one file
    system), so that concurrent builds never write the same file."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def _write_atomically(path: pathlib.Path, text: str) -> None:
    partial = _partial(path)
    try:
        partial.write_text(text)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def build(out_dir: pathlib.Path | str | None = None) -> pathlib.Path:
    """The directory (default: cache_dir()) holding an up-to-date stageml_sm90.ptx, built if needed."""
    default = not (out_dir or DEFAULT_DIR)
    out_dir = pathlib.Path(out_dir or DEFAULT_DIR or cache_dir())
    ptx, stamp = out_dir / PTX, out_dir / (PTX + ".sha256")
    expected = digest()
    if ptx.is_file() and stamp.is_file() and stamp.read_text() == expected:
        return out_dir
    compiler = nvcc()
    if compiler is None or not os.path.isfile(compiler):
        raise CompileError("the sm90 target's custom kernels need nvcc (CUDA 12.4 or newer) to build "
                           f"{SOURCE.name}: install the CUDA toolkit or set STAGEML_NVCC, "
                           "or compile with --no-custom-kernels")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        hint = ": set STAGEML_CACHE_DIR to a writable directory" if default else ""
        raise CompileError(f"cannot create {out_dir} for the sm90 kernels' PTX ({e.strerror}){hint}") from None
    partial = _partial(ptx)
    try:
        done = subprocess.run([compiler, *FLAGS, "-o", str(partial), str(SOURCE)], capture_output=True, text=True)
        if done.returncode != 0:
            first = next((l for l in done.stderr.splitlines() if "error" in l), done.stderr.strip()[:200])
            raise CompileError(f"nvcc failed to build {SOURCE.name} ({first}): check the CUDA toolkit "
                               "(12.4 or newer), or compile with --no-custom-kernels")
        os.replace(partial, ptx)
    finally:
        partial.unlink(missing_ok=True)
    _write_atomically(stamp, expected)
    return out_dir


if __name__ == "__main__":
    try:
        print(build(sys.argv[1] if len(sys.argv) > 1 else None) / PTX)
    except CompileError as e:
        sys.exit(f"error: {e}")
