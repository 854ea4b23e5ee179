"""Bad input: each a StageMLError with one sentence; the CLI exits 1 with one line."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.export import Dim

import stageml
from models import MLP

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
    with pytest.raises(stageml.StageMLError, match="corrupt or truncated"):
        stageml.load(f"{stem}.vmfb")


@pytest.mark.parametrize("damage,message", [
    ("missing-json", "manifest .* is missing"), ("bad-json", "manifest .* is corrupt"),
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
