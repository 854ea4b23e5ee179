"""The PEFT-LoRA Llama, exported once with dynamic batch and sequence dims,
compiled by the stagemlc CLI in a subprocess and run through stageml.load."""

import subprocess
import sys

import pytest
import torch
from torch.export import Dim

import stageml
from models import peft_llama, rel_err

STAGEMLC = [sys.executable, "-m", "stageml.tools.stagemlc"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama")
    model = peft_llama(hidden=64)
    ids = torch.randint(0, 128, (2, 7))
    program = torch.export.export(model, (ids,), strict=False,
                                  dynamic_shapes=({0: Dim("batch", max=64), 1: Dim("seq", max=127)},))
    torch.export.save(program, root / "llama.pt2")
    result = subprocess.run(STAGEMLC + [str(root / "llama.pt2"), "-o", str(root / "out" / "residual.vmfb"),
                                        "--dump-stages", str(root / "stages")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return model, root, result.stdout


def test_cli_writes_artifacts_and_report(llama):
    _, root, stdout = llama
    assert {p.name for p in (root / "out").iterdir()} == {"residual.vmfb", "residual.irpa", "residual.json"}
    assert "lora-merge x8" in stdout and "ops per binding time" in stdout
    stages = {p.name for p in (root / "stages").iterdir()}
    assert stages == {"model.torch.mlir", "model.bt.mlir", "model.split.mlir", "model.linalg.mlir",
                      "model.iree.mlir", "model.vmfb", "model.weights.safetensors", "model.folded.safetensors"}


def test_cli_resumes_from_a_dumped_stage(llama, tmp_path):
    # A dump is a reproducer: stagemlc picks up at the bt stage of the Llama.
    model, root, _ = llama
    result = subprocess.run(STAGEMLC + [str(root / "stages" / "model.bt.mlir"), "-o", str(tmp_path / "r.vmfb"), "-q"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    ids = torch.randint(0, 128, (2, 7))
    with torch.no_grad():
        expected = model(ids)
    assert rel_err(stageml.load(str(tmp_path / "r.vmfb"))(ids), expected) <= 1e-4


@pytest.mark.parametrize("shape", [(1, 5), (3, 17)])
def test_residual_matches_peft(llama, shape):
    model, root, _ = llama
    mod = stageml.load(str(root / "out" / "residual.vmfb"))
    ids = torch.randint(0, 128, shape)
    with torch.no_grad():
        expected = model(ids)
    actual = mod(ids)
    assert actual.shape == tuple(expected.shape)
    assert rel_err(actual, expected) <= 1e-4


def test_dynamic_dims_survive(llama):
    _, root, _ = llama
    manifest = stageml.load(str(root / "out" / "residual.vmfb")).manifest
    forward = next(e for e in manifest["entry_points"] if (e["stage"], e["program"]) == ("dynamic", "main"))
    assert [a for a in forward["arguments"] if a["kind"] == "input"][0]["shape"] == [None, None]
    assert "tensor<?x?xi64>" in (root / "stages" / "model.linalg.mlir").read_text()


def test_emit_stops_early(llama, tmp_path):
    _, root, _ = llama
    out = tmp_path / "model.split.mlir"
    result = subprocess.run(STAGEMLC + [str(root / "llama.pt2"), "-o", str(out), "--emit", "split", "-q"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    assert "func.func @static" in text and "func.func @adapter" in text and "func.func @forward" in text
