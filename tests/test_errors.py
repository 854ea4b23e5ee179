"""Bad input: each a StageMLError with one sentence; the CLI exits 1 with one line (2 for usage, 3 for a bug)."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.export import Dim

import stageml
from models import MLP
from stageml.errors import InputError
from stageml.tools import stagemlc

STAGEMLC = [sys.executable, "-m", "stageml.tools.stagemlc"]


def _cli_error(*args) -> str:
    result = subprocess.run(STAGEMLC + list(args), capture_output=True, text=True)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stagemlc: error: "), result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def mlp_artifact(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlp")
    model = MLP().eval()
    program = torch.export.export(model, (torch.randn(2, 32),), dynamic_shapes=({0: Dim("batch", max=64)},))
    torch.export.save(program, root / "mlp.pt2")
    path = stageml.compile(program).save(str(root / "out" / "residual.vmfb"))
    return root, path


def test_missing_model_file(tmp_path):
    with pytest.raises(stageml.StageMLError, match="does not exist"):
        stageml.compile(str(tmp_path / "missing.pt2"))
    assert "does not exist" in _cli_error(str(tmp_path / "missing.pt2"))


def test_pickled_module_is_refused(tmp_path):
    torch.save(MLP(), tmp_path / "pickled.pt")
    with pytest.raises(stageml.StageMLError, match="pickled model.*torch.export.save"):
        stageml.compile(str(tmp_path / "pickled.pt"))
    assert "pickled model" in _cli_error(str(tmp_path / "pickled.pt"))


def test_stage_glob_matching_nothing(mlp_artifact):
    root, _ = mlp_artifact
    with pytest.raises(stageml.StageMLError, match="'encoder.*' matches no parameter"):
        stageml.compile(str(root / "mlp.pt2"), stages={"encoder.*": "static"})
    assert "matches no parameter" in _cli_error(str(root / "mlp.pt2"), "--stage", "encoder.*=static")


def test_unknown_stage_name(mlp_artifact):
    root, _ = mlp_artifact
    with pytest.raises(stageml.StageMLError, match="unknown binding time 'later'"):
        stageml.compile(str(root / "mlp.pt2"), stages={"fc1.*": "later"})
    assert "unknown binding time" in _cli_error(str(root / "mlp.pt2"), "--stage", "fc1.*=later")


def test_wrong_inputs(mlp_artifact):
    _, path = mlp_artifact
    mod = stageml.load(path)
    with pytest.raises(stageml.StageMLError, match=r"input 'x' has shape \[3, 31\] float32; expected \[\?, 32\] float32"):
        mod(np.zeros((3, 31), np.float32))
    with pytest.raises(stageml.StageMLError, match="float64; expected"):
        mod(np.zeros((3, 32)))
    with pytest.raises(stageml.StageMLError, match=r"takes 1 input\(s\) \(x\), got 2"):
        mod(np.zeros((3, 32), np.float32), np.zeros((3, 32), np.float32))
    # A failed call leaves the module usable.
    assert mod(np.ones((2, 32), np.float32)).shape == (2, 16)


def _copy_artifact(path, tmp_path):
    stem = path[:-5]
    for ext in (".vmfb", ".irpa", ".json"):
        with open(stem + ext, "rb") as src, open(tmp_path / f"residual{ext}", "wb") as dst:
            dst.write(src.read())
    return tmp_path / "residual"


def test_truncated_irpa(mlp_artifact, tmp_path):
    stem = _copy_artifact(mlp_artifact[1], tmp_path)
    irpa = f"{stem}.irpa"
    with open(irpa, "r+b") as f:
        f.truncate(os.path.getsize(irpa) // 2)
    with pytest.raises(stageml.StageMLError,
                       match=r"parameter archive .* does not match its manifest \(its size or SHA-256"):
        stageml.load(f"{stem}.vmfb")


@pytest.mark.parametrize("damage,message", [
    ("missing-json", "manifest .* is missing"), ("bad-json", "manifest .* is unreadable or not JSON"),
    ("missing-vmfb", "module .* is missing"), ("bad-vmfb", "module .* is corrupt")])
def test_damaged_artifacts(mlp_artifact, tmp_path, damage, message):
    stem = _copy_artifact(mlp_artifact[1], tmp_path)
    kind, ext = damage.split("-")
    path = f"{stem}.{ext}"
    if kind == "missing":
        os.remove(path)
    else:
        with open(path, "wb") as f:
            f.write(b"\x00garbage{")
    with pytest.raises(stageml.StageMLError, match=message):
        stageml.load(f"{stem}.vmfb")


def test_manifest_records_versions_and_report(mlp_artifact):
    with open(mlp_artifact[1][:-5] + ".json") as f:
        manifest = json.load(f)
    assert manifest["versions"]["iree-base-compiler"] == "3.13.0"
    assert manifest["report"]["folded_values"] >= 2


def test_unsupported_op_names_stage_and_op():
    class QR(torch.nn.Module):
        def forward(self, x):
            return torch.linalg.qr(x)[0]

    # ... and the model's source line, which the locations carry to the lowering.
    with pytest.raises(stageml.StageMLError, match=r"the model failed to lower to linalg: "
                                                   r"failed to legalize operation 'torch.aten.linalg_qr' at "
                                                   r"loc\(\".*test_errors.py\":\d+"):
        stageml.compile(QR(), (torch.randn(4, 4),))


def test_export_failure_names_the_models_line():
    """A model torch.export cannot trace: the error names the model's own line where the export
    stopped, or the dynamic dim the model fixed, in one line."""
    class Mismatch(torch.nn.Module):
        def forward(self, x):
            return x + torch.ones(x.shape[1] + 1)

    class Halves(torch.nn.Module):
        def forward(self, x):
            return x[:, :4] + x[:, 4:]  # (a width of 8 only)

    line = Mismatch.forward.__code__.co_firstlineno + 1
    with pytest.raises(stageml.StageMLError, match=rf"torch.export failed on the model at .*test_errors.py:{line} ") as e:
        stageml.compile(Mismatch(), (torch.randn(2, 8),), dynamic_shapes=({1: Dim("width", max=64)},))
    assert "\n" not in str(e.value)
    with pytest.raises(stageml.StageMLError, match="You marked width as dynamic but your code specialized it") as e:
        stageml.compile(Halves(), (torch.randn(2, 8),), dynamic_shapes=({1: Dim("width", max=64)},))
    assert "\n" not in str(e.value)


def test_multi_tenant_compile_of_a_model_without_lora(mlp_artifact):
    root, _ = mlp_artifact
    line = _cli_error(str(root / "mlp.pt2"), "-o", str(root / "t.vmfb"), "--max-adapters", "4", "-q")
    assert "the model has no LoRA site" in line and "compile a PEFT LoRA model" in line
    line = _cli_error(str(root / "mlp.pt2"), "-o", str(root / "t.vmfb"), "--max-adapters", "4", "--no-lora-merge")
    assert "drop --no-lora-merge" in line
    line = _cli_error(str(root / "mlp.pt2"), "-o", str(root / "t.vmfb"), "--max-adapters", "0")
    assert "max_adapters (0) and max_rank (16) must be at least 1" in line


def test_serving_options_need_a_multi_tenant_residual(mlp_artifact):
    _, path = mlp_artifact
    with pytest.raises(stageml.StageMLError, match="policy apply to multi-tenant residuals only: compile with max_adapters"):
        stageml.load(path, policy="merged")


def test_residual_for_a_cpu_with_more_features_is_refused(tmp_path):
    # Compiled for a CPU with a feature this one lacks: a clear error at load, not SIGILL.
    path = stageml.compile(MLP().eval(), (torch.randn(2, 32),)).save(str(tmp_path / "other.vmfb"))
    with open(path[:-5] + ".json") as f:
        manifest = json.load(f)
    assert manifest["target"]["name"] == "cpu" and manifest["target"]["cpu"] == "host"
    manifest["target"].update(cpu="future-cpu", features=manifest["target"]["features"] + ["avx10.9"])
    with open(path[:-5] + ".json", "w") as f:
        json.dump(manifest, f)
    with pytest.raises(stageml.StageMLError, match="compiled for CPU 'future-cpu', whose features avx10.9 this CPU lacks"):
        stageml.load(path)


def test_a_residual_that_waits_for_its_own_work_is_refused(tmp_path, monkeypatch):
    """A residual compiled without lowering.RESIDUAL_FLAGS (as StageML did before its calls passed
    fences: IREE's synchronous calls) is refused at load with the fix, not called with arguments
    its signature lacks; one compiled with them takes the fences and matches PyTorch."""
    from stageml.compiler import lowering

    model, x = MLP().eval(), torch.randn(3, 32)
    fenced = stageml.load(stageml.compile(model, (x,)).save(str(tmp_path / "fenced.vmfb")))
    expected = model(x).detach().numpy()
    assert np.abs(fenced(x.numpy()) - expected).max() <= 1e-5 * np.abs(expected).max()
    monkeypatch.setattr(lowering, "RESIDUAL_FLAGS", ())
    path = stageml.compile(model, (x,)).save(str(tmp_path / "sync.vmfb"))
    with pytest.raises(stageml.StageMLError, match="was compiled by an earlier StageML .*: recompile the model"):
        stageml.load(path)


def test_a_gpu_calls_wait_polls_then_sleeps_and_reports_a_failure(mlp_artifact, monkeypatch):
    """ResidualModule._wait as a GPU call takes it (here on the CPU device's semaphores): a call
    whose work outlasts the polling still returns once its semaphore is signalled, and a
    semaphore failed by the device raises instead of waiting forever."""
    import threading
    import time

    from stageml.runtime import module

    _, path = mlp_artifact
    mod = stageml.load(path)
    monkeypatch.setattr(module, "POLL_NS", 2_000_000)
    monkeypatch.setattr(mod, "_device_kind", "cuda")
    device = mod._config.device
    for delay in (0.0005, 0.05):  # signalled while polling; after the polling gave up
        done = device.create_semaphore(0)
        threading.Timer(delay, lambda: done.signal(1)).start()
        start = time.perf_counter()
        mod._wait(done)
        assert done.query() == 1 and time.perf_counter() - start >= delay
    failed = device.create_semaphore(0)
    threading.Timer(0.01, lambda: failed.fail("the device stopped")).start()
    with pytest.raises(RuntimeError, match="the device stopped"):
        mod._wait(failed)


# -- stagemlc: every user mistake one line and exit 1 (2 for usage), bugs exit 3 ------

def _main(capsys, *args) -> tuple:
    """(exit status, stderr lines) of stagemlc.main(args)."""
    code = stagemlc.main([str(a) for a in args])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, err.strip().splitlines()


def _main_error(capsys, *args) -> str:
    code, lines = _main(capsys, *args)
    assert code == 1 and len(lines) == 1 and lines[0].startswith("stagemlc: error: "), (code, lines)
    return lines[0]


def _usage_error(capsys, *args) -> str:
    code, lines = _main(capsys, *args)
    assert code == 2 and lines[0].startswith("usage: stagemlc") and lines[-1].startswith("stagemlc: error: "), lines
    assert sum(line.startswith("stagemlc: error: ") for line in lines) == 1
    return lines[-1]


def _damage(path, kind):
    data = open(path, "rb").read()
    if kind == "random":
        return np.random.default_rng(0).bytes(5000)
    if kind == "truncated":
        return data[:len(data) // 2]
    if kind == "empty":
        return b""
    if kind == "central-directory":  # the zip's central directory overwritten
        at = data.rfind(b"PK\x01\x02")
        return data[:at] + b"\xff" * 46 + data[at + 46:]
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["random", "truncated", "empty", "central-directory", "directory", "missing"])
def test_cli_corrupt_model_file(mlp_artifact, tmp_path, capsys, kind):
    path = tmp_path / "model.pt2"
    if kind == "directory":
        path.mkdir()
    elif kind != "missing":
        path.write_bytes(_damage(mlp_artifact[0] / "mlp.pt2", kind))
    line = _main_error(capsys, path, "-o", tmp_path / "out.vmfb", "-q")
    assert repr(str(path)) in line


@pytest.mark.parametrize("stage, message", [
    ("x=adapter", "stage glob 'x' makes forward input 'x' adapter, but a forward input is known only per request"),
    ("x=static", "makes forward input 'x' static"),
    ("*=static", "stage glob '\\*' makes forward input 'x' static"),
    ("x", "stage option 'x' is not GLOB=TIME"),
    ("=adapter", "stage option '=adapter' is not GLOB=TIME"),
    ("x=foo", "unknown binding time 'foo'"),
    ("x=", "unknown binding time ''"),
    ("nothing*=static", "stage glob 'nothing\\*' matches no parameter, buffer or input"),
])
def test_cli_bad_stage_options(mlp_artifact, tmp_path, capsys, stage, message):
    line = _main_error(capsys, mlp_artifact[0] / "mlp.pt2", "-o", tmp_path / "out.vmfb", "--stage", stage, "-q")
    assert re.search(message, line), line


def test_stage_spec_for_a_forward_input_is_refused(mlp_artifact):
    from stageml.compiler import stage_spec
    from stageml.errors import StageSpecError

    with pytest.raises(StageSpecError, match="forward input 'x' adapter"):
        stageml.compile(str(mlp_artifact[0] / "mlp.pt2"), stages={"x": "adapter"}, emit="torch")
    names, weights = ["fc.weight", "lora_A_in"], {"fc.weight"}
    assert stage_spec.resolve(names, weights)["lora_A_in"].label == "dynamic"  # an input, whatever its name
    # Weights unknown (stageml-opt on an IR file): PEFT's names are adapter-time and any glob may set any time.
    times = stage_spec.resolve(["fc.lora_A.weight", "x"], None, [("x", "static")])
    assert [t.label for t in times.values()] == ["adapter", "static"]
    for spec, match in [({1: "static"}, "stage spec entry \\(1, 'static'\\) is not a \\(glob, time\\) pair"),
                        ("fc.*=static", "stage spec 'fc.\\*=static' is a string"),
                        (["fc.*=static"], "is not a \\(glob, time\\) pair"), (3, "is not a dict or list")]:
        with pytest.raises(StageSpecError, match=match):
            stage_spec.resolve(names, weights, spec)


def test_cli_refuses_to_overwrite_the_model(mlp_artifact, tmp_path, capsys):
    model = tmp_path / "model.pt2"
    model.write_bytes((mlp_artifact[0] / "mlp.pt2").read_bytes())
    for emit in ("torch", "bt", "split", "linalg", "iree"):
        line = _main_error(capsys, model, "-o", model, "--emit", emit)
        assert f"output '{model}' would overwrite the input model '{model}': choose another -o" in line
    os.symlink(model, tmp_path / "link.mlir")
    assert "would overwrite the input model" in _main_error(capsys, model, "-o", tmp_path / "link.mlir", "--emit", "bt")
    # A .vmfb's siblings: -o model.vmfb writes model.json and model.irpa beside it.
    for sibling in ("model.json", "model.irpa"):
        os.replace(model, tmp_path / sibling)
        model = tmp_path / sibling
        line = _main_error(capsys, model, "-o", tmp_path / "model.vmfb")
        assert f"output '{model}' would overwrite the input model" in line
    assert model.read_bytes() == (mlp_artifact[0] / "mlp.pt2").read_bytes()


def test_cli_output_paths(mlp_artifact, tmp_path, capsys):
    model = mlp_artifact[0] / "mlp.pt2"
    (tmp_path / "dir.vmfb").mkdir()
    (tmp_path / "file").write_text("x")
    line = _main_error(capsys, model, "-o", tmp_path / "dir.vmfb")
    assert f"output '{tmp_path / 'dir.vmfb'}' is a directory" in line
    line = _main_error(capsys, model, "-o", tmp_path / "file" / "out.vmfb")
    assert f"'{tmp_path / 'file'}' is a file, not a directory" in line
    for dump in (tmp_path / "file", tmp_path / "file" / "sub"):
        line = _main_error(capsys, model, "-o", tmp_path / "out.vmfb", "--dump-stages", dump)
        assert f"--dump-stages '{dump}' cannot be a directory: '{tmp_path / 'file'}' is a file" in line
    # The driver's own check (the Python API): its dump is write_files, which raises OutputError.
    with pytest.raises(stageml.StageMLError, match=f"cannot write '{tmp_path / 'file' / 'model.torch.mlir'}'"):
        stageml.compile(str(model), emit="torch", dump_dir=str(tmp_path / "file"))


class _FakeArtifact:
    report = None
    mlir = {"torch": "module {}\n"}


def test_cli_text_output_is_written_whole(tmp_path, capsys, monkeypatch):
    from stageml.compiler import driver

    seen = []
    monkeypatch.setattr(driver, "compile", lambda model, options: seen.append(options) or _FakeArtifact())
    out = tmp_path / "a" / "model.torch.mlir"
    assert _main(capsys, "m.pt2", "-o", out, "--emit", "torch", "-q") == (0, [])
    assert out.read_text() == "module {}\n" and os.listdir(out.parent) == ["model.torch.mlir"]
    assert seen[-1].trust_model is False
    assert _main(capsys, "m.pt2", "-o", out, "--emit", "torch", "-q", "--trust-model") == (0, [])
    assert seen[-1].trust_model is True
    if os.path.isdir("/proc/self"):  # a directory no one can create entries in
        assert "cannot write" in _main_error(capsys, "m.pt2", "-o", "/proc/stageml-test/x.mlir", "--emit", "torch")


def test_cli_internal_error_is_one_line_and_exit_3(capsys, monkeypatch):
    from stageml.compiler import driver

    def broken(model, options):
        raise KeyError("boom")

    monkeypatch.setattr(driver, "compile", broken)
    code, lines = _main(capsys, "m.pt2", "-q")
    assert code == 3 and len(lines) == 1
    assert lines[0].startswith("stagemlc: internal error") and "KeyError: 'boom'" in lines[0]
    assert "STAGEML_TRACEBACK=1" in lines[0]
    monkeypatch.setenv("STAGEML_TRACEBACK", "1")
    assert stagemlc.main(["m.pt2", "-q"]) == 3
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and "KeyError: 'boom'" in err


def test_cli_numeric_options_and_usage(mlp_artifact, tmp_path, capsys):
    model = mlp_artifact[0] / "mlp.pt2"
    out = tmp_path / "t.vmfb"
    assert "max_adapters (-1) and max_rank (16) must be at least 1" in _main_error(capsys, model, "-o", out,
                                                                                   "--max-adapters", "-1")
    line = _main_error(capsys, model, "-o", out, "--max-adapters", "2", "--max-rank", "0")
    assert "--max-rank 0 is not a rank" in line
    assert "--max-rank applies only with --max-adapters" in _usage_error(capsys, model, "--max-rank", "0")
    assert "argument --max-adapters: invalid int value: 'x'" in _usage_error(capsys, model, "--max-adapters", "x")
    assert "the following arguments are required: model" in _usage_error(capsys)
    assert "unrecognized arguments: --nope" in _usage_error(capsys, model, "--nope")
    assert "invalid choice: 'tpu'" in _usage_error(capsys, model, "--target", "tpu")
    assert stagemlc.main(["--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "exit status: 0 success; 1 an error in the input" in help_text and "STAGEML_TRACEBACK=1" in help_text
    assert "--trust-model load a .pt2 even if that needs an unrestricted unpickle" in help_text


def test_cli_usage_error_in_a_process():
    result = subprocess.run(STAGEMLC + ["model.pt2", "--max-adapters", "many"], capture_output=True, text=True)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last == "stagemlc: error: argument --max-adapters: invalid int value: 'many'"


@pytest.mark.parametrize("stages", ["fc1.*=static", [("fc1.*",)], [42]])
def test_malformed_stage_options(stages):
    with pytest.raises(stageml.StageMLError, match="pass {glob: time} or"):
        stageml.CompileOptions(stages=stages)


def test_a_model_without_weights_keeps_its_inputs_dynamic():
    class Double(torch.nn.Module):
        def forward(self, x):
            return x * 2

    with pytest.raises(stageml.StageMLError, match="makes forward input 'x' static"):
        stageml.compile(Double(), (torch.randn(2),), stages={"x": "static"})


@pytest.mark.parametrize("damage", ["corrupt", "missing tensor"])
def test_resumed_compile_with_damaged_weights(mlp_artifact, tmp_path, damage):
    root, _ = mlp_artifact
    stageml.compile(str(root / "mlp.pt2"), dump_dir=str(tmp_path), emit="split")
    weights = tmp_path / "model.weights.safetensors"
    if damage == "corrupt":
        weights.write_bytes(b"junk")
        match = "model.weights.safetensors' cannot be read"
    else:
        from safetensors.torch import load_file, save_file
        tensors = load_file(str(weights))
        del tensors["fc1.weight"]
        save_file(tensors, str(weights))
        match = "the weights lack 'fc1.weight'"
    with pytest.raises(stageml.StageMLError, match=match):
        stageml.compile(str(tmp_path / "model.split.mlir"))


def test_an_argument_the_compiled_signature_refuses_is_an_input_error(tmp_path):
    """IREE's own check of an argument against the compiled function (where IREE fixed a
    dimension the manifest leaves open: Inkling's batch) is a one-line InputError naming
    the input, not IREE's ValueError."""
    model = MLP().eval()
    mod = stageml.compile(model, (torch.randn(3, 32),)).load(str(tmp_path / "mlp.vmfb"))
    with pytest.raises(InputError, match=r"^the residual refused 'x' \(input0 shape dimension 0 mismatch; "
                                         r"expected 3 but have 5\): .*export that dimension static$"):
        mod._call(mod.entry("dynamic"), {"x": np.zeros((5, 32), np.float32)}, mod.state)
