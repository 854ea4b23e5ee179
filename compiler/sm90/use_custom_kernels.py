"""use-custom-kernels: the residual's hot products become dispatches of
StageML's hand-written Hopper kernels (kernels.cu, declared in hopper.mlir).

On the IREE input (linalg on tensors), with T = f16 or bf16 and K, N static
multiples of 8 (the kernels' 16-byte loads):

  GEMM: a product accumulated in f32 and rounded to T once,
    %p = linalg.matmul ins(%x, %w : tensor<MxKxT>, tensor<KxNxT>) outs(%zero : tensor<MxNxf32>)
    %y = linalg.generic {arith.truncf} ins(%p)
  → %y = flow.dispatch @stageml_sm90::@stageml_gemm_T[%M, %N](%x, %w, M, K, N)

  LoRA: a base product plus a scaled rank-R product of the same rows (R <= 32),
    %y = linalg.generic {arith.addf} ins(GEMM(%x, %w), s2 * GEMM(s1 * GEMM(%x, %a), %b))
  → %y = flow.dispatch @stageml_sm90::@stageml_lora_T[%M, %N](%x, %w, %a, %b, M, K, N, R, bits(s1*s2))
    (s1, s2: optional constant scales; the kernel keeps x@a in f32 on chip)

Every intermediate a match removes must have no other use. LoRA sites are
matched first, so their base products do not become GEMMs of their own.
"""

import pathlib
import struct

from iree.compiler import ir
from iree.compiler.dialects import arith, flow, tensor

from stageml.compiler.pack_weights import is_zero_fill

EXECUTABLE = "stageml_sm90"
LIBRARY = pathlib.Path(__file__).with_name("hopper.mlir")
MAX_RANK = 32
_ELEMENT_TYPES = ("f16", "bf16")


def _elementwise(value, body: list):
    """The linalg.generic defining `value` when it is elementwise with ops `body`, else None."""
    op = value.owner
    if isinstance(op, ir.Block) or op.operation.name != "linalg.generic":
        return None
    generic = op.opview
    if [o.operation.name for o in generic.regions[0].blocks[0].operations] != body:
        return None
    maps = [ir.AffineMapAttr(m).value for m in generic.indexing_maps]
    if any(not m.is_permutation or list(m.results) != list(maps[-1].results) for m in maps):
        return None
    return generic


def _one_use(value) -> bool:
    return len(list(value.uses)) == 1


def _product(value):
    """(x, w, ops) when `value` = truncf(matmul(x, w) into a zero f32 fill), each used once."""
    trunc = _elementwise(value, ["arith.truncf", "linalg.yield"])
    if trunc is None or len(trunc.inputs) != 1 or not _one_use(trunc.inputs[0]):
        return None
    matmul = trunc.inputs[0].owner
    if isinstance(matmul, ir.Block) or matmul.operation.name != "linalg.matmul":
        return None
    x, w, acc = matmul.operation.operands
    element = str(ir.RankedTensorType(x.type).element_type)
    w_type = ir.RankedTensorType(w.type)
    if (element not in _ELEMENT_TYPES or str(w_type.element_type) != element or not w_type.has_static_shape
            or str(ir.RankedTensorType(acc.type).element_type) != "f32" or not is_zero_fill(acc)):
        return None
    return x, w, [trunc.operation, matmul.operation]


def _scaled(value):
    """(inner, s, ops) when `value` = inner * a constant s used once, else (value, 1.0, [])."""
    mul = _elementwise(value, ["arith.mulf", "linalg.yield"])
    if mul is None or len(mul.inputs) != 1 or not _one_use(mul.inputs[0]):
        return value, 1.0, []
    block = mul.regions[0].blocks[0]
    operands = list(list(block.operations)[0].operation.operands)
    constants = [v for v in operands if v != block.arguments[0]]
    if len(constants) != 1 or isinstance(constants[0].owner, ir.Block) \
            or constants[0].owner.operation.name != "arith.constant":
        return value, 1.0, []
    scale = ir.FloatAttr(constants[0].owner.operation.attributes["value"]).value
    return mul.inputs[0], scale, [mul.operation]


def _gemm(value):
    """(kernel, operands, constants, ops) for a GEMM match of `value`, else None."""
    found = _product(value)
    if found is None or not _fits(*found[:2]):
        return None
    x, w, ops = found
    k, n = ir.RankedTensorType(w.type).shape
    return "stageml_gemm", [x, w], [k, n], ops


def _lora(base, adapted):
    """(kernel, operands, constants, ops) for `base` + `adapted` as a LoRA site, else None."""
    base_found = _product(base)
    if base_found is None or not _fits(*base_found[:2]) or not _one_use(base) or not _one_use(adapted):
        return None
    x, w, base_ops = base_found
    inner, outer_scale, outer_ops = _scaled(adapted)
    up = _product(inner)
    if up is None:
        return None
    t, b, up_ops = up
    t, inner_scale, inner_ops = _scaled(t)
    down = _product(t)
    if down is None or down[0] != x:
        return None
    _, a, down_ops = down
    (k, n), (k_a, rank), (rank_b, n_b) = (ir.RankedTensorType(v.type).shape for v in (w, a, b))
    if (k_a, rank_b, n_b) != (k, rank, n) or rank > MAX_RANK:
        return None
    bits = struct.unpack("<i", struct.pack("<f", outer_scale * inner_scale))[0]
    return "stageml_lora", [x, w, a, b], [k, n, rank, bits], base_ops + outer_ops + up_ops + inner_ops + down_ops


def _fits(x, w) -> bool:
    x_type, (k, n) = ir.RankedTensorType(x.type), ir.RankedTensorType(w.type).shape
    return x_type.rank == 2 and k % 8 == 0 and n % 8 == 0


def _dispatch(root, kernel: str, operands: list, constants: list) -> ir.Value:
    """flow.dispatch of `kernel` on `operands` (x first), with M and `constants` as i32."""
    x, result_type = operands[0], ir.RankedTensorType(root.results[0].type)
    element = str(result_type.element_type)
    index, i32 = ir.IndexType.get(), ir.IntegerType.get_signless(32)
    if ir.RankedTensorType(x.type).is_dynamic_dim(0):
        m = tensor.DimOp(x, arith.ConstantOp(index, 0).result).result
        dims = [m]
    else:
        m, dims = arith.ConstantOp(index, ir.RankedTensorType(x.type).shape[0]).result, []
    n = arith.ConstantOp(index, result_type.shape[1]).result
    pushed = [arith.IndexCastOp(i32, m).result] + [arith.ConstantOp(i32, c).result for c in constants]
    entry = ir.ArrayAttr.get([ir.SymbolRefAttr.get([EXECUTABLE, f"{kernel}_{element}"])])
    return flow.DispatchOp([result_type], [m, n], entry, operands + pushed, dims, dims,
                           tied_operands=ir.ArrayAttr.get([ir.IntegerAttr.get(index, -1)])).results[0]


def _rewrite(func, match) -> dict:
    """Replaces each op `match` recognizes in `func`; returns {kernel: count}."""
    counts = {}
    for op in list(func.regions[0].blocks[0].operations):
        found = match(op.operation)
        if found is None:
            continue
        kernel, operands, constants, ops = found
        root = op.operation
        with ir.InsertionPoint(root), root.location:
            root.results[0].replace_all_uses_with(_dispatch(root, kernel, operands, constants))
        for dead in [root] + [o for o in ops if o != root]:
            dead.erase()
        counts[kernel] = counts.get(kernel, 0) + 1
    return counts


def _match_lora(op):
    add = _elementwise(op.results[0], ["arith.addf", "linalg.yield"]) if len(op.results) == 1 else None
    if add is None or len(add.inputs) != 2:
        return None
    return _lora(*add.inputs) or _lora(*reversed(list(add.inputs)))


def _match_gemm(op):
    return _gemm(op.results[0]) if op.name == "linalg.generic" and len(op.results) == 1 else None


def use_custom_kernels(module: ir.Module) -> dict:
    """Rewrites every function of `module`; clones the kernels' declaration
    into it when one is used. Returns {kernel: count}."""
    counts = {}
    for op in module.body.operations:
        if op.operation.name in ("func.func", "util.func"):
            for match in (_match_lora, _match_gemm):
                for kernel, count in _rewrite(op.operation, match).items():
                    counts[kernel] = counts.get(kernel, 0) + count
    if counts:
        library = ir.Module.parse(LIBRARY.read_text())
        for op in library.body.operations:
            if op.operation.name == "hal.executable.source":
                op.operation.clone(ip=ir.InsertionPoint.at_block_begin(module.body))
    return counts
