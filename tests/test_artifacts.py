"""Artifacts you can trust: atomic saves (a process killed mid-save), hashes
that catch corrupt or mixed files, a manifest that cannot point outside its
directory or disagree with its module, and request bounds."""

import copy
import json
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from torch.export import Dim

import stageml
from models import MLP, rel_err
from stageml.errors import ArtifactError, InputError, OutputError

FILES = (".vmfb", ".irpa", ".json")


def _compile(seed: int):
    torch.manual_seed(seed)
    model = MLP().eval()
    art = stageml.compile(model, (torch.randn(2, 32),), dynamic_shapes=({0: Dim("batch", max=16)},))
    return model, art


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """Two compiles of the same shapes with different weights, saved; the first also pickled."""
    root = tmp_path_factory.mktemp("artifacts")
    models, paths = [], []
    for seed, name in ((0, "a"), (1, "b")):
        model, art = _compile(seed)
        models.append(model)
        paths.append(art.save(str(root / name / "residual.vmfb")))
        with open(root / f"{name}.pickle", "wb") as f:
            pickle.dump(art, f)
    return {"root": root, "models": models, "paths": paths}


def _contents(stem) -> dict:
    return {ext: open(f"{stem}{ext}", "rb").read() for ext in FILES}


def _copy(path, directory) -> str:
    os.makedirs(directory, exist_ok=True)
    for ext in FILES:
        with open(path[:-5] + ext, "rb") as src, open(os.path.join(directory, "residual" + ext), "wb") as dst:
            dst.write(src.read())
    return os.path.join(directory, "residual.vmfb")


def _answers(path, model) -> bool:
    x = torch.randn(3, 32)
    return rel_err(stageml.load(path)(x), model(x)) <= 1e-5


# -- atomic saves ----------------------------------------------------------------

# A process that saves artifact b over a copy of artifact a and is killed
# (SIGKILL: no cleanup runs) at the chosen point: the fault-injection hook
# wraps one of the functions the save calls.
_KILLED_SAVE = textwrap.dedent("""
    import os, pickle, signal, sys
    import stageml.files
    from stageml.compiler import artifact
    art = pickle.load(open(sys.argv[1], "rb"))
    point, count = sys.argv[3], [0]

    def kill():
        os.kill(os.getpid(), signal.SIGKILL)

    if point == "writing-parameters":
        write = artifact.Artifact._write_parameters
        def half(self, path):
            write(self, path)
            with open(path, "r+b") as f:
                f.truncate(os.path.getsize(path) // 2)
            kill()
        artifact.Artifact._write_parameters = half
    else:
        replace = os.replace
        def killing_replace(src, dst):
            if point != "none" and count[0] == int(point):
                kill()
            count[0] += 1
            replace(src, dst)
        stageml.files.os.replace = killing_replace
    art.save(sys.argv[2])
""")


@pytest.mark.parametrize("point", ["writing-parameters", "0", "1", "2"])
def test_save_killed_midway(two, tmp_path, point):
    """Killed before the first rename: the earlier artifact is byte-identical and
    serves its own answers. Killed between renames (new .irpa, old .vmfb and
    manifest): loading is refused, naming the file; never the other model's numbers."""
    path = _copy(two["paths"][0], tmp_path / "out")
    before = _contents(path[:-5])
    run = subprocess.run([sys.executable, "-c", _KILLED_SAVE, str(two["root"] / "b.pickle"), path, point],
                         capture_output=True, text=True)
    assert run.returncode == -9, run.stderr
    if point in ("writing-parameters", "0"):
        assert _contents(path[:-5]) == before
        assert _answers(path, two["models"][0])
    else:
        with pytest.raises(ArtifactError, match="does not match its manifest"):
            stageml.load(path)
    rerun = subprocess.run([sys.executable, "-c", _KILLED_SAVE, str(two["root"] / "b.pickle"), path, "none"],
                           capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    assert _answers(path, two["models"][1])  # a later save replaces the whole artifact


def test_failed_save_changes_nothing(two, tmp_path, monkeypatch):
    path = _copy(two["paths"][0], tmp_path)
    before = _contents(path[:-5])
    art = pickle.load(open(two["root"] / "b.pickle", "rb"))

    def disk_full(self, temp):
        with open(temp, "wb") as f:
            f.write(b"partial")
        raise OSError(28, "No space left on device", temp)

    monkeypatch.setattr(type(art), "_write_parameters", disk_full)
    with pytest.raises(OutputError, match="No space left on device"):
        art.save(path)
    assert _contents(path[:-5]) == before
    assert sorted(os.listdir(tmp_path)) == ["residual.irpa", "residual.json", "residual.vmfb"]  # no temporaries


def test_save_never_overwrites_the_model_file(tmp_path):
    torch.manual_seed(0)
    model = MLP().eval()
    source = tmp_path / "model.irpa"  # a model file whose name the artifact's parameters would take
    torch.export.save(torch.export.export(model, (torch.randn(2, 32),)), str(source))
    before = source.read_bytes()
    art = stageml.compile(str(source))
    with pytest.raises(OutputError, match="would overwrite the model file"):
        art.save(str(tmp_path / "model.vmfb"))
    assert source.read_bytes() == before


def test_save_of_an_unfinished_compile_is_refused():
    art = stageml.compile(MLP().eval(), (torch.randn(2, 32),), emit="split")
    with pytest.raises(ArtifactError, match="compile with emit='vmfb'"):
        art.save("never.vmfb")


# -- verifiable artifacts ----------------------------------------------------------

@pytest.mark.parametrize("ext", [".irpa", ".vmfb"])
def test_bit_flips_are_refused(two, tmp_path, ext):
    path = _copy(two["paths"][0], tmp_path)
    size = os.path.getsize(path[:-5] + ext)
    rng = np.random.default_rng(0)
    print("flipped offsets", offsets := sorted(int(o) for o in rng.integers(0, size, 8)))
    for offset in offsets:
        with open(path[:-5] + ext, "r+b") as f:
            f.seek(offset)
            byte = f.read(1)[0]
            f.seek(offset)
            f.write(bytes([byte ^ 0x10]))
        with pytest.raises(ArtifactError, match=f"{ext[1:]}' does not match its manifest"):
            stageml.load(path)
        with open(path[:-5] + ext, "r+b") as f:
            f.seek(offset)
            f.write(bytes([byte]))
    assert _answers(path, two["models"][0])


@pytest.mark.parametrize("swapped", [(".irpa",), (".vmfb", ".irpa"), (".json",), (".json", ".vmfb")])
def test_files_of_another_compile_are_refused(two, tmp_path, swapped):
    """Another compile's files of the same shapes: whichever are mixed in, the
    hashes in the manifest (which names the module and archive) catch it.
    (The two modules alone are byte-identical: the weights are the .irpa's.)"""
    assert open(two["paths"][0], "rb").read() == open(two["paths"][1], "rb").read()
    path = _copy(two["paths"][0], tmp_path)
    for ext in swapped:
        with open(two["paths"][1][:-5] + ext, "rb") as src, open(path[:-5] + ext, "wb") as dst:
            dst.write(src.read())
    with pytest.raises(ArtifactError, match="does not match its manifest"):
        stageml.load(path)


def _edit_manifest(path, edit) -> None:
    with open(path[:-5] + ".json") as f:
        manifest = json.load(f)
    edit(manifest)
    with open(path[:-5] + ".json", "w") as f:
        json.dump(manifest, f)


@pytest.mark.parametrize("name", ["../a/residual.vmfb", "/etc/passwd", "..", "sub/residual.vmfb", "a\\b", ""])
def test_manifest_files_are_plain_names(two, tmp_path, name):
    path = _copy(two["paths"][0], tmp_path / "x")
    _edit_manifest(path, lambda m: m["files"]["module"].update(name=name))
    with pytest.raises(ArtifactError, match=r"files\.module\.name"):
        stageml.load(path)


def test_manifest_must_agree_with_its_module(two, tmp_path):
    path = _copy(two["paths"][0], tmp_path)

    def widen(manifest):
        forward = next(e for e in manifest["entry_points"] if e["stage"] == "dynamic")
        forward["arguments"][-1]["dims"][0]["max"] = 1 << 20

    _edit_manifest(path, widen)
    with pytest.raises(ArtifactError, match="disagrees with its module about the entry points"):
        stageml.load(path)


# The fuzz: random edits of a good manifest. Loading either works (an edit
# of something the runtime does not read, such as the report) or raises an
# ArtifactError; never another exception, never a crash.
_JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=12),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                     max_leaves=8)


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, prefix + (i,))


@pytest.fixture(scope="module")
def fuzzed(two, tmp_path_factory):
    path = _copy(two["paths"][0], tmp_path_factory.mktemp("fuzz"))
    with open(path[:-5] + ".json") as f:
        return path, json.load(f)


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_manifests_load_or_raise_artifact_error(fuzzed, data):
    path, good = fuzzed
    manifest = copy.deepcopy(good)
    for _ in range(data.draw(st.integers(1, 3))):
        where = data.draw(st.sampled_from(list(_paths(manifest))[1:]))
        parent = manifest
        for key in where[:-1]:
            parent = parent[key]
        action = data.draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "delete" and isinstance(parent, dict):
            del parent[where[-1]]
        elif action == "add" and isinstance(parent, dict):
            parent[data.draw(st.text(max_size=8))] = data.draw(_JSON)
        else:
            parent[where[-1]] = data.draw(_JSON)
    with open(path[:-5] + ".json", "w") as f:
        json.dump(manifest, f)
    try:
        stageml.load(path)
    except ArtifactError:
        pass


# -- bounds on the request path ------------------------------------------------------

def test_dimension_ranges_are_checked(two):
    mod = stageml.load(two["paths"][0])
    x = mod.inputs[0]
    assert x["dims"] == [{"min": 0, "max": 16}, {"min": 32, "max": 32}]
    with pytest.raises(InputError, match=r"input 'x' has 17 along dimension 0, outside the exported range 0\.\.16"):
        mod(np.zeros((17, 32), np.float32))
    assert mod(np.zeros((16, 32), np.float32)).shape == (16, 16)
    # a shape once accepted is remembered; another dtype of it, or another shape, is still refused
    with pytest.raises(InputError, match=r"input 'x' has shape \[16, 32\] float64; expected \[\?, 32\] float32"):
        mod(np.zeros((16, 32), np.float64))
    assert mod(torch.zeros(16, 32)).shape == (16, 16)
    with pytest.raises(InputError, match=r"input 'x' has shape \[16, 32\] float64"):
        mod(torch.zeros(16, 32, dtype=torch.float64))
    with pytest.raises(InputError, match="outside the exported range 0..16"):
        mod(torch.zeros(17, 32))
