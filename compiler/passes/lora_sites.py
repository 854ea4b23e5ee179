"""lora-sites: every LoRA site in one canonical form, for multi-tenant serving.

A LoRA site is a request-time sum `x@Wt + c + s·((x@At)@Bt)` (bt-improve's
linear form; c, the base layer's bias, is optional) with Wt static and At, Bt transposes of
adapter-time arguments A [r, in] and B [out, r] (PEFT's lora_A / lora_B
layout). Each site is rebuilt with its factors padded to the maximum rank R
and without its scaling, which becomes a property of each loaded adapter
(the runtime stores s·B, pre-scaled):

    %A : [r,in] {adapter}, %B : [out,r] {adapter}
    %y = torch.aten.matmul %x, %wt
    %t = torch.aten.matmul %x, (transpose %A)
    %u = torch.aten.matmul %t, (transpose %B)
    %v = torch.aten.mul.Scalar %u, %s
    %z = torch.aten.add.Tensor %y, %v, %int1
  → %A : [R,in] {adapter}, %B : [out,R] {adapter}
    %z = torch.aten.add.Tensor (matmul %x, %wt),
           (matmul (matmul %x, (transpose %A)), (transpose %B)), %int1

The base product may scale its output columns, `(x@Wt) * v` with v static (an
int8 weight-only layer's scales, compiler/quantized.py): the rebuilt site keeps
that product as it is.

A parameter site is PEFT's merged 2-D parameter (LoRA through `target_parameters`
on a Linear's weight, e.g. an MoE router's `mlp.gate.weight`): W + s·(B@A) used as
a product's weight. Each product becomes a dense site:

    %m = torch.aten.add.Tensor %W, (mul.Scalar (mm %B, %A), %s)    // [out,in] {adapter}
    %y = torch.aten.mm %x, (transpose %m)
  → %y = torch.aten.add.Tensor (matmul %x, (transpose %W)),
           (matmul (matmul %x, (transpose %A')), (transpose %B')), %int1

An expert site is PEFT's merged expert stack (LoRA on MoE experts through
`target_parameters`, which PEFT folds as `W + s·bmm(lhs, rhs)`), its factors
A [E·r, in] (expert-major) and B [out, E·r] (the expert index fastest)
reshaped per expert; it is rebuilt the same way, each expert's factors of
rank R, and is described with its expert count E:

    %a = view %A [E,r,in] ; %b = permute (view %B [out,r,E]), [2,0,1]   // [E,out,r]
    %m = torch.aten.add.Tensor %W, (mul.Scalar (bmm %b, %a), %s)          // [E,out,in]
  → %m = torch.aten.add.Tensor %W, (bmm (permute (view %B' [out,R,E])), (view %A' [E,R,in]))
       with %A' : [E·R,in], %B' : [out,E·R]

(a stack stored [E, in, out], GPT-OSS's, multiplies A's transpose by B's.)

PEFT merges a half-precision parameter in float32: the factors cast up, and
either the sum cast back (an expert stack: `to.dtype(to.dtype(W, f32) +
s·bmm(to.dtype(b), to.dtype(a)), f16)`) or the delta (a 2-D parameter: `W +
to.dtype(s·mm(to.dtype(B), to.dtype(A)), f16)`). That is the same site; it is
rebuilt in the parameter's own dtype, as above.

The sites are described once, on the module, for everything downstream
(the manifest, the cost policy, the PEFT loader): one dictionary per site
naming its factor arguments, with shapes, the model's rank and scaling,
the element type and its expert count (0: a dense layer; an expert site also
names its stack's parameter), next to the multi-tenant configuration:

    module attributes {bt.tenants = {max_adapters = 4, max_rank = 8},
      bt.sites = [{lora_A = "fc.lora_A.default.weight", lora_B = "...", in_features = 64,
                   out_features = 48, rank = 4, scaling = 2.0, dtype = "float32", experts = 0}],
      bt.unread_factors = []}

`bt.unread_factors` names the adapter-time arguments nothing reads: the factors of LoRA on a
module the exported forward never runs (a causal LM's cross-attention, a vision tower). An
adapter's factors for such a module change nothing, and the loader accepts them.
"""

import dataclasses

from torch_mlir import ir
from torch_mlir.dialects import torch as torch_d

from stageml.binding_time import BindingTime
from stageml.compiler.ir import (DTYPES, arg_name, const_int, constant, erase_dead_ops, timed, users,
                                 value_time, vtensor_shape, vtensor_type)
from stageml.compiler import facts
from stageml.compiler.passes import programs, register
from stageml.compiler.passes.bt_improve import add_biases, linear_form
from stageml.errors import CompileError

def _swaps(op) -> bool | None:
    """Whether a 2-D layout op transposes its operand (None: not a layout op)."""
    if op.name in ("torch.aten.t", "torch.aten.numpy_T"):
        return True
    if op.name == "torch.aten.transpose.int":
        dims = [constant(v) for v in op.operands[1:]]
        return None if None in dims else dims[0] % 2 != dims[1] % 2
    if op.name == "torch.aten.permute" and not isinstance(op.operands[1].owner, ir.Block):
        dims = [constant(v) for v in op.operands[1].owner.operation.operands]
        return None if None in dims else [d % 2 for d in dims] == [1, 0]
    return None


def _transposed_argument(value):
    """The adapter-time argument `value` is the transpose of, or None."""
    swaps = 0
    while not isinstance(value.owner, ir.Block):
        op = value.owner.operation
        swapped = _swaps(op) if len(vtensor_shape(value.type)[0]) == 2 else None
        if swapped is None:
            return None
        swaps += swapped
        value = op.operands[0]
    if value_time(value) != BindingTime.ADAPTER or swaps % 2 != 1:
        return None
    return value


def _lora_branch(matrix):
    """(A argument, B argument, scaling) of `s·(At@Bt)`, or None."""
    scaling = 1.0
    while matrix[0] == "scale":
        factor = constant(matrix[2])
        if factor is None:
            return None
        scaling *= factor
        matrix = matrix[1]
    if matrix[0] != "dot" or matrix[1][0] != "leaf" or matrix[2][0] != "leaf":
        return None
    a, b = _transposed_argument(matrix[1][1]), _transposed_argument(matrix[2][1])
    return None if a is None or b is None else (a, b, scaling)


def _site(op):
    """(x, Wt, columns, biases, A, B, scaling) when `op` computes a LoRA site, else None;
    `columns` is None, or v where the base product is (x @ Wt) * v (a scale per output column:
    an int8 weight's, compiler/quantized.py)."""
    form = linear_form(op.result)
    if form.matrix is None or form.matrix[0] != "sum":
        return None
    for base, branch in ((form.matrix[1], form.matrix[2]), (form.matrix[2], form.matrix[1])):
        columns = None
        if base[0] == "columns" and value_time(base[2]) == BindingTime.STATIC:
            base, columns = base[1], base[2]
        if base[0] == "leaf" and value_time(base[1]) == BindingTime.STATIC:
            lora = _lora_branch(branch)
            if lora is not None:
                return (form.x, base[1], columns, form.biases) + lora
    return None


def _rebuild(op, x, wt, biases, a, b, rank, columns=None) -> None:
    """Replaces `op` by x@wt (* columns) + biases + (x@a^T)@b^T, the factors of rank `rank`."""
    (k, n), dtype = vtensor_shape(wt.type)
    x_dims = vtensor_shape(x.type)[0]
    with ir.InsertionPoint(op), op.location:
        zero, one = const_int(0, annotate=True), const_int(1, annotate=True)
        at = timed(torch_d.AtenTransposeIntOp(vtensor_type([k, rank], dtype), a, zero, one))
        bt = timed(torch_d.AtenTransposeIntOp(vtensor_type([rank, n], dtype), b, zero, one))
        base = timed(torch_d.AtenMatmulOp(op.result.type, x, wt))
        if columns is not None:
            base = timed(torch_d.AtenMulTensorOp(op.result.type, base, columns))
        base = add_biases(base, biases)
        low = timed(torch_d.AtenMatmulOp(vtensor_type(x_dims[:-1] + [rank], dtype), x, at))
        delta = timed(torch_d.AtenMatmulOp(op.result.type, low, bt))
        total = timed(torch_d.AtenAddTensorOp(op.result.type, base, delta, one))
    op.result.replace_all_uses_with(total)


_LAYOUT = ("torch.aten.view", "torch.aten.reshape", "torch.aten.permute", "torch.aten.transpose.int")
_CAST = "torch.aten.to.dtype"


def _uncast(value):
    """`value` before the dtype casts it went through."""
    while not isinstance(value.owner, ir.Block) and value.owner.operation.name == _CAST:
        value = value.owner.operation.operands[0]
    return value


def _layout_of_argument(value):
    """(the adapter-time argument `value` is a reshape / permute of, whether PEFT's expert-major
    permute [2, 0, 1] of B's (out, r, E) view is on the way) or None."""
    experts_first = False
    while not isinstance(value.owner, ir.Block):
        op = value.owner.operation
        if op.name not in (*_LAYOUT, _CAST):
            return None
        if op.name == "torch.aten.permute" and not isinstance(op.operands[1].owner, ir.Block):
            experts_first |= [constant(v) for v in op.operands[1].owner.operation.operands] == [2, 0, 1]
        value = op.operands[0]
    return (value, experts_first) if value_time(value) == BindingTime.ADAPTER else None


def _merged_parameter(op, dims: int):
    """(W, the product of the delta, s) when `op` is PEFT's merged parameter W + s·delta of
    a static `dims`-dimensional W, at adapter time, of W's type (cast back to it where the sum
    was taken in float32), else None."""
    if op.name == _CAST and not isinstance(op.operands[0].owner, ir.Block):
        merged, op = op.result.type, op.operands[0].owner.operation
    else:
        merged = op.results[0].type if len(op.results) == 1 else None
    if (op.name != "torch.aten.add.Tensor" or value_time(op.result) != BindingTime.ADAPTER
            or constant(op.operands[2]) != 1):
        return None
    w, delta = _uncast(op.operands[0]), op.operands[1]
    if value_time(w) != BindingTime.STATIC or len(vtensor_shape(w.type)[0]) != dims or w.type != merged:
        return None
    scaling, delta = 1.0, _uncast(delta)
    while not isinstance(delta.owner, ir.Block) and delta.owner.operation.name == "torch.aten.mul.Scalar":
        factor = constant(delta.owner.operation.operands[1])
        if factor is None:
            return None
        scaling *= factor
        delta = _uncast(delta.owner.operation.operands[0])
    return None if isinstance(delta.owner, ir.Block) else (w, delta.owner.operation, scaling)


def _parameter_site(op):
    """(W, A, B, scaling) when `op` is PEFT's merged 2-D parameter W + s·(B@A), else None."""
    merged = _merged_parameter(op, 2)
    if merged is None or merged[1].name not in ("torch.aten.mm", "torch.aten.matmul"):
        return None
    w, product, scaling = merged
    b, a = (_uncast(v) for v in product.operands)
    if not all(isinstance(v.owner, ir.Block) and value_time(v) == BindingTime.ADAPTER for v in (a, b)):
        return None
    return w, a, b, scaling


def _rebuild_parameter(func, op, w, a, b, rank: int) -> None:
    """Rebuilds every product x @ transpose(`op`) of the merged parameter `op` = W + s·(B@A)
    as a dense site x@W^T + (x@A^T)@B^T, the factors of rank `rank`."""
    (n, k), dtype = vtensor_shape(w.type)
    for layout in users(op.result):
        products = users(layout.results[0]) if _swaps(layout) else [layout]
        for product in products:
            if (product.name not in ("torch.aten.mm", "torch.aten.matmul") or not _swaps(layout)
                    or product.operands[1] != layout.results[0] or value_time(product.results[0]) != BindingTime.DYNAMIC):
                raise CompileError(f"{product.location}: the parameter LoRA factor {arg_name(func, a.arg_number)!r} "
                                   f"merges into is used by '{product.name}', which cannot be served per request "
                                   "row; only products x @ W^T of the merged parameter can")
            with ir.InsertionPoint(product), product.location:
                wt = timed(torch_d.AtenTransposeIntOp(vtensor_type([k, n], dtype), w, const_int(0, annotate=True),
                                                      const_int(1, annotate=True)))
            _rebuild(product, product.operands[0], wt, (), a, b, rank)


def _expert_site(op):
    """(W, A, B, scaling, B first in the product) when `op` is PEFT's merged expert stack
    W + s·bmm(lhs, rhs), else None."""
    merged = _merged_parameter(op, 3)
    if merged is None or merged[1].name != "torch.aten.bmm":
        return None
    w, product, scaling = merged
    lhs, rhs = (_layout_of_argument(v) for v in product.operands)
    if lhs is None or rhs is None or lhs[1] == rhs[1]:
        return None  # PEFT's B reaches the product through its permute to (E, out, r), its A does not
    b_first = lhs[1]
    a, b = (rhs[0], lhs[0]) if b_first else (lhs[0], rhs[0])
    return w, a, b, scaling, b_first


def _int_list(values: list) -> ir.Value:
    return timed(torch_d.PrimListConstructOp(ir.Type.parse("!torch.list<int>"),
                                              [const_int(v, annotate=True) for v in values]))


def _rebuild_experts(op, w, a, b, b_first: bool, rank: int) -> ir.Operation:
    """Replaces `op` by W + bmm of the per-expert factors of rank `rank`; returns their views."""
    experts, p, q = vtensor_shape(w.type)[0]
    dtype = vtensor_shape(w.type)[1]
    k, n = (q, p) if b_first else (p, q)  # in and out features
    with ir.InsertionPoint(op), op.location:
        a3 = timed(torch_d.AtenViewOp(vtensor_type([experts, rank, k], dtype), a, _int_list([experts, rank, k])))
        b3 = timed(torch_d.AtenViewOp(vtensor_type([n, rank, experts], dtype), b, _int_list([n, rank, experts])))
        b_e = timed(torch_d.AtenPermuteOp(vtensor_type([experts, n, rank], dtype), b3, _int_list([2, 0, 1])))
        if b_first:  # W [E, out, in]
            delta = timed(torch_d.AtenBmmOp(op.result.type, b_e, a3))
        else:  # W [E, in, out]
            one, two = const_int(1, annotate=True), const_int(2, annotate=True)
            a_t = timed(torch_d.AtenTransposeIntOp(vtensor_type([experts, k, rank], dtype), a3, one, two))
            b_t = timed(torch_d.AtenTransposeIntOp(vtensor_type([experts, rank, n], dtype), b_e, one, two))
            delta = timed(torch_d.AtenBmmOp(op.result.type, a_t, b_t))
        merged = timed(torch_d.AtenAddTensorOp(op.result.type, w, delta, const_int(1, annotate=True)))
    op.result.replace_all_uses_with(merged)
    return a3.owner.operation, b3.owner.operation


def _expert_record(func, w, a, b, scaling, b_first, rank):
    """The site record of an expert site, its factors checked against PEFT's layout."""
    (experts, p, q), dtype = vtensor_shape(w.type)
    k, n = (q, p) if b_first else (p, q)
    a_name, b_name = (arg_name(func, v.arg_number) for v in (a, b))
    a_dims, b_dims = vtensor_shape(a.type)[0], vtensor_shape(b.type)[0]
    r = a_dims[0] // experts
    if a_dims != [experts * r, k] or b_dims != [n, experts * r] or r == 0:
        raise CompileError(f"expert LoRA factors {a_name!r} {a_dims} and {b_name!r} {b_dims} are not in PEFT's "
                           f"layout for {experts} experts (lora_A [E*r, {k}], lora_B [{n}, E*r]): store them as PEFT does")
    if r > rank:
        raise CompileError(f"LoRA factor {a_name!r} has rank {r} per expert, above the maximum rank {rank}: "
                           f"compile with a max rank of at least {r}")
    record = {"lora_A": a_name, "lora_B": b_name, "in_features": k, "out_features": n, "rank": r,
              "scaling": float(scaling), "dtype": DTYPES[dtype], "experts": experts}
    if isinstance(w.owner, ir.Block):  # the stack's parameter: PEFT's rank_pattern names it, not the factors
        record["parameter"] = arg_name(func, w.arg_number)
    return record


def _dense_record(func, a, b, k: int, n: int, scaling: float, dtype, rank: int) -> dict:
    """The site record of a dense site x@W [k → n] + s·(x@A^T)@B^T, its factors checked
    against PEFT's layout."""
    r = vtensor_shape(a.type)[0][0]
    a_name, b_name = (arg_name(func, v.arg_number) for v in (a, b))
    if vtensor_shape(a.type)[0] != [r, k] or vtensor_shape(b.type)[0] != [n, r]:
        raise CompileError(f"LoRA factors {a_name!r} and {b_name!r} are not in PEFT's layout "
                           f"(lora_A [r, {k}], lora_B [{n}, r]): store them as PEFT does")
    if r > rank:
        raise CompileError(f"LoRA factor {a_name!r} has rank {r}, above the maximum rank {rank}: "
                           f"compile with a max rank of at least {r}")
    return {"lora_A": a_name, "lora_B": b_name, "in_features": k, "out_features": n,
            "rank": r, "scaling": float(scaling), "dtype": DTYPES[dtype], "experts": 0}


def canonicalize(func, rank: int) -> list:
    """Rebuilds every LoRA site of `func`; returns the site records."""
    block = func.regions[0].blocks[0]
    sites, padded = [], {}
    for op in reversed(list(block.operations)):
        op = op.operation
        expert = _expert_site(op)
        if expert is not None:
            w, a, b, scaling, b_first = expert
            sites.append(_expert_record(func, w, a, b, scaling, b_first, rank))
            experts, k, n = sites[-1]["experts"], sites[-1]["in_features"], sites[-1]["out_features"]
            views = _rebuild_experts(op, w, a, b, b_first, rank)
            padded[a] = (vtensor_type([experts * rank, k], vtensor_shape(a.type)[1]), views[0])
            padded[b] = (vtensor_type([n, experts * rank], vtensor_shape(b.type)[1]), views[1])
            continue
        parameter = _parameter_site(op)
        if parameter is not None:
            w, a, b, scaling = parameter
            (n, k), dtype = vtensor_shape(w.type)
            sites.append(_dense_record(func, a, b, k, n, scaling, dtype, rank))
            _rebuild_parameter(func, op, w, a, b, rank)
            padded[a] = vtensor_type([rank, k], dtype)
            padded[b] = vtensor_type([n, rank], dtype)
            continue
        if op.name != "torch.aten.add.Tensor" or value_time(op.result) != BindingTime.DYNAMIC:
            continue
        site = _site(op)
        if site is None:
            continue
        x, wt, columns, biases, a, b, scaling = site
        (k, n), dtype = vtensor_shape(wt.type)
        sites.append(_dense_record(func, a, b, k, n, scaling, dtype, rank))
        _rebuild(op, x, wt, biases, a, b, rank, columns)
        padded[a] = vtensor_type([rank, k], dtype)
        padded[b] = vtensor_type([n, rank], dtype)
    erase_dead_ops(block)
    for arg, type_ in padded.items():
        if isinstance(type_, tuple):  # an expert site's factor, read by its per-expert view only
            type_, view = type_
            stale = [u for u in users(arg) if u != view]
        else:
            stale = [u for u in users(arg) if u.name != "torch.aten.transpose.int" or u.results[0].type
                     != vtensor_type(list(reversed(vtensor_shape(type_)[0])), vtensor_shape(type_)[1])]
        if stale:
            raise CompileError(f"LoRA factor {arg_name(func, arg.arg_number)!r} is also used outside its "
                               f"LoRA site ({stale[0].name}): multi-tenant compilation needs factors used only there")
        arg.set_type(type_)
    facts.retype_inputs(func)
    return list(reversed(sites))


@dataclasses.dataclass(frozen=True)
class LoraSitesOptions:
    max_rank: int = 16     # the rank every site's factors are padded to
    max_adapters: int = 1  # adapter slots of the multi-tenant residual


@register("lora-sites", "rebuild each LoRA site as x@W + (x@A^T)@B^T with rank-R, pre-scaled factors",
          options=LoraSitesOptions)
def run(module_op, options, stats) -> None:
    unread = [arg_name(func, i) for func in programs(module_op)
              for i, arg in enumerate(func.regions[0].blocks[0].arguments)
              if value_time(arg) == BindingTime.ADAPTER and not users(arg)]
    sites = [site for func in programs(module_op) for site in canonicalize(func, options.max_rank)]
    if not sites:
        raise CompileError("the model has no LoRA site (x@W + s*(x@A^T)@B^T, a merged parameter W + s*(B@A), "
                           "or an MoE expert stack W + s*bmm(B, A), with adapter-time PEFT lora_A/lora_B weights): "
                           "compile a PEFT LoRA model, or compile without max_adapters")
    facts.put(module_op, facts.SITES, sites)
    facts.put(module_op, facts.UNREAD_FACTORS, unread)
    facts.put(module_op, facts.TENANTS, {"max_adapters": options.max_adapters, "max_rank": options.max_rank})
    stats["lora-site"] += len(sites)
