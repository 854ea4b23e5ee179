"""--target sm90: StageML's Hopper pipeline, compiled here (nvcc builds the
kernels; no GPU needed), run only where a CUDA GPU is."""

import copy
import json
import re
import shutil
import struct

import pytest
import torch
from iree import compiler as iree_compiler
from iree.compiler import ir
from torch.export import Dim

import stageml
from models import LoraLinear, peft_llama, rel_err, submissions
from stageml.compiler.sm90 import build
from stageml.tools import stagemlc
from test_target_cuda import _has_cuda

needs_nvcc = pytest.mark.skipif(build.nvcc() is None, reason="building the sm90 kernels needs nvcc")
ROWS = ({0: Dim("rows", max=512)},)


def _ptx_targets(art) -> set:
    return set(re.findall(rb"\.target (sm_\w+)", art.vmfb))


def _compile(dtype, dynamic_shapes=ROWS, **options):
    torch.manual_seed(0)
    model = LoraLinear(d_in=256, d_out=512, rank=8).eval().to(dtype)
    return model, stageml.compile(model, (torch.randn(4, 256).to(dtype),), dynamic_shapes=dynamic_shapes,
                                  target="sm90", **options)


@pytest.fixture(scope="module")
def sm90_artifacts(tmp_path_factory):
    root = tmp_path_factory.mktemp("sm90")
    arts = {}
    for name, dtype, merge in (("merged", torch.float16, True), ("factorized", torch.float16, False),
                               ("bf16", torch.bfloat16, True)):
        model, art = _compile(dtype, merge_lora=merge)
        arts[name] = (model, art, art.save(str(root / f"{name}.vmfb")))
    return arts


# @forward's x@W (K = 256, N = 512: the wgmma kernel's multiples); @adapter's A@B (K = the rank, 8,
# not a multiple of 64) stays with IREE
MERGED_KERNELS = {"stageml_gemm_wgmma": 1}
# a LoRA site with K = 256, up to 512 rows (ROWS): a BGMV and the GEMM with its expand; exported for at
# most 128 rows (DECODE_ROWS): the whole site in one kernel
FACTORIZED_KERNELS = {"stageml_bgmv": 1, "stageml_gemm_expand": 1}
DECODE_ROWS = ({0: Dim("rows", max=128)},)
DECODE_KERNELS = {"stageml_gemm_lora": 1}


@needs_nvcc
def test_merged_residual_dispatches_the_gemm_kernel(sm90_artifacts):
    _, art, path = sm90_artifacts["merged"]
    assert art.report.custom_kernels == MERGED_KERNELS
    adapter, forward = art.mlir["iree"].split("func.func @forward")
    assert "linalg.matmul" in adapter.split("func.func @adapter")[1]
    assert "flow.dispatch @stageml_sm90::@stageml_gemm_wgmma_f16[" in forward and "linalg.matmul" not in forward
    assert _ptx_targets(art) == {b"sm_90a", b"sm_90"}  # the kernels' PTX; IREE's codegen for the rest
    assert b"stageml_gemm_wgmma_f16" in art.vmfb
    manifest = json.loads(open(path[:-5] + ".json").read())
    assert (manifest["target"]["name"], manifest["device"]) == ("sm90", "cuda")
    assert manifest["report"]["custom_kernels"] == MERGED_KERNELS


# @forward's merged x@W (K = N = 256); @forward_factorized's site, at most 64 rows: x@A (the shrink), x@W
# and the expand (x@A)@B of each row's own adapter in one kernel
TENANT_KERNELS = {"stageml_gemm_wgmma": 1, "stageml_gemm_lora": 1}
# the same site on more rows (e.g. up to 64 x 64 token rows): a BGMV shrink, then x@W with the expand in
# its epilogue
SPLIT_KERNELS = {"stageml_gemm_wgmma": 1, "stageml_bgmv": 1, "stageml_gemm_expand": 1}


def _tenant_model(seed: int, rank: int = 8):
    """A PEFT LoRA on one 256x256 layer (no bias), f16: the fused kernel's multiples."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(256, 256, bias=False))
    torch.manual_seed(seed)
    return get_peft_model(base, LoraConfig(r=rank, target_modules=["0"], init_lora_weights=False)).half().eval()


@pytest.fixture(scope="module")
def tenant_artifact():
    return stageml.compile(_tenant_model(0), (torch.randn(3, 256).half(),), dynamic_shapes=({0: Dim("rows", max=64)},),
                           target="sm90", max_adapters=4, max_rank=8)


def _peft_rows(models: dict, names: list, x) -> torch.Tensor:
    """PEFT's output for each row of `x` alone, in float64: row i by models[names[i]]
    (None: the base model, the first one with its adapter disabled)."""
    expected = torch.empty(x.shape, dtype=torch.float64)
    with torch.no_grad():
        for i, name in enumerate(names):
            wide = copy.deepcopy(models[name or next(iter(models))]).double()
            if name is None:
                with wide.disable_adapter():
                    expected[i] = wide(x[i:i + 1].double())[0]
            else:
                expected[i] = wide(x[i:i + 1].double())[0]
    return expected


@needs_nvcc
def test_a_call_is_one_queue_submission():
    """The runtime checks (bt-gather's row check a LoRA site, torch-mlir's shape checks) run ahead of
    the work (hoist-asserts), so IREE submits each call's dispatches together: one execution region
    for a two-site decode residual's calls and for a Llama's with dynamic batch and sequence."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(256, 256, bias=False), torch.nn.Linear(256, 256, bias=False))
    two_sites = get_peft_model(base, LoraConfig(r=8, target_modules=["0", "1"], init_lora_weights=False)).half()
    art = stageml.compile(two_sites.eval(), (torch.randn(3, 256).half(),), dynamic_shapes=DECODE_ROWS,
                          target="sm90", max_adapters=4, max_rank=8)
    assert art.report.custom_kernels == {"stageml_gemm_wgmma": 2, "stageml_gemm_lora": 2}
    assert {e["symbol"]: submissions(art, e["symbol"]) for e in art.entry_points if e["stage"] == "dynamic"} == \
        {"forward": 1, "forward_factorized": 1}
    llama = stageml.compile(peft_llama().half(), (torch.randint(0, 128, (2, 16)),), target="sm90",
                            dynamic_shapes={"ids": {0: Dim("batch", max=8), 1: Dim("seq", min=2, max=64)}})
    assert submissions(llama, "forward") == 1


@needs_nvcc
def test_wgmma_kernels_keep_their_dynamic_shared_memory(tenant_artifact, sm90_artifacts):
    """hopper.mlir's `workgroup_local_memory` of the wgmma exports (the GEMM,
    the GEMM with a fused expand, the LoRA site in one kernel) survives IREE's compile: the exports in
    the residual's hal.executable carry it, and the .vmfb's CUDA executable
    gives it as the export's block_shared_memory_size, which IREE's runtime
    sets on the kernel (cuFuncSetAttribute) and launches it with."""
    arts = [tenant_artifact, sm90_artifacts["factorized"][1]]  # one kernel a site, and two
    with ir.Context():
        exports, modules = {}, []  # the modules outlive the ops kept from them

        def visit(op):
            if op.name == "hal.executable.export":
                exports[ir.StringAttr(op.attributes["sym_name"]).value] = op
            return ir.WalkResult.ADVANCE

        for art in arts:
            hal = iree_compiler.compile_str(art.mlir["iree"], target_backends=["cuda"],
                                            extra_args=[f"--iree-hal-executable-object-search-path={build.build()}",
                                                        "--compile-to=executable-targets"])
            modules.append(ir.Module.parse(hal))
            modules[-1].operation.walk(visit)
        for name in ("stageml_gemm_wgmma_f16", "stageml_gemm_expand_f16"):
            export = exports[name]
            assert ir.IntegerAttr(export.attributes["workgroup_local_memory"]).value == 197632
            assert [ir.IntegerAttr(d).value for d in ir.ArrayAttr(export.attributes["workgroup_size"])] == [288, 1, 1]
        lora = exports["stageml_gemm_lora_f16"]
        assert ir.IntegerAttr(lora.attributes["workgroup_local_memory"]).value == 230656
        assert [ir.IntegerAttr(d).value for d in ir.ArrayAttr(lora.attributes["workgroup_size"])] == [320, 1, 1]
        assert "workgroup_local_memory" not in exports["stageml_bgmv_f16"].attributes
    # the CUDA ExportDef (flatbuffer): block_dims, then block_shared_memory_size
    assert all(struct.pack("<4I", 288, 1, 1, 197632) in art.vmfb for art in arts)
    assert struct.pack("<4I", 320, 1, 1, 230656) in arts[0].vmfb


@needs_nvcc
def test_unmerged_lora_site_takes_the_multi_tenant_kernels(sm90_artifacts):
    # K = 256: the site's adapter as the only slot; up to 512 rows a BGMV shrink, then the expand kernel
    _, art, _ = sm90_artifacts["factorized"]
    assert art.report.custom_kernels == FACTORIZED_KERNELS
    forward = art.mlir["iree"].split("@forward")[1]
    assert "stageml_bgmv_f16" in forward and "stageml_gemm_expand_f16" in forward
    assert "linalg.matmul" not in forward and "stageml_lora" not in forward and "stageml_gemm_lora" not in forward
    assert b"stageml_gemm_expand_f16" in art.vmfb


@needs_nvcc
def test_bfloat16_uses_the_bf16_kernels(sm90_artifacts):
    _, art, _ = sm90_artifacts["bf16"]
    assert art.report.custom_kernels == MERGED_KERNELS
    assert "@stageml_sm90::@stageml_gemm_wgmma_bf16[" in art.mlir["iree"]
    assert re.search(r"flow.dispatch @stageml_sm90::@stageml_\w+_f16\[", art.mlir["iree"]) is None


# Rows of T tokens (x [B, T, 256]): the site's products on the B*T token rows
# (fuse-gathers{multi-token=true}), reaching its add through reshapes of those rows
TOKEN_ROWS = ({0: Dim("rows", max=64), 1: Dim("tokens", max=64)},)


@needs_nvcc
@pytest.mark.parametrize("tokens", [None, 5], ids=["one-token", "multi-token"])
def test_multi_tenant_site_is_one_kernel_or_a_bgmv_and_the_gemm_with_its_expand(request, tokens):
    """The export's row bound picks the site's form when compiling: at most 64 rows, one
    stageml_gemm_lora; up to 64 x 64 token rows, the BGMV and the GEMM with its expand.
    Neither branches on the rows at run time."""
    art = request.getfixturevalue("tenant_artifact") if tokens is None else stageml.compile(
        _tenant_model(0), (torch.randn(3, tokens, 256).half(),), dynamic_shapes=TOKEN_ROWS, target="sm90",
        max_adapters=4, max_rank=8)
    assert art.report.custom_kernels == (TENANT_KERNELS if tokens is None else SPLIT_KERNELS)
    forward = art.mlir["iree"].split("func.func @forward_factorized")[1]
    one = 1 if tokens is None else 0
    assert forward.count("flow.dispatch @stageml_sm90::@stageml_gemm_lora_f16[") == one
    assert forward.count("flow.dispatch @stageml_sm90::@stageml_bgmv_f16[") == 1 - one
    assert forward.count("flow.dispatch @stageml_sm90::@stageml_gemm_expand_f16[") == 1 - one
    assert "scf.if" not in forward
    assert all(op not in forward for op in ("tensor.extract %", "linalg.matmul", "linalg.batch_matmul"))
    assert forward.count("linalg.broadcast") == (0 if tokens is None else 1)  # the tokens' ids, shared
    assert (b"stageml_gemm_lora_f16" if one else b"stageml_gemm_expand_f16") in art.vmfb


def test_no_custom_kernels_is_iree_codegen_for_the_hopper_target():
    _, art = _compile(torch.float16, custom_kernels=False)
    assert art.report.custom_kernels == {}
    assert "flow.dispatch" not in art.mlir["iree"] and "stageml_sm90" not in art.mlir["iree"]
    assert _ptx_targets(art) == {b"sm_90"}
    assert b"stageml_" not in art.vmfb


def test_missing_nvcc_is_a_clear_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("STAGEML_NVCC", str(tmp_path / "no-nvcc"))
    monkeypatch.setattr(build, "DEFAULT_DIR", tmp_path / "kernels")  # nothing built there
    with pytest.raises(stageml.StageMLError, match="the sm90 target's custom kernels need nvcc .* "
                                                   "or compile with --no-custom-kernels"):
        _compile(torch.float16)
    torch.manual_seed(0)
    model = LoraLinear(d_in=64, d_out=64).eval().half()
    pt2 = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(2, 64).half(),)), str(pt2))
    assert stagemlc.main([str(pt2), "-o", str(tmp_path / "r.vmfb"), "--target", "sm90", "-q"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("stagemlc: error: the sm90 target's custom kernels need nvcc") and err.count("\n") == 1
    assert stagemlc.main([str(pt2), "-o", str(tmp_path / "r.vmfb"), "--target", "sm90", "-q",
                          "--no-custom-kernels"]) == 0


@needs_nvcc
def test_kernels_rebuild_when_the_source_changes(monkeypatch, tmp_path):
    source = tmp_path / "kernels.cu"
    shutil.copy(build.SOURCE, source)
    monkeypatch.setattr(build, "SOURCE", source)
    out = build.build(tmp_path / "out")
    first = (out / build.PTX).stat().st_mtime_ns
    assert build.build(tmp_path / "out") == out and (out / build.PTX).stat().st_mtime_ns == first
    source.write_text(source.read_text() + "\n// changed\n")
    build.build(tmp_path / "out")
    assert (out / build.PTX).stat().st_mtime_ns != first


@pytest.mark.skipif(not _has_cuda(), reason="needs a CUDA GPU (Hopper)")
@pytest.mark.parametrize("name", ["merged", "factorized", "bf16"])
def test_sm90_residual_matches_pytorch(sm90_artifacts, name):
    model, _, path = sm90_artifacts[name]
    mod = stageml.load(path)
    for rows in (1, 7, 200):
        x = torch.randn(rows, 256).to(next(model.parameters()).dtype)
        bound = 1e-2 if x.dtype == torch.bfloat16 else 2e-3
        assert rel_err(mod(x), copy.deepcopy(model).double()(x.double())) <= bound


# -- every sm90 rewrite, checked on the CPU: the same residual with the kernels'
# CPU references (custom_kernels="reference") against PyTorch ------------------

@pytest.mark.parametrize("dtype, bound", [(torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("merge, rows, kernels", [(True, ROWS, MERGED_KERNELS), (False, ROWS, FACTORIZED_KERNELS),
                                                  (False, DECODE_ROWS, DECODE_KERNELS)],
                         ids=["merged", "factorized", "factorized-decode"])
def test_sm90_rewrites_match_pytorch_on_the_cpu(tmp_path, dtype, bound, merge, rows, kernels):
    seed = torch.seed()
    print(f"seed {seed}")
    model, art = _compile(dtype, merge_lora=merge, custom_kernels="reference", dynamic_shapes=rows)
    assert art.report.custom_kernels == kernels and art.target["device"] == "local-task"
    mod = art.load(str(tmp_path / "reference.vmfb"))
    for rows in (1, 5, 33):
        x = torch.randn(rows, 256).to(dtype)
        assert rel_err(mod(x), model.double()(x.double())) <= bound, rows


def test_sm90_bgmv_rewrite_matches_peft_on_the_cpu(tmp_path):
    from peft import LoraConfig, get_peft_model
    from test_tenants import Linear

    seed = torch.seed()
    print(f"seed {seed}")
    model = get_peft_model(Linear(), LoraConfig(r=4, target_modules=["fc"], init_lora_weights=False)).eval().half()
    art = stageml.compile(model, (torch.randn(3, 64).half(),), dynamic_shapes=ROWS, target="sm90",
                          max_adapters=2, max_rank=8, custom_kernels="reference")
    assert art.report.custom_kernels == {"stageml_bgmv": 2}
    mod = art.load(str(tmp_path / "bgmv.vmfb"), policy="factorized")
    mod.load_adapter("a", {k: v for k, v in model.state_dict().items() if "lora_" in k},
                     config=model.peft_config["default"])
    x = torch.randn(4, 64).half()
    with torch.no_grad():
        wide = copy.deepcopy(model).double()
        expected = wide(x.double())
        with wide.disable_adapter():
            expected[1] = wide(x[1:2].double())[0]
    assert rel_err(mod.run_batch(x, ["a", None, "a", "a"]), expected) <= 2e-3


def test_sm90_moe_rewrites_match_transformers_on_the_cpu(tmp_path):
    """A half-precision Mixtral on the sm90 pipeline with the kernels' CPU references: each
    routed row's product with its expert's matrix (gathered by the routed id, per row and in
    blocks of one expert) takes the BGMV kernel, the dense products the GEMM; against the
    same weights in float64."""
    from test_moe import _decisive_mixtral, _seeded
    from workloads import decisively_routed

    _seeded()
    model = _decisive_mixtral().half()
    art = stageml.compile(model, (torch.randint(0, 128, (2, 7)),), target="sm90", custom_kernels="reference",
                          dynamic_shapes=({0: Dim("batch", max=8), 1: Dim("seq", max=32)},))
    assert art.report.custom_kernels == {"stageml_bgmv": 8, "stageml_gemm": 5}  # 2 layers x 2 stacks x 2 forms
    mod = art.load(str(tmp_path / "mixtral.vmfb"))
    reference = model.double()
    reference.config._experts_implementation = "eager"
    for shape in [(1, 1), (2, 7), (4, 20)]:  # 4 x 20: 160 routed rows, in blocks
        x, expected = decisively_routed(reference, lambda x: reference(x).logits, shape, 0.05, 300)
        assert rel_err(mod(x), expected) <= 2e-3, shape


# (tokens per row, the export's dims, the site's kernels)
TENANT_FORMS = {"one-token": (None, ROWS, SPLIT_KERNELS),
                "one-token-decode": (None, DECODE_ROWS, TENANT_KERNELS),
                "multi-token": (5, TOKEN_ROWS, SPLIT_KERNELS),
                "multi-token-decode": (5, ({0: Dim("rows", max=16), 1: Dim("tokens", max=8)},), TENANT_KERNELS)}


@pytest.mark.parametrize("form", TENANT_FORMS)
def test_sm90_tenant_rewrites_match_peft_on_the_cpu(tmp_path, form):
    """A multi-tenant site with the kernels' CPU references, against PEFT: rows of
    two adapters (ranks 8 and 4) and of the base model in one batch. Rows of one
    token or of 5 (the kernels then take the B*T token rows), exported for at
    most 128 rows (the whole site one kernel) or more (the base product takes
    the fused expand, K = N = 256, after a BGMV shrink)."""
    seed = torch.seed()
    print(f"seed {seed}")
    tokens, dims, kernels = TENANT_FORMS[form]
    models = {"a": _tenant_model(seed % 2 ** 31), "b": _tenant_model(seed % 2 ** 31 + 1, rank=4)}
    row = (256,) if tokens is None else (tokens, 256)
    art = stageml.compile(models["a"], (torch.randn(3, *row).half(),), target="sm90", max_adapters=3, max_rank=8,
                          dynamic_shapes=dims, custom_kernels="reference")
    assert art.report.custom_kernels == kernels
    mod = art.load(str(tmp_path / "tenants.vmfb"), policy="factorized")
    for name, model in models.items():
        mod.load_adapter(name, {k: v for k, v in model.state_dict().items() if "lora_" in k},
                         config=model.peft_config["default"])
    names = ["a", None, "b", "a", None, "b", "b"]
    x = torch.randn(len(names), *row).half()
    assert rel_err(mod.run_batch(x, names), _peft_rows(models, names, x)) <= 2e-3
