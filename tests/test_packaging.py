"""`pip install .`: the wheel holds every subpackage and data file of the
checkout and runs from where it is installed; the sm90 kernels' PTX goes to
the user's cache, not into the installed package."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Top-level directories of the checkout that are not part of the package.
NOT_SHIPPED = {"tests", "benchmarks", "examples", "lit_tests", "build", "out"}
DATA = (".mlir", ".cu")


def _shipped_dirs():
    """(wheel path of a directory, its path in the checkout) for each directory the package holds."""
    for here, dirs, _ in os.walk(ROOT):
        rel = Path(here).relative_to(ROOT)
        dirs[:] = sorted(d for d in dirs if "." not in d and d != "__pycache__"
                         and not (rel == Path(".") and d in NOT_SHIPPED))
        yield Path("stageml", rel).as_posix(), Path(here)


def _copy_ignore(directory, names):
    # The copy is what a clean clone holds: no virtualenv, build output or caches.
    top = Path(directory).resolve() == ROOT
    return [n for n in names if n in ("__pycache__", "Output") or n.endswith(".egg-info")
            or (top and (n.startswith(".") or n in ("build", "out")))]


def _run(args, **kwargs):
    done = subprocess.run(args, capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, args))} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel `pip wheel` builds from (a copy of) the checkout, with this environment's setuptools.

    (A copy: building in place would write build/ and stageml.egg-info into
    the checkout and reuse whatever an earlier build left in build/lib.)"""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    shutil.copytree(ROOT, source, ignore=_copy_ignore)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
          "--no-cache-dir", "--disable-pip-version-check", "-q", "-w", str(tmp / "dist"), str(source)])
    (built,) = (tmp / "dist").glob("stageml-*.whl")
    return built


@pytest.fixture(scope="module")
def site(wheel):
    """A directory the wheel is installed into, as `pip install --target` does."""
    target = wheel.parent.parent / "site"
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check",
          "-q", "--target", str(target), str(wheel)])
    return target


def _installed_env(site, **extra) -> dict:
    # The same interpreter, so the environment's dependencies stay importable;
    # PYTHONPATH puts the installed stageml ahead of the checkout's editable one.
    return {**os.environ, "PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1", **extra}


def test_wheel_holds_every_package_and_data_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for expected in ("stageml/__init__.py", "stageml/compiler/sm90/__init__.py",
                     "stageml/compiler/sm90/hopper.mlir", "stageml/compiler/sm90/kernels.cu",
                     "stageml/dialects/bt.irdl.mlir"):
        assert expected in names, f"the wheel lacks {expected}"
    packages = 0
    for wheel_dir, here in _shipped_dirs():
        if not (here / "__init__.py").is_file():
            continue
        packages += 1
        for file in sorted(here.iterdir()):
            if file == ROOT / "setup.py":  # the build's, not the package's
                continue
            if file.is_file() and (file.suffix == ".py" or file.suffix in DATA):
                assert f"{wheel_dir}/{file.name}" in names, f"the wheel lacks {wheel_dir}/{file.name}"
    assert packages >= 7  # stageml, .compiler, .compiler.passes, .compiler.sm90, .dialects, .runtime, .tools
    dist_info = "-".join(wheel.name.split("-")[:2]) + ".dist-info"
    assert {n.split("/")[0] for n in names} == {"stageml", dist_info}
    leaked = sorted(n for n in names if n.split("/")[1:2] and n.split("/")[1] in NOT_SHIPPED | {"setup.py"})
    assert not leaked, f"the wheel ships what is not part of the package: {leaked}"


IMPORT_ALL = r"""
import importlib, json, pkgutil, sys
import stageml

def fail(name):
    raise
modules = ["stageml"] + [m.name for m in pkgutil.walk_packages(stageml.__path__, "stageml.", onerror=fail)]
for name in modules:
    importlib.import_module(name)

build = importlib.import_module("stageml.compiler.sm90.build")
use_custom_kernels = importlib.import_module("stageml.compiler.sm90.use_custom_kernels")
dialects = importlib.import_module("stageml.dialects")
print(json.dumps({
    "modules": modules,
    "files": sorted({m.__file__ for n, m in sys.modules.items()
                     if n.split(".")[0] == "stageml" and getattr(m, "__file__", None)}),
    "data": [str(use_custom_kernels.HOPPER), str(use_custom_kernels.REFERENCES), str(build.SOURCE), str(dialects.BT_IRDL)],
}))
"""


def test_installed_package_imports_and_finds_its_data(site, tmp_path):
    found = json.loads(_run([sys.executable, "-c", IMPORT_ALL], cwd=tmp_path, env=_installed_env(site)))
    assert "stageml.compiler.sm90" in found["modules"] and "stageml.dialects" in found["modules"]
    installed = site.resolve() / "stageml"
    for file in found["files"] + found["data"]:
        assert Path(file).resolve().is_relative_to(installed), f"{file} is not from the installed package"
    for file in found["data"]:
        assert Path(file).is_file(), f"{file} is missing from the installed package"
    installed_dirs = {p.relative_to(site).as_posix() for p in installed.rglob("*")
                      if p.is_dir() and p.name != "__pycache__"} | {"stageml"}
    for wheel_dir, here in _shipped_dirs():
        if (here / "__init__.py").is_file():
            assert wheel_dir in installed_dirs
            assert wheel_dir.replace("/", ".") in found["modules"], f"{wheel_dir} was not imported"


def _sm90_build_module():
    try:
        from stageml.compiler.sm90 import build
    except ImportError as e:  # (not the packaging's doing: the checkout's own import)
        pytest.fail(f"stageml.compiler.sm90 does not import from the checkout: {e}")
    return build


def test_kernel_cache_dir(monkeypatch, tmp_path):
    build = _sm90_build_module()
    monkeypatch.setattr(build, "DEFAULT_DIR", None)
    key = hashlib.sha256(build.SOURCE.read_bytes() + " ".join(build.FLAGS).encode()).hexdigest()[:16]
    monkeypatch.setenv("STAGEML_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert build.cache_dir() == tmp_path / "cache" / "sm90" / key
    monkeypatch.delenv("STAGEML_CACHE_DIR")
    assert build.cache_dir() == tmp_path / "xdg" / "stageml" / "sm90" / key
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert build.cache_dir() == tmp_path / "home" / ".cache" / "stageml" / "sm90" / key
    # A different kernels.cu builds into a directory of its own.
    source = tmp_path / "kernels.cu"
    source.write_bytes(build.SOURCE.read_bytes() + b"\n// changed\n")
    monkeypatch.setattr(build, "SOURCE", source)
    assert build.cache_dir().parent == tmp_path / "home" / ".cache" / "stageml" / "sm90"
    assert build.cache_dir().name != key


def test_installed_package_builds_its_kernels_into_the_cache(site, tmp_path):
    build = _sm90_build_module()
    if build.nvcc() is None:
        pytest.skip("building the sm90 kernels needs nvcc (not on PATH, $STAGEML_NVCC unset)")
    cache = tmp_path / "cache"
    before = sorted(p.relative_to(site) for p in site.rglob("*"))
    out = _run([sys.executable, "-m", "stageml.compiler.sm90.build"], cwd=tmp_path,
               env=_installed_env(site, STAGEML_CACHE_DIR=str(cache))).strip()
    key = hashlib.sha256(build.SOURCE.read_bytes() + " ".join(build.FLAGS).encode()).hexdigest()[:16]
    assert Path(out) == cache / "sm90" / key / build.PTX
    assert Path(out).read_text().lstrip().startswith("//")  # nvcc's PTX header
    assert sorted(p.name for p in Path(out).parent.iterdir()) == [build.PTX, build.PTX + ".sha256"]
    assert sorted(p.relative_to(site) for p in site.rglob("*")) == before, "the build wrote into site-packages"
