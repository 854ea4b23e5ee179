"""use-custom-kernels: the residual's hot products become dispatches of
StageML's hand-written Hopper kernels (kernels.cu, declared in hopper.mlir).

On the IREE input (linalg on tensors), with T = f16 or bf16, K a static
multiple of 8 and N of 32:

  GEMM: a product accumulated in f32 and rounded to T once,
    %p = linalg.matmul ins(%x, %w : tensor<MxKxT>, tensor<KxNxT>) outs(%zero : tensor<MxNxf32>)
    %y = linalg.generic {arith.truncf} ins(%p)
  → %s = linalg.pack %w outer_dims_perm = [1, 0] inner_dims_pos = [1] inner_tiles = [32]
                       : tensor<KxNxT> -> tensor<N/32xKx32xT>
    %y = flow.dispatch @stageml_sm90::@stageml_gemm_T[%M, %N](%x, %s, M, K, N)

  LoRA: a base product plus a scaled rank-R product of the same rows (R <= 32),
    %y = linalg.generic {arith.addf} ins(GEMM(%x, %w), s2 * GEMM(s1 * GEMM(%x, %a), %b))
  → %y = flow.dispatch @stageml_sm90::@stageml_lora_T[%M, %N](%x, %s, %a, %b, M, K, N, R, bits(s1*s2))
    (s1, s2: optional constant scales; the kernel keeps x@a in f32 on chip)

  BGMV: fuse-gathers' per-row product of one-token rows, each row against
  its own slot of a factor table (multi-tenant @forward_factorized),
    %y = linalg.generic ins(%x : tensor<Bx1xKxT>, %ids : tensor<Bxi64>) outs(%zero : tensor<Bx1xNxf32>)
           { ... tensor.extract %table[%id, k, n] ... }
  → %y = flow.dispatch @stageml_sm90::@stageml_bgmv_T[%B, %N](%x, %ids, %table, B, K, N)

The GEMM and LoRA kernels read w in 32-column strips ([N/32, K, 32], kernels.cu), and that
layout work is earlier-stage work: the pack of a global weight follows its
load, where IREE's const-expr hoisting moves it to load time; the pack of
adapter state (an @forward argument marked stageml.adapter_result) moves
into @adapter, which returns it packed. A product against any other value
stays with IREE on the request path (@forward*), where a pack would cost a
pass over w per call; elsewhere (@adapter*) its pack is inline.

Every intermediate a match removes must have no other use. LoRA sites are
matched first, so their base products do not become GEMMs of their own.
"""

import dataclasses
import pathlib
import struct

from iree.compiler import ir
from iree.compiler.dialects import arith, flow, linalg, tensor

from stageml.compiler.fuse_gathers import fused_product
from stageml.compiler.adapter_state import adapter_result
from stageml.compiler.lowering import retype
from stageml.compiler.pack_weights import is_zero_fill

EXECUTABLE = "stageml_sm90"
LIBRARY = pathlib.Path(__file__).with_name("hopper.mlir")
MAX_RANK = 32
STRIP = 32  # columns of w per strip (kernels.cu)
_ELEMENT_TYPES = ("f16", "bf16")


@dataclasses.dataclass
class _Match:
    """A kernel call to replace `ops` (the last is the root whose result it takes)."""

    kernel: str          # without the _f16 / _bf16 suffix
    operands: list       # tensors, in the kernel's binding order
    constants: list      # i32 push constants after the row count
    ops: list            # producers first; erased last to first
    weight: int | None = 1  # the operand read in strips, if any


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
    return x, w, [matmul.operation, trunc.operation]


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


def _gemm(value) -> _Match | None:
    """A GEMM match of `value`, else None."""
    found = _product(value)
    if found is None or not _fits(*found[:2]):
        return None
    x, w, ops = found
    k, n = ir.RankedTensorType(w.type).shape
    return _Match("stageml_gemm", [x, w], [k, n], ops)


def _lora(base, adapted) -> _Match | None:
    """`base` + `adapted` as a LoRA site, else None."""
    base_found = _product(base)
    if base_found is None or not _fits(*base_found[:2]) or not _one_use(base) or not _one_use(adapted):
        return None
    x, w, base_ops = base_found
    inner, outer_scale, outer_ops = _scaled(adapted)
    up = _product(inner)
    if up is None:
        return None
    t, b, up_ops = up
    if not _one_use(t):  # x@A (scaled) is also used elsewhere: it must stay
        return None
    t, inner_scale, inner_ops = _scaled(t)
    down = _product(t)
    if down is None or down[0] != x:
        return None
    _, a, down_ops = down
    (k, n), (k_a, rank), (rank_b, n_b) = (ir.RankedTensorType(v.type).shape for v in (w, a, b))
    if (k_a, rank_b, n_b) != (k, rank, n) or rank > MAX_RANK:
        return None
    bits = struct.unpack("<i", struct.pack("<f", outer_scale * inner_scale))[0]
    return _Match("stageml_lora", [x, w, a, b], [k, n, rank, bits],
                  down_ops + inner_ops + up_ops + outer_ops + base_ops)


def _bgmv(op) -> _Match | None:
    """fuse-gathers' per-row product of one-token rows, f16 / bf16 into f32, else None."""
    found = fused_product(op)
    if found is None:
        return None
    x, ids, table = found
    x_type, table_type = ir.RankedTensorType(x.type), ir.RankedTensorType(table.type)
    if (str(x_type.element_type) not in _ELEMENT_TYPES or table_type.element_type != x_type.element_type
            or table_type.is_dynamic_dim(1) or table_type.is_dynamic_dim(2) or not is_zero_fill(op.operands[2])):
        return None  # (the slot count may be dynamic: the kernel trusts ids)
    _, k, n = table_type.shape
    return _Match("stageml_bgmv", [x, ids, table], [k, n], [op], weight=None)


def _fits(x, w) -> bool:
    x_type, (k, n) = ir.RankedTensorType(x.type), ir.RankedTensorType(w.type).shape
    return x_type.rank == 2 and k % 8 == 0 and n % STRIP == 0


class _Strips:
    """Each weight in the kernels' strip layout, packed once, off the request path."""

    def __init__(self, module: ir.Module):
        self.functions = {ir.StringAttr(op.attributes["sym_name"]).value: op.operation
                          for op in module.body.operations if op.operation.name == "func.func"}
        self.packed = {}  # weight -> its strips
        self.retyped = set()

    def __call__(self, w, func):
        """`w` packed into strips, or None where that would cost request time."""
        if w in self.packed:
            return self.packed[w]
        name = ir.StringAttr(func.attributes["sym_name"]).value
        result, adapter = adapter_result(func, w), self.functions.get(name.replace("forward", "adapter"))
        if result is not None and adapter is not None and _one_use(w):  # (its type changes for all uses)
            ret = list(adapter.regions[0].blocks[0].operations)[-1]
            with ir.InsertionPoint(ret), ret.location:
                ret.operands[result] = _pack(ret.operands[result])
            w.set_type(ret.operands[result].type)
            self.retyped.update([adapter, func])
            packed = w
        elif name.startswith("forward") and (isinstance(w.owner, ir.Block)
                                             or w.owner.operation.name != "util.global.load"):
            return None
        else:
            argument = isinstance(w.owner, ir.Block)
            with (ir.InsertionPoint.at_block_begin(w.owner) if argument else ir.InsertionPoint.after(w.owner)), \
                    func.location:
                packed = _pack(w)
        self.packed[w] = packed
        return packed


def _pack(w) -> ir.Value:
    """[K, N] → [N/32, K, 32]: 32-column strips, each stored whole."""
    (k, n), element = ir.RankedTensorType(w.type).shape, ir.RankedTensorType(w.type).element_type
    dest = tensor.EmptyOp([n // STRIP, k, STRIP], element).result
    return linalg.PackOp(dest.type, w, dest, [1], [], [STRIP], outer_dims_perm=[1, 0]).result


def _dynamic_dims(value) -> list:
    type_, index = ir.RankedTensorType(value.type), ir.IndexType.get()
    return [tensor.DimOp(value, arith.ConstantOp(index, i).result).result
            for i in range(type_.rank) if type_.is_dynamic_dim(i)]


def _dispatch(match: _Match, root) -> ir.Value:
    """flow.dispatch of `match`'s kernel for `root` (a linalg.generic): workload
    (rows, N), push constants (rows, *match.constants) as i32."""
    out = root.opview.outputs[0]
    result_type, index, i32 = ir.RankedTensorType(root.results[0].type), ir.IndexType.get(), ir.IntegerType.get_signless(32)
    result_dims = _dynamic_dims(out)
    rows = result_dims[0] if result_type.is_dynamic_dim(0) else arith.ConstantOp(index, result_type.shape[0]).result
    n = arith.ConstantOp(index, result_type.shape[-1]).result
    pushed = [arith.IndexCastOp(i32, rows).result] + [arith.ConstantOp(i32, c).result for c in match.constants]
    element = str(ir.RankedTensorType(match.operands[0].type).element_type)
    entry = ir.ArrayAttr.get([ir.SymbolRefAttr.get([EXECUTABLE, f"{match.kernel}_{element}"])])
    argument_dims = [d for v in match.operands for d in _dynamic_dims(v)]
    return flow.DispatchOp([result_type], [rows, n], entry, match.operands + pushed, argument_dims, result_dims,
                           tied_operands=ir.ArrayAttr.get([ir.IntegerAttr.get(index, -1)])).results[0]


def _rewrite(func, match, strips: _Strips) -> dict:
    """Replaces each op `match` recognizes in `func`; returns {kernel: count}."""
    counts = {}
    for op in list(func.regions[0].blocks[0].operations):
        found = match(op.operation)
        if found is None:
            continue
        if found.weight is not None:
            packed = strips(found.operands[found.weight], func)
            if packed is None:
                continue
            found.operands[found.weight] = packed
        root = op.operation
        with ir.InsertionPoint(root), root.location:
            root.results[0].replace_all_uses_with(_dispatch(found, root))
        for dead in reversed(found.ops):
            dead.erase()
        counts[found.kernel] = counts.get(found.kernel, 0) + 1
    return counts


def _match_lora(op):
    add = _elementwise(op.results[0], ["arith.addf", "linalg.yield"]) if len(op.results) == 1 else None
    if add is None or len(add.inputs) != 2:
        return None
    found = _lora(*add.inputs) or _lora(*reversed(list(add.inputs)))
    if found is not None:
        found.ops.append(op)
    return found


def _match_gemm(op):
    return _gemm(op.results[0]) if op.name == "linalg.generic" and len(op.results) == 1 else None


def _match_bgmv(op):
    return _bgmv(op) if op.name == "linalg.generic" else None


def use_custom_kernels(module: ir.Module) -> dict:
    """Rewrites every function of `module`; clones the kernels' declaration
    into it when one is used. Returns {kernel: count}."""
    counts, strips = {}, _Strips(module)
    for op in module.body.operations:
        if op.operation.name == "func.func":
            for match in (_match_lora, _match_gemm, _match_bgmv):
                for kernel, count in _rewrite(op.operation, match, strips).items():
                    counts[kernel] = counts.get(kernel, 0) + count
    for func in strips.retyped:
        retype(func)
    if counts:
        library = ir.Module.parse(LIBRARY.read_text())
        for op in library.body.operations:
            if op.operation.name == "hal.executable.source":
                op.operation.clone(ip=ir.InsertionPoint.at_block_begin(module.body))
    return counts
