"""Differential tests: compiled residuals against PyTorch on fresh inputs."""

import pytest
import torch
from torch.export import Dim

import stageml
from models import MLP, LoraLinear, rel_err


def _forward_ops(split_text: str) -> list:
    body = split_text.split("func.func @forward", 1)[1]
    ops = [line for line in body.splitlines() if "bt.time" in line and "= torch." in line]
    return [op for op in ops if "torch.constant." not in op]  # constants are cloned per stage


def test_mlp_static_weights_fold(tmp_path):
    model = MLP().eval()
    x = torch.randn(3, 32)
    art = stageml.compile(model, (x,), dynamic_shapes=({0: Dim("batch", max=256)},))
    assert art.report.ops["dynamic"] > 0 and art.report.folded_values >= 2
    # The residual holds no op that reads only static values.
    ops = _forward_ops(art.mlir["split"])
    assert ops and all('#bt.time<"dynamic">' in op for op in ops)
    mod = art.load(str(tmp_path / "mlp.vmfb"))
    for batch in (1, 7):
        x = torch.randn(batch, 32)
        assert rel_err(mod(x), model(x)) <= 1e-5


def test_lora_linear_is_merged(tmp_path):
    model = LoraLinear().eval()
    x = torch.randn(2, 5, 48)
    art = stageml.compile(model, (x,), dynamic_shapes=({0: Dim("b", max=64), 1: Dim("s", max=64)},))
    assert art.report.rewrites.get("lora-merge", 0) >= 1
    assert art.report.lifted.get("adapter->dynamic", 0) == 1
    mod = art.load(str(tmp_path / "lora.vmfb"))
    x = torch.randn(3, 9, 48)
    assert rel_err(mod(x), model(x)) <= 1e-5


def test_merged_adapter_weight_is_stored_packed(tmp_path):
    model = LoraLinear(d_in=48, d_out=64).eval()
    x = torch.randn(5, 48)
    art = stageml.compile(model, (x,), dynamic_shapes=({0: Dim("b", max=64)},))
    residual = art.mlir["iree"]
    # @adapter returns the merged weight packed, once; @forward takes it as
    # its first argument (marked as @adapter's result 0) and multiplies with mmt4d.
    assert "func.func @adapter(%arg0: tensor<4x48xf32>, %arg1: tensor<64x4xf32>) -> tensor<4x48x16x1xf32>" in residual
    assert ("func.func @forward(%arg0: tensor<4x48x16x1xf32> {stageml.adapter_result = 0 : i64}, "
            "%arg1: tensor<?x48xf32>)") in residual
    adapter, forward = residual.split("func.func @forward")
    assert "linalg.pack" in adapter.split("func.func @adapter")[1]
    assert "linalg.mmt4d" in forward and "linalg.matmul" not in forward
    mod = art.load(str(tmp_path / "packed.vmfb"))
    for rows in (1, 17):  # padded to whole 16-row tiles inside
        x = torch.randn(rows, 48)
        assert rel_err(mod(x), model(x)) <= 1e-5


def test_unpackable_width_keeps_matmul():
    model = LoraLinear(d_in=48, d_out=40).eval()  # 40 is no multiple of the 16-wide tile
    art = stageml.compile(model, (torch.randn(3, 48),), emit="iree")
    assert "linalg.matmul" in art.mlir["iree"].split("func.func @forward")[1]
    assert "linalg.mmt4d" not in art.mlir["iree"]


def test_unmerged_lora_stays_factorized(tmp_path):
    model = LoraLinear().eval()
    x = torch.randn(4, 48)
    art = stageml.compile(model, (x,), dynamic_shapes=({0: Dim("b", max=64)},), merge_lora=False)
    assert "lora-merge" not in art.report.rewrites
    mod = art.load(str(tmp_path / "lora.vmfb"))
    x = torch.randn(6, 48)
    assert rel_err(mod(x), model(x)) <= 1e-5


def test_emit_and_dump_stages(tmp_path):
    model = MLP().eval()
    art = stageml.compile(model, (torch.randn(2, 32),), emit="split", dump_dir=str(tmp_path))
    assert art.vmfb is None and set(art.mlir) == {"torch", "bt", "split"}
    assert "func.func @static" in art.mlir["split"] and "func.func @forward" in art.mlir["split"]
    assert {p.name for p in tmp_path.iterdir()} == {"model.torch.mlir", "model.bt.mlir", "model.split.mlir"}


class _LayoutHeavy(torch.nn.Module):
    """Weight layout work before use: cast, reshape and transpose of weights."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 8, 32).half())
        self.bias = torch.nn.Parameter(torch.randn(32))

    def forward(self, x):
        w = self.weight.float().reshape(32, 32).transpose(0, 1)
        return x @ w + self.bias


def test_weight_layout_work_is_hoisted_to_static(tmp_path):
    model = _LayoutHeavy().eval()
    art = stageml.compile(model, (torch.randn(3, 32),), dynamic_shapes=({0: Dim("b", max=64)},))
    static, forward = art.mlir["split"].split("func.func @forward")
    for layout_op in ("torch.aten.to.dtype", "torch.aten.view", "torch.aten.permute"):
        assert layout_op in static and layout_op not in forward, layout_op
    mod = art.load(str(tmp_path / "layout.vmfb"))
    x = torch.randn(5, 32)
    assert rel_err(mod(x), model(x)) <= 1e-5


@pytest.mark.parametrize("dtype, bound", [(torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
def test_half_precision_models(tmp_path, dtype, bound):
    # Products accumulate in f32 (torch-mlir's lowering), as PyTorch's do;
    # the reference is the same half-precision weights in float64.
    model = LoraLinear(d_in=256, d_out=64).eval().to(dtype)
    art = stageml.compile(model, (torch.randn(4, 256).to(dtype),), dynamic_shapes=({0: Dim("b", max=64)},))
    mod = art.load(str(tmp_path / "half.vmfb"))
    x = torch.randn(7, 256).to(dtype)
    y = mod(x)
    assert str(y.dtype) == str(dtype).split(".")[1]
    expected = model.double()(x.double())
    assert rel_err(y, expected) <= bound
