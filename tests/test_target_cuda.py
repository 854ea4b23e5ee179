"""--target cuda: compiled here (no GPU needed), run only where a CUDA GPU is."""

import copy
import json

import pytest
import torch
from iree import runtime as iree_rt
from torch.export import Dim

import stageml
from models import LoraLinear, rel_err


def _has_cuda() -> bool:
    try:
        iree_rt.get_device("cuda")
        return True
    except Exception:
        return False


@pytest.fixture(scope="module")
def cuda_artifact(tmp_path_factory):
    torch.manual_seed(0)
    model = LoraLinear(d_in=256, d_out=64).eval().half()
    art = stageml.compile(model, (torch.randn(4, 256).half(),), dynamic_shapes=({0: Dim("b", max=64)},),
                          target="cuda")
    return model, art, art.save(str(tmp_path_factory.mktemp("cuda") / "residual.vmfb"))


def test_cuda_residual_holds_ptx_and_names_its_device(cuda_artifact):
    _, art, path = cuda_artifact
    assert b"cuda-nvptx-fb" in art.vmfb  # IREE's CUDA executable format
    assert b"sm_80" in art.vmfb
    assert "linalg.mmt4d" not in art.mlir["iree"]  # the CPU's packed layout is not used
    manifest = json.loads(open(path[:-5] + ".json").read())
    assert (manifest["target"]["name"], manifest["device"]) == ("cuda", "cuda")


@pytest.mark.skipif(_has_cuda(), reason="this machine has a CUDA device")
def test_cuda_residual_without_a_gpu_is_a_clear_error(cuda_artifact):
    _, _, path = cuda_artifact
    with pytest.raises(stageml.StageMLError, match="IREE device 'cuda' is not available here: run this cuda "
                                                   "residual where that device exists, or compile for --target cpu"):
        stageml.load(path)


@pytest.mark.skipif(not _has_cuda(), reason="needs a CUDA GPU")
def test_cuda_residual_matches_pytorch(cuda_artifact):
    model, _, path = cuda_artifact
    mod = stageml.load(path)
    x = torch.randn(7, 256).half()
    assert rel_err(mod(x), copy.deepcopy(model).double()(x.double())) <= 2e-3


def test_per_row_products_compile_for_cuda_with_the_reduction_path_that_takes_them():
    """A multi-tenant residual's per-row products (fuse-gathers') and an MoE model's routed
    experts compile for cuda: IREE's GPU codegen fails on them with its reduction vector
    distribution, which the target turns off for a module that holds them, and only then."""
    import transformers
    from peft import LoraConfig, get_peft_model

    from stageml.compiler.passes.fuse_gathers import GPU_FLAGS
    from test_moe import FAMILIES

    torch.manual_seed(0)
    linear = get_peft_model(torch.nn.Sequential(torch.nn.Linear(64, 48)),
                            LoraConfig(r=4, target_modules=["0"], init_lora_weights=False)).eval()
    tenants = stageml.compile(linear, (torch.randn(3, 64),), dynamic_shapes=({0: Dim("rows", max=64)},),
                              target="cuda", max_adapters=2, max_rank=4)
    moe = stageml.compile(transformers.AutoModelForCausalLM.from_config(FAMILIES["mixtral"]()).eval().half(),
                          (torch.randint(0, 128, (1, 5)),), dynamic_shapes=({1: Dim("seq", max=16)},),
                          target="cuda")
    dense = stageml.compile(LoraLinear(d_in=256, d_out=64).eval(), (torch.randn(4, 256),), target="cuda")
    for art in (tenants, moe):
        assert b"cuda-nvptx-fb" in art.vmfb and art.report.rewrites["fuse-gathers"] > 0
        assert set(GPU_FLAGS) <= set(art.report.iree_flags)
    assert not set(GPU_FLAGS) & set(dense.report.iree_flags)
