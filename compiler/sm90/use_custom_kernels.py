"""use-custom-kernels: the residual's hot products become dispatches of
StageML's hand-written Hopper kernels (kernels.cu, declared in hopper.mlir),
or, with `lowering=reference`, calls of their CPU references (reference.mlir).

On the IREE input (linalg on tensors), with T = f16 or bf16 and, for the
kernels that read w in tiles (all but BGMV), K and N static multiples of 64:

  GEMM: a product accumulated in f32 and rounded to T once,
    %p = linalg.matmul ins(%x, %w : tensor<MxKxT>, tensor<KxNxT>) outs(%zero : tensor<MxNxf32>)
    %y = linalg.generic {arith.truncf} ins(%p)
  → %r = tensor.expand_shape %w [[0, 1], [2, 3, 4]] : tensor<KxNxT> into tensor<K/64x64xN/64x8x8xT>
    %s = linalg.transpose ins(%r) permutation = [2, 0, 3, 1, 4] -> tensor<N/64xK/64x8x64x8xT>
    %y = flow.dispatch @stageml_sm90::@stageml_gemm_T[%M, %N](%x, %s, M, K, N)
    or, where K % 256 = 0, the same dispatch of @stageml_gemm_wgmma_T
    (wgmma, clusters of 2 blocks: the halves of K, or column tiles sharing x; any M)

  LoRA: a base product plus a scaled rank-R product of the same rows (R <= 32),
    %y = linalg.generic {arith.addf} ins(GEMM(%x, %w), s2 * GEMM(s1 * GEMM(%x, %a), %b))
  → %y = flow.dispatch @stageml_sm90::@stageml_lora_T[%M, %N](%x, %s, %a, %b, M, K, N, R, bits(s1*s2))
    (s1, s2: optional constant scales; the kernel keeps x@a in f32 on chip)
    or, where K % 256 = 0, the multi-tenant path's kernels with the site's
    adapter as slot 0 of one-slot tables (on an H200, per 4096² r=16 layer,
    they take 21-50 µs at 1-256 rows in the tenant stack; stageml_lora 25-158),
    by the most rows x can have (the export's ranges, known when compiling):
  → %ids = linalg.fill 0 : tensor<Mxi64>
    at most 128:
    %y, %ws = flow.dispatch @stageml_sm90::@stageml_gemm_lora_T[%M, %N](%x, %s, %ids,
           expand_shape %a : 1xKxR, expand_shape %b : 1xRxN, M, K, N, R, M, bits(s1*s2), site)
    else:
    %t = flow.dispatch @stageml_sm90::@stageml_bgmv_T[%M, %R](expand_shape %x : Mx1xK, %ids,
           expand_shape %a : 1xKxR, M, K, R)
    %t2 = linalg.generic {arith.mulf %t, s1*s2}   (where s1*s2 != 1; where b is adapter
           state used once, its adapter function multiplies b instead, at load, and
           stageml_gemm_lora's scale is 1)
    %y = flow.dispatch @stageml_sm90::@stageml_gemm_expand_T[%M, %N](%x, %s, %t2, %ids,
           expand_shape %b : 1xRxN, M, K, N, R, M)

  BGMV: fuse-gathers' per-row product of one-token rows, each row against
  its own slot of a factor table (multi-tenant, program "factorized"),
    %y = linalg.generic ins(%x : tensor<Bx1xKxT>, %ids : tensor<Bxi64>) outs(%zero : tensor<Bx1xNxf32>)
           { ... tensor.extract %table[%id, k, n] ... }
  → %y = flow.dispatch @stageml_sm90::@stageml_bgmv_T[%B, %N](%x, %ids, %table, B, K, N)
    (any K and N)

  Expand: a multi-tenant site, the base product plus the expand of each
  row's own adapter, the BGMV of its rounded shrink t (f32, rows [M, 1, R])
  by the slot table B [S, R, N], rounded and collapsed, where K % 256 = 0,
    %t16 = linalg.generic {arith.truncf} ins(%t)
    %l = BGMV(%t16, %ids, %b)
    %l16 = linalg.generic {arith.truncf} ins(%l)
    %y = linalg.generic {arith.addf} ins(GEMM(%x, %w), tensor.collapse_shape(%l16))
  → %y = flow.dispatch @stageml_sm90::@stageml_gemm_expand_T[%M, %N](%x, %s, %t, %ids, %b, M, K, N, R, rows)
    (rows: the ids' count; the kernel adds t @ b[ids[m]] to each row's product
    in its epilogue). Where t is the BGMV of the same rows by the same ids
    (%t = BGMV(expand_shape %x, %ids, %a), used once, R <= 32), the site's
    shrink goes with it, by the most rows x can have (the export's ranges, known
    when compiling; no branch at run time): up to 128 rows all of it is one
      %y, %ws = flow.dispatch @stageml_sm90::@stageml_gemm_lora_T[%M, %N](%x, %s, %ids, %a, %b,
             M, K, N, R, rows, bits(1.0), site)
    (%ws: the kernel's scratch, [ceil(K / kc), M, R] f32, which nothing reads;
    site: the call's number in the module, kernels.cu's counter slot), more or
    unbounded, the shrink is its own BGMV dispatch and the base product stageml_gemm_expand
    as above. On rows of T tokens (fuse-gathers{multi-token}: the
    per-row products on the B*T token rows) the products reach the add
    [B, T, N] through reshapes of their rows; the kernel then computes the
    [B*T, N] token rows, reshaped to [B, T, N]. The kernel reads t in f32
    and rounds y once, where the input rounds t, l and y to T: its result is
    the more accurate one, and differs from the input's by those roundings.
    A shrink that is no such BGMV stays (a BGMV of its own).

  lowering=reference: each `flow.dispatch @stageml_sm90::@K(operands)` above
  is instead
    %y = tensor.cast(func.call @K_reference(tensor.cast(operands)))
  with the same operands, tiles and push constants, and @K_reference
  (reference.mlir, the kernel's semantics in linalg) is cloned into the
  module with the functions it calls: the matcher's output then runs on
  IREE's CPU backend.

The GEMM, LoRA and expand kernels read w in tiles ([N/64, K/64, 8, 64, 8],
w[tn, tk, s, kk, c] = W[64 tk + kk, 64 tn + 8 s + c]: 64x64 tiles, the
k-tiles of a column tile contiguous, each tile 8 strips of 8 columns stored
whole), and that layout work is earlier-stage work: the pack of a global
weight follows its load, where IREE's const-expr hoisting moves it to load
time; the pack of adapter state (an argument with `bt.result = i`, the i-th
result of the function with `bt.stage = "adapter"` and the same
`bt.program`) moves into that adapter function, which returns it packed,
when the kernel is the argument's one use (its type changes for all uses).
On the request path (a function with `bt.stage = "dynamic"`) a product
against any other value stays with IREE, as its pack would cost a pass over
w per call; anywhere else the pack is inline. Each weight is packed once.

Every intermediate a match removes must have no other use. The input is
expected CSE'd (the products of one LoRA site share their rows' SSA value).

The rewrites are patterns of the MLIR bindings (`RewritePatternSet`), all
rooted at `linalg.generic` and applied by the greedy driver, which also
erases the ops a match left dead. Their benefits (LoRA and expand 3, GEMM 2,
BGMV 1) order them only on one root op, and no two share one: a site's
root is its add (a LoRA site's adds two products, a multi-tenant site's a
product and a collapse), while the products inside it are GEMM and BGMV
roots of their own, visited in whatever order the driver takes. So the GEMM
and BGMV patterns decline a product that a site which will be rewritten
consumes (a multi-tenant site consumes its base product and its expand, and
its shrink where the site's rewrite takes it); that, not the benefit, makes
the site win whatever the order.
The tiles (packed once per weight) and the adapter functions whose results
change are state the patterns share (`_Tiles`), and function types are set
after the driver finishes.
"""

import dataclasses
import pathlib
import struct

from iree.compiler import ir
from iree.compiler import rewrite
from iree.compiler.dialects import arith, flow, func as func_d, linalg, tensor

from stageml.compiler import facts
from stageml.compiler.passes import register
from stageml.compiler.passes.fuse_gathers import dims_of, expanded, fused_product
from stageml.compiler.residual_ir import defining_op, dim_bound, is_zero_fill, retype
from stageml.compiler.sm90 import EXECUTABLE, HOPPER
from stageml.errors import CompileError

REFERENCES = pathlib.Path(__file__).with_name("reference.mlir")
REFERENCE_OF = "stageml.reference_of"  # reference.mlir: the kernel a function is the reference of
REFERENCE_PART = "stageml.reference_part"  # reference.mlir: a part several references share
MAX_RANK = 32
LORA_MAX_ROWS = 128  # rows at most this: a LoRA site by stageml_gemm_lora, one kernel (see the doc)
SHRINK_A_BYTES = 14336  # stageml_gemm_lora's shrink units: at most this many bytes of a's rows (kernels.cu)
TILE, STRIP = 64, 8  # w's tiles: 64x64 of W, each 8 strips of 8 columns (kernels.cu)
# (K, N) multiples each kernel that reads tiles needs (kernels.cu's guarantees)
ALIGN = {"stageml_gemm": (64, 64), "stageml_lora": (64, 64), "stageml_gemm_wgmma": (256, 64),
         "stageml_gemm_expand": (256, 64)}
LOWERINGS = ("dispatch", "reference")
_ELEMENT_TYPES = ("f16", "bf16")


@dataclasses.dataclass(frozen=True)
class UseCustomKernelsOptions:
    """lowering: "dispatch" (flow.dispatch of the kernel) or "reference" (func.call of its CPU reference)."""

    lowering: str = "dispatch"

    def __post_init__(self):
        if self.lowering not in LOWERINGS:
            raise CompileError(f"use-custom-kernels: lowering={self.lowering!r} is unknown: "
                               f"choose {' or '.join(LOWERINGS)}")


@dataclasses.dataclass
class _Match:
    """A kernel call to replace `root` (the op whose result it takes)."""

    kernel: str          # without the _f16 / _bf16 suffix
    operands: list       # tensors, in the kernel's binding order
    constants: list      # i32 push constants after the row count: ints, or a tensor for its row count
    weight: int | None = 1  # the operand read in tiles, if any
    rows: ir.Value | None = None  # a site reached through reshapes of its rows: the [M, K] x whose rows
                                  # the kernel computes, its [M, N] result then reshaped to the root's
    shrink: float | None = None   # a one-adapter LoRA site by the expand kernel: operands [x, w, a, b], the
                                  # rewrite adds the shrink x @ a times this scale (BGMV over zero ids)
    tenant_shrink: "_Match | None" = None  # a multi-tenant site's shrink (its BGMV), which the rewrite takes
    tenant_shrink_root: object = None      # ... and the per-row product it replaces
    scratch: list | None = None   # stageml_gemm_lora: the shape of its scratch result (f32, [C, rows, R])


# -- matching -------------------------------------------------------------------

def _pointwise(op):
    """`op` as a linalg.generic when it is elementwise (every map its output's permutation), else None."""
    if op.name != "linalg.generic":
        return None
    generic = op.opview
    maps = [ir.AffineMapAttr(m).value for m in generic.indexing_maps]
    if any(not m.is_permutation or list(m.results) != list(maps[-1].results) for m in maps):
        return None
    return generic


def _elementwise(value, body: list):
    """The linalg.generic defining `value` when it is elementwise with ops `body`, else None."""
    op = defining_op(value)
    generic = None if op is None else _pointwise(op)
    if generic is None or [o.operation.name for o in generic.regions[0].blocks[0].operations] != body:
        return None
    return generic


def _one_use(value) -> bool:
    return len(list(value.uses)) == 1


def _product(value):
    """(x, w) when `value` = truncf(matmul(x, w) into a zero f32 fill), the matmul used once."""
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
    return x, w


def _scaled(value):
    """(inner, s) when `value` = inner * a constant s, inner used once, else (value, 1.0)."""
    mul = _elementwise(value, ["arith.mulf", "linalg.yield"])
    if mul is None or len(mul.inputs) != 1 or not _one_use(mul.inputs[0]):
        return value, 1.0
    block = mul.regions[0].blocks[0]
    operands = list(list(block.operations)[0].operation.operands)
    constants = [v for v in operands if v != block.arguments[0]]
    if len(constants) != 1 or isinstance(constants[0].owner, ir.Block) \
            or constants[0].owner.operation.name != "arith.constant":
        return value, 1.0
    return mul.inputs[0], ir.FloatAttr(constants[0].owner.operation.attributes["value"]).value


def _fits(kernel: str, x, w) -> bool:
    """Whether `kernel` takes x @ w: x a matrix, w's K and N the multiples `kernel` needs."""
    (k, n), (k_multiple, n_multiple) = ir.RankedTensorType(w.type).shape, ALIGN[kernel]
    return ir.RankedTensorType(x.type).rank == 2 and k % k_multiple == 0 and n % n_multiple == 0


def _gemm(op) -> _Match | None:
    """A GEMM match of `op` (the truncf of a product), else None: the wgmma
    kernel where it fits, else the general one."""
    if len(op.results) != 1:
        return None
    found = _product(op.results[0])
    if found is None or not _fits("stageml_gemm", *found):
        return None
    x, w = found
    k, n = ir.RankedTensorType(w.type).shape
    kernel = "stageml_gemm_wgmma" if _fits("stageml_gemm_wgmma", x, w) else "stageml_gemm"
    return _Match(kernel, [x, w], [k, n])


def _lora_of(base, adapted) -> _Match | None:
    """`base` + `adapted` as a LoRA site, else None."""
    base_found = _product(base)
    if base_found is None or not _fits("stageml_lora", *base_found) or not _one_use(base) or not _one_use(adapted):
        return None
    x, w = base_found
    inner, outer_scale = _scaled(adapted)
    up = _product(inner)
    if up is None:
        return None
    t, b = up
    if not _one_use(t):  # x@A (scaled) is also used elsewhere: it must stay
        return None
    t, inner_scale = _scaled(t)
    down = _product(t)
    if down is None or down[0] != x:
        return None
    a = down[1]
    (k, n), (k_a, rank), (rank_b, n_b) = (ir.RankedTensorType(v.type).shape for v in (w, a, b))
    if (k_a, rank_b, n_b) != (k, rank, n) or rank > MAX_RANK:
        return None
    if _fits("stageml_gemm_expand", x, w):  # the tenant path's kernels (faster on an H200: see the doc)
        return _Match("stageml_gemm_expand", [x, w, a, b], [k, n, rank, x], shrink=outer_scale * inner_scale)
    bits = struct.unpack("<i", struct.pack("<f", outer_scale * inner_scale))[0]
    return _Match("stageml_lora", [x, w, a, b], [k, n, rank, bits])


def _site(op, match_of) -> _Match | None:
    """`match_of(a, b)` or else `match_of(b, a)` when `op` is the add a + b, else None."""
    add = _elementwise(op.results[0], ["arith.addf", "linalg.yield"]) if len(op.results) == 1 else None
    if add is None or len(add.inputs) != 2:
        return None
    return match_of(*add.inputs) or match_of(*reversed(list(add.inputs)))


def _lora(op) -> _Match | None:
    """A LoRA match of `op` (the add of a site), else None."""
    return _site(op, _lora_of)


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
    return _Match("stageml_bgmv", [x, ids, table], [k, n], weight=None)


def _rounded(value, element):
    """v when `value` = truncf(v) to `element`, `value` used once, else None."""
    trunc = _elementwise(value, ["arith.truncf", "linalg.yield"])
    if (trunc is None or len(trunc.inputs) != 1 or not _one_use(value)
            or ir.RankedTensorType(value.type).element_type != element):
        return None
    return trunc.inputs[0]


def _one_token(value, n) -> bool:
    """Whether `value` is [B, 1, n] (rows of one token)."""
    return ir.RankedTensorType(value.type).shape[1:] == [1, n]


_RESHAPES = ("tensor.collapse_shape", "tensor.expand_shape", "tensor.reshape")


def _unreshaped(value):
    """The value `value` reshapes, through reshapes that keep its last dimension
    (so only regroup its rows, in row-major order) and whose results have one
    use besides queries of their sizes, else `value`."""
    last = ir.RankedTensorType(value.type).shape[-1]
    while True:
        op = defining_op(value)
        if (op is None or op.name not in _RESHAPES
                or len([u for u in value.uses if u.owner.operation.name != "tensor.dim"]) != 1):
            return value
        source = op.operands[0]
        source_type = ir.RankedTensorType(source.type)
        if source_type.is_dynamic_dim(source_type.rank - 1) or source_type.shape[-1] != last:
            return value
        value = source


def _same_rows(a, b, depth: int = 3) -> bool:
    """Whether `a` and `b` are one value, or reshapes / broadcasts (the same op, attributes and
    type) of such values: the per-token ids fuse-gathers{multi-token} builds for each of a
    site's products, which CSE leaves apart."""
    if a == b:
        return True
    op_a, op_b = defining_op(a), defining_op(b)
    if (depth == 0 or op_a is None or op_b is None or op_a.name != op_b.name or a.type != b.type
            or op_a.name not in (*_RESHAPES, "linalg.broadcast")):
        return False
    attributes = [{name: op.attributes[name] for name in op.attributes} for op in (op_a, op_b)]
    return attributes[0] == attributes[1] and _same_rows(op_a.operands[0], op_b.operands[0], depth - 1)


def _expand_of(base, adapted) -> _Match | None:
    """`base` + `adapted` as a multi-tenant site's base product and its LoRA
    expand (the per-row product of its rounded shrink t), else None. Rows of
    several tokens reach the add through reshapes of the products' rows
    (fuse-gathers{multi-token}); the kernel then computes the token rows."""
    flat = _unreshaped(base)
    base_found = _product(flat)
    if (base_found is None or not _fits("stageml_gemm_expand", *base_found) or not _one_use(flat)
            or not _one_use(adapted)):
        return None
    x, w = base_found
    (k, n), element = ir.RankedTensorType(w.type).shape, ir.RankedTensorType(x.type).element_type
    # one token: adapted = collapse(truncf(l)); several: truncf(reshapes of l)
    low_rank = _rounded(_unreshaped(adapted), element)
    low_rank = None if low_rank is None else _unreshaped(low_rank)
    product = None if low_rank is None or not _one_use(low_rank) or not _one_token(low_rank, n) \
        else defining_op(low_rank)
    expand = None if product is None else _bgmv(product)
    if expand is None:
        return None
    t16, ids, table = expand.operands
    (_, rank, n_table), t = ir.RankedTensorType(table.type).shape, _rounded(_unreshaped(t16), element)
    t = None if t is None else _unreshaped(t)
    if (t is None or not isinstance(ir.RankedTensorType(t.type).element_type, ir.F32Type)
            or not _one_token(t, rank) or rank < 1 or n_table != n):
        return None
    if flat is not base and ir.RankedTensorType(base.type).rank != 3:
        return None  # (rows of several tokens: [B, T, N])
    found = _Match("stageml_gemm_expand", [x, w, t, ids, table], [k, n, rank, ids], rows=None if flat is base else x)
    shrink_root = defining_op(t)
    shrink = None if shrink_root is None or not _one_use(t) else _bgmv(shrink_root)
    if (shrink is not None and _same_rows(shrink.operands[1], ids)
            and _unreshaped(shrink.operands[0]) == _unreshaped(x) and rank <= MAX_RANK):
        found.tenant_shrink, found.tenant_shrink_root = shrink, shrink_root
    return found


def _expand(op) -> _Match | None:
    """A multi-tenant site's match of `op` (its add), else None."""
    return _site(op, _expand_of)


def _site_of(value):
    """(the add of the site (LoRA, or a base product with its expand) that
    `value` (a product's result) flows into alone, whether the walk passed a
    per-row product), else (None, False).

    A site's products reach its add through single uses: the base directly;
    a LoRA site's x@A through its scaling, x@A@B's matmul, truncf and
    scaling; a multi-tenant site's expand through its truncf and the
    collapse of the unit dimension (its products, on rows of several tokens,
    also through the reshapes of their rows); its shrink through its truncf
    and the expand, a per-row product."""
    through = False
    for _ in range(8):
        if not _one_use(value):
            return None, False
        user = list(value.uses)[0].owner.operation
        per_row = fused_product(user) is not None
        if (user.name not in ("linalg.matmul", *_RESHAPES) and _pointwise(user) is None and not per_row) \
                or len(user.results) != 1:
            return None, False
        if _elementwise(user.results[0], ["arith.addf", "linalg.yield"]) is not None:
            return user, through
        value, through = user.results[0], through or per_row
    return None, False


# -- the tiles --------------------------------------------------------------------

class _Tiles:
    """Each weight in the kernels' tile layout, packed once, off the request path; and other
    work on adapter state moved into its adapter function."""

    def __init__(self, module_op):
        self.module_op = module_op
        self.packed = {}      # weight -> its tiles
        self.retyped = []     # functions whose arguments or results changed type

    def _adapter(self, w, func):
        """(the adapter function, its result) that `w`, an argument of `func`, is and may be changed in."""
        result, program = facts.adapter_result(func, w), facts.get(func, facts.PROGRAM)
        if result is None or program is None or not _one_use(w):  # (its type changes for all uses)
            return None
        adapter = facts.stage_function(self.module_op, "adapter", program)
        return None if adapter is None else (adapter, result)

    def available(self, w, func) -> bool:
        """Whether `w` is packed or may be packed without costing request time."""
        return (w in self.packed or self._adapter(w, func) is not None
                or facts.get(func, facts.STAGE) != "dynamic"
                or (not isinstance(w.owner, ir.Block) and w.owner.operation.name == "util.global.load"))

    def __call__(self, w, func) -> ir.Value:
        """`w` packed into tiles (call `available` first)."""
        if w in self.packed:
            return self.packed[w]
        if self.in_adapter(w, func, _pack):
            packed = w
        else:
            argument = isinstance(w.owner, ir.Block)
            with (ir.InsertionPoint.at_block_begin(w.owner) if argument else ir.InsertionPoint.after(w.owner)), \
                    func.location:
                packed = _pack(w)
        self.packed[w] = packed
        return packed

    def in_adapter(self, w, func, transform) -> bool:
        """Whether `w` (an argument of `func`) is adapter state that now comes `transform`ed from
        its adapter function (the argument's type follows), else nothing changes."""
        adapter = self._adapter(w, func)
        if adapter is None:
            return False
        adapter, result = adapter
        ret = list(adapter.regions[0].blocks[0].operations)[-1]
        with ir.InsertionPoint(ret), ret.location:
            ret.operands[result] = transform(ret.operands[result])
        w.set_type(ret.operands[result].type)
        self.retyped += [f for f in (adapter, func) if f not in self.retyped]
        return True


def _pack(w) -> ir.Value:
    """W [K, N] → w [N/64, K/64, 8, 64, 8], w[tn, tk, s, kk, c] = W[64 tk + kk, 64 tn + 8 s + c]:
    64x64 tiles, the k-tiles of a column tile contiguous, each tile 8 strips
    of 8 columns stored whole. W split to [K/64, 64, N/64, 8, 8], then transposed."""
    (k, n), element = ir.RankedTensorType(w.type).shape, ir.RankedTensorType(w.type).element_type
    split = [k // TILE, TILE, n // TILE, TILE // STRIP, STRIP]
    parts = tensor.ExpandShapeOp(ir.RankedTensorType.get(split, element), w, [[0, 1], [2, 3, 4]], [], split).result
    permutation = [2, 0, 3, 1, 4]
    dest = tensor.EmptyOp([split[i] for i in permutation], element).result
    return linalg.transpose(parts, outs=[dest], permutation=permutation).results[0]


# -- the replacements -------------------------------------------------------------

def _dynamic_dims(value) -> list:
    type_, index = ir.RankedTensorType(value.type), ir.IndexType.get()
    return [tensor.DimOp(value, arith.ConstantOp(index, i).result).result
            for i in range(type_.rank) if type_.is_dynamic_dim(i)]


def _rows(value, dims: list) -> ir.Value:
    """`value`'s row count (dim 0, index), `dims` its dynamic dims."""
    type_ = ir.RankedTensorType(value.type)
    return dims[0] if type_.is_dynamic_dim(0) else arith.ConstantOp(ir.IndexType.get(), type_.shape[0]).result


def _push(constant) -> ir.Value:
    """A push constant (i32): an int, or a tensor's row count."""
    i32 = ir.IntegerType.get_signless(32)
    if isinstance(constant, int):
        return arith.ConstantOp(i32, constant).result
    return arith.IndexCastOp(i32, _rows(constant, _dynamic_dims(constant))).result


def _shrink_chunks(k: int, rank: int) -> int:
    """stageml_gemm_lora's shrink chunks of K (kernels.cu): units of at most 1024 k-rows and
    SHRINK_A_BYTES of a's rows, a multiple of 32 k-rows."""
    rows = min(1024, SHRINK_A_BYTES // (2 * rank) // 32 * 32)
    return -(-k // rows)


def _kernel_call(match: _Match, out, result_type, lowering: str, references: dict) -> ir.Value:
    """The kernel's result (`result_type`, shaped as `out`) at the current insertion point:
    workload (rows, N), push constants (rows, *match.constants) as i32; a kernel with scratch
    (match.scratch) has it as a second result, which nothing reads."""
    index, i32 = ir.IndexType.get(), ir.IntegerType.get_signless(32)
    result_dims = _dynamic_dims(out)
    rows = _rows(out, result_dims)
    pushed = [arith.IndexCastOp(i32, rows).result] + [_push(c) for c in match.constants]
    kernel = f"{match.kernel}_{ir.RankedTensorType(match.operands[0].type).element_type}"
    if lowering == "reference":
        callee = references[kernel]
        inputs = ir.FunctionType(ir.TypeAttr(callee.attributes["function_type"]).value).inputs
        operands = [v if v.type == t else tensor.CastOp(t, v).result for v, t in zip(match.operands, inputs)]
        call = func_d.CallOp(callee, operands + pushed)
        return tensor.CastOp(result_type, call.results[0]).result
    n = arith.ConstantOp(index, result_type.shape[-1]).result
    entry = ir.ArrayAttr.get([ir.SymbolRefAttr.get([EXECUTABLE, kernel])])
    argument_dims = [d for v in match.operands for d in _dynamic_dims(v)]
    result_types = [result_type]
    if match.scratch is not None:
        result_types.append(ir.RankedTensorType.get(
            [ir.ShapedType.get_dynamic_size() if isinstance(d, ir.Value) else d for d in match.scratch], ir.F32Type.get()))
        result_dims += [d for d in match.scratch if isinstance(d, ir.Value)]
    untied = ir.ArrayAttr.get([ir.IntegerAttr.get(index, -1)] * len(result_types))
    return flow.DispatchOp(result_types, [rows, n], entry, match.operands + pushed, argument_dims, result_dims,
                           tied_operands=untied).results[0]


def _times(value, scale: float) -> ir.Value:
    """`value` times the constant `scale`, elementwise, in its element type."""
    type_ = ir.RankedTensorType(value.type)
    identity = ir.AffineMapAttr.get(ir.AffineMap.get_identity(type_.rank))
    parallel = ir.Attribute.parse("#linalg.iterator_type<parallel>")
    out = tensor.EmptyOp(dims_of(value), type_.element_type).result
    generic = linalg.GenericOp([type_], [value], [out], ir.ArrayAttr.get([identity, identity]),
                               ir.ArrayAttr.get([parallel] * type_.rank))
    block = generic.regions[0].blocks.append(type_.element_type, type_.element_type)
    with ir.InsertionPoint(block):
        factor = arith.ConstantOp(type_.element_type, scale).result
        linalg.YieldOp([arith.MulFOp(block.arguments[0], factor).result])
    return generic.results[0]


def _function(op):
    while op is not None and op.name != "func.func":
        op = op.parent
    return op


class _Rewriter:
    """The four patterns and the state they share."""

    def __init__(self, module_op, lowering: str):
        self.module_op, self.lowering = module_op, lowering
        self.tiles = _Tiles(module_op)
        self.references = {}  # kernel -> its reference function (lowering=reference), cloned on first use
        self.library = None   # reference.mlir, parsed on the first clone
        self.counts = {}
        self.sites = 0  # stageml_gemm_lora calls made: each one's push constant `site` is their count before it

    def patterns(self) -> rewrite.FrozenRewritePatternSet:
        patterns = rewrite.RewritePatternSet()
        patterns.add("linalg.generic", lambda op, rw: self._apply(op, rw, _lora), 3)
        patterns.add("linalg.generic", lambda op, rw: self._apply(op, rw, _expand), 3)
        patterns.add("linalg.generic", lambda op, rw: self._apply(op, rw, self._gemm), 2)
        patterns.add("linalg.generic", lambda op, rw: self._apply(op, rw, self._bgmv), 1)
        return patterns.freeze()

    def _gemm(self, op):
        """A GEMM match, unless the product belongs to a site that will be rewritten."""
        found = _gemm(op)
        return None if found is None or self._in_site(op) else found

    def _bgmv(self, op):
        """A BGMV match, unless the product is the expand of a site that will be rewritten."""
        found = _bgmv(op)
        return None if found is None or self._in_site(op) else found

    def _in_site(self, op) -> bool:
        """Whether `op`'s product belongs to a site (LoRA, or a base product with its expand) that
        will be rewritten: a multi-tenant site's shrink only where the site's rewrite takes it."""
        site, shrink = _site_of(op.results[0])
        if site is None:
            return False
        func = _function(site)
        return any(found is not None and self.tiles.available(found.operands[found.weight], func)
                   and (not shrink or found.tenant_shrink_root == op)
                   for found in (_lora(site), _expand(site)))

    def _apply(self, op, rewriter, match) -> bool:
        """Rewrites `op` when `match` finds a kernel; False on success (the bindings' convention)."""
        root = op.operation
        func = _function(root)
        if func is None or _is_reference(func):
            return True
        found = match(root)
        if found is None:
            return True
        if found.weight is not None:
            if not self.tiles.available(found.operands[found.weight], func):
                return True
            found.operands[found.weight] = self.tiles(found.operands[found.weight], func)
        with rewriter.ip, root.location:
            out = root.opview.outputs[0] if found.rows is None else found.rows
            result_type = ir.RankedTensorType(root.results[0].type)
            if found.rows is not None:  # the kernel's [M, N] rows, reshaped to the root's at the end
                result_type = ir.RankedTensorType.get([ir.RankedTensorType(out.type).shape[0],
                                                       result_type.shape[-1]], result_type.element_type)
            if found.shrink is not None or found.tenant_shrink is not None:
                result = self._lora_site(found, func, out, result_type)
            else:
                result = self._call(found, out, result_type)
            if found.rows is not None:
                result = expanded(result, [[0, 1], [2]], dims_of(root.opview.outputs[0]))
        rewriter.replace_op(root, [result])
        return False

    def _call(self, match: _Match, out, result_type) -> ir.Value:
        """`_kernel_call` of `match`, counted, its reference cloned in first where lowering=reference."""
        if self.lowering == "reference":
            self._reference(f"{match.kernel}_{ir.RankedTensorType(match.operands[0].type).element_type}")
        self.counts[match.kernel] = self.counts.get(match.kernel, 0) + 1
        return _kernel_call(match, out, result_type, self.lowering, self.references)

    def _lora_site(self, match: _Match, func, out, result_type) -> ir.Value:
        """A LoRA site with its shrink, by the most rows its input can have (the export's
        ranges, residual_ir.dim_bound): up to LORA_MAX_ROWS one stageml_gemm_lora, else the
        shrink's BGMV and then stageml_gemm_expand (as measured on an H200 per 4096² site, the one
        kernel takes 0.7-1.6 µs less at 1-32 rows, 1.6-2.3 µs more at 128 and 10 µs more at 256,
        and a call one dispatch less a site: benchmarks/results/h200-2026-12-04-fused-lora.md),
          %y, %ws = flow.dispatch @stageml_gemm_lora_T(%x, %s, %ids, %a, %b, M, K, N, R, rows, bits(scale), site)
        or
          %t = flow.dispatch @stageml_bgmv_T(expand_shape %x : Mx1xK, %ids, %a)
          %y = flow.dispatch @stageml_gemm_expand_T(%x, %s, %t, %ids, %b, M, K, N, R, rows)
        The choice is made here, not by a branch on the rows at run time: IREE 3.13 submits each
        branch of an scf.if around dispatches on its own, which cost more than the kernel saves.
        A multi-tenant site's shrink is its own per-row product (which goes). A one-adapter site
        [x, w, a, b] takes its adapter as slot 0 of one-slot tables, every row's id 0:
          %ids = linalg.fill 0 : tensor<Mxi64>
        and its scale (where not 1) multiplies b in its adapter function where b is adapter state
        used once (in T, at load), else t on the request path (in f32: the push constant scale of
        stageml_gemm_lora, a linalg.generic {arith.mulf %t, scale} before stageml_gemm_expand)."""
        x, w = match.operands[:2]
        rows, k = dims_of(x)
        scale = 1.0
        if match.tenant_shrink is not None:
            x3, ids, a = match.tenant_shrink.operands
            b = match.operands[-1]
        else:
            a, b = match.operands[2:]
            (_, rank), (_, n) = ir.RankedTensorType(a.type).shape, ir.RankedTensorType(b.type).shape
            if match.shrink != 1.0 and not self.tiles.in_adapter(b, func, lambda v: _times(v, match.shrink)):
                scale = match.shrink
            i64 = ir.IntegerType.get_signless(64)
            ids = linalg.fill(arith.ConstantOp(i64, 0).result, outs=[tensor.EmptyOp([rows], i64).result])
            x3, a, b = (expanded(x, [[0, 1], [2]], [rows, 1, k]), expanded(a, [[0, 1], [2]], [1, k, rank]),
                        expanded(b, [[0, 1], [2]], [1, rank, n]))
        _, rank, n = ir.RankedTensorType(b.type).shape
        bound = dim_bound(x, 0)
        if bound is not None and bound <= LORA_MAX_ROWS:
            bits = struct.unpack("<i", struct.pack("<f", scale))[0]
            lora = _Match("stageml_gemm_lora", [x, w, ids, a, b], [k, n, rank, ids, bits, self.sites],
                          weight=None, scratch=[_shrink_chunks(k, rank), rows, rank])
            self.sites += 1
            return self._call(lora, out, result_type)
        shrink = _Match("stageml_bgmv", [x3, ids, a], [k, rank], weight=None)
        t_out = tensor.EmptyOp([rows, 1, rank], ir.F32Type.get()).result
        t = self._call(shrink, t_out, t_out.type)
        if scale != 1.0:
            t = _times(t, scale)
        return self._call(_Match("stageml_gemm_expand", [x, w, t, ids, b], [k, n, rank, ids]), out, result_type)

    def _reference(self, kernel: str) -> None:
        """Clones `kernel`'s reference function into the module (once), with the functions it calls."""
        if kernel in self.references:
            return
        present = _references(self.module_op.regions[0].blocks[0])
        if kernel in present:  # (cloned as another's callee, or by an earlier rewrite, with what it calls)
            self.references[kernel] = present[kernel].opview
            return
        if self.library is None:
            self.library = ir.Module.parse(REFERENCES.read_text(), context=self.module_op.context)
        library = _references(self.library.body)
        if kernel not in library:
            raise CompileError(f"{REFERENCES.name} has no reference of {kernel}")  # (an internal bug)
        self.references[kernel] = self._clone(facts.symbol(library[kernel]))

    def _clone(self, symbol: str):
        """reference.mlir's function `symbol` in the module, cloned in once with the functions it calls."""
        body = self.module_op.regions[0].blocks[0]
        present = _functions(body)
        if symbol in present:
            return present[symbol]
        source = _functions(self.library.body)[symbol]
        clone = source.clone(ip=ir.InsertionPoint(body))
        for callee in _callees(source):
            self._clone(callee)
        return clone


def _is_reference(func) -> bool:
    """Whether `func` comes from reference.mlir (a kernel's reference or a part of some): no pattern rewrites it."""
    return REFERENCE_OF in func.attributes or REFERENCE_PART in func.attributes


def _functions(block) -> dict:
    """{symbol: function} of the functions in `block`."""
    return {facts.symbol(op.operation): op.operation for op in block.operations if op.operation.name == "func.func"}


def _references(block) -> dict:
    """{kernel: its reference function} of the functions in `block`."""
    return {facts.get(op.operation, REFERENCE_OF): op.operation for op in block.operations
            if op.operation.name == "func.func" and REFERENCE_OF in op.operation.attributes}


def _callees(func) -> list:
    """The symbols `func` calls (func.call), in order."""
    callees = []

    def visit(op):
        if op.name == "func.call":
            callees.append(ir.FlatSymbolRefAttr(op.attributes["callee"]).value)
        return ir.WalkResult.ADVANCE

    func.walk(visit)
    return callees


def use_custom_kernels(module, lowering: str = "dispatch") -> dict:
    """Rewrites every function of `module` (an ir.Module or its operation);
    clones the kernels' declaration (lowering="dispatch") or the references
    used (lowering="reference") into it. Returns {kernel: count}."""
    module_op = getattr(module, "operation", module)
    rewriter = _Rewriter(module_op, lowering)
    config = rewrite.GreedyRewriteConfig()
    config.enable_folding = False
    config.enable_constant_cse = False
    config.region_simplification_level = rewrite.GreedySimplifyRegionLevel.DISABLED
    patterns = rewriter.patterns()
    functions = [op.operation for op in module_op.regions[0].blocks[0].operations
                 if op.operation.name == "func.func" and not _is_reference(op.operation)]
    for func in functions:
        rewrite.apply_patterns_and_fold_greedily(func, patterns, config)
    for func in rewriter.tiles.retyped:
        retype(func)
    if rewriter.counts and lowering == "dispatch" and not _has_executable(module_op):
        library = ir.Module.parse(HOPPER.read_text(), context=module_op.context)
        for op in library.body.operations:
            if op.operation.name == "hal.executable.source":
                op.operation.clone(ip=ir.InsertionPoint.at_block_begin(module_op.regions[0].blocks[0]))
    return rewriter.counts


def _has_executable(module_op) -> bool:
    return any(op.operation.name == "hal.executable.source" and facts.get(op.operation, "sym_name") == EXECUTABLE
               for op in module_op.regions[0].blocks[0].operations)


@register("use-custom-kernels", "hot f16/bf16 products (GEMM, LoRA site, base product with its expand, BGMV) "
          "→ StageML's Hopper kernels (lowering=reference: calls of their CPU references)",
          options=UseCustomKernelsOptions, context="iree")
def run(module_op, options: UseCustomKernelsOptions, stats) -> None:
    stats.update(use_custom_kernels(module_op, options.lowering))
