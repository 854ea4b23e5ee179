"""bt-improve: algebra that moves request-time work to earlier stages.

Linear forms. A request-time value built from one input `x` by products with
earlier-stage matrices, earlier-stage scalings and sums is `x @ M` for an
earlier-stage matrix expression M. When computing `x @ M` costs fewer
request-time FLOPs per row than the original expression, the expression is
replaced by one product and M is built from earlier-stage ops, which
bt-split then moves out of the request path.

LoRA merge (distributivity), W, A, B static or adapter-time:

    %0 = torch.aten.matmul %x, %Wt
    %1 = torch.aten.matmul %x, %At
    %2 = torch.aten.matmul %1, %Bt
    %3 = torch.aten.mul.Scalar %2, %s
    %4 = torch.aten.add.Tensor %0, %3, %one
  → %p = torch.aten.mm %At, %Bt           // adapter time
    %q = torch.aten.mul.Scalar %p, %s     // adapter time
    %m = torch.aten.add.Tensor %Wt, %q, %one
    %4 = torch.aten.matmul %x, %m         // the only request-time product

A per-column scaling of a product, `(x @ W) * v` with v earlier ([out]: an
int8 weight's scales, compiler/quantized.py), is `x @ (W * v)`: a LoRA
branch beside it merges into `W * v + s·(At@Bt)` the same way.

Reassociation `(x @ P) @ Q → x @ (P @ Q)` is the same rewrite on a chain; it
applies only when it lowers request-time FLOPs (never for a low-rank pair).

Layout work on earlier-stage values (transposes of weights, casts, reshapes)
needs no rewrite here: bt-propagate gives it the earlier time and bt-split
hoists it into @static or @adapter.

With merge-quantized=false no rewrite builds a float matrix from an integer
weight (an int8 layer's LoRA stays factorized, its weight int8): a single-tenant
--keep-quantized compile. A multi-tenant one merges, and requantize-merged
makes the merge int8 again.

A "factorized" program keeps its LoRA sites as they are (it serves each
row's adapter from its factors): the pass leaves it alone.
"""

import dataclasses

from stageml.binding_time import BindingTime
from stageml.compiler.ir import (const_int, timed, erase_dead_ops, is_rematerializable, set_op_time,
                                 users, value_time, vtensor_shape, vtensor_type)
from stageml.compiler.facts import FACTORIZED
from stageml.compiler.passes import program_of, programs, register
from stageml.compiler.passes.defer_dequant import is_widening_cast
from torch_mlir import ir
from torch_mlir.dialects import torch as torch_d

_PRODUCTS = ("torch.aten.matmul", "torch.aten.mm")


@dataclasses.dataclass
class LinearForm:
    """`value == x @ matrix + sum(biases)`; `flops` is the per-row request-time
    cost of `value`. Biases are earlier-stage values (a linear layer's bias)."""

    x: ir.Value
    # None (identity) or ("leaf", v) | ("dot", a, b) | ("scale", a, s) | ("columns", a, v): column j of a
    # times v[j] | ("sum", a, b, alpha)
    matrix: tuple | None
    flops: int
    products: int
    biases: tuple = ()


def _dims(value):
    return vtensor_shape(value.type)[0]


def _is_earlier_matrix(value, time) -> bool:
    dims = _dims(value)
    return value_time(value) < time and len(dims) == 2 and None not in dims


def linear_form(value: ir.Value, root: bool = True) -> LinearForm:
    """The linear form of `value` in the closest single-use input."""
    op = value.owner
    leaf = LinearForm(value, None, 0, 0)
    if isinstance(op, ir.Block) or (not root and len(users(value)) != 1):
        return leaf
    op, time = op.operation, value_time(value)
    if op.name in _PRODUCTS and _is_earlier_matrix(op.operands[1], time) and value_time(op.operands[0]) == time:
        inner = linear_form(op.operands[0], root=False)
        if inner.biases:  # (x@M + c) @ W: the bias would change; stop at the sum
            inner = LinearForm(op.operands[0], None, 0, 0)
        rows, cols = _dims(op.operands[1])
        matrix = ("leaf", op.operands[1])
        matrix = matrix if inner.matrix is None else ("dot", inner.matrix, matrix)
        return LinearForm(inner.x, matrix, inner.flops + rows * cols, inner.products + 1)
    if op.name == "torch.aten.mul.Scalar" and is_rematerializable(op.operands[1]):
        inner = linear_form(op.operands[0], root=False)
        if inner.matrix is None or inner.biases:
            return leaf
        return LinearForm(inner.x, ("scale", inner.matrix, op.operands[1]),
                          inner.flops + _dims(value)[-1], inner.products)
    if op.name == "torch.aten.mul.Tensor":  # x@M * v, v earlier and one factor per column of M
        for form, other in ((0, 1), (1, 0)):
            if value_time(op.operands[other]) < time and _dims(op.operands[other]) == _dims(value)[-1:]:
                inner = linear_form(op.operands[form], root=False)
                if inner.matrix is None or inner.biases:
                    return leaf
                return LinearForm(inner.x, ("columns", inner.matrix, op.operands[other]),
                                  inner.flops + _dims(value)[-1], inner.products)
        return leaf
    if op.name == "torch.aten.add.Tensor" and _is_one(op.operands[2]):
        for form, other in ((0, 1), (1, 0)):  # x@M + c, c earlier than `value`
            if value_time(op.operands[other]) < time and _dims(op.operands[other])[-1:] == _dims(value)[-1:]:
                inner = linear_form(op.operands[form], root=False)
                if inner.matrix is None:
                    return leaf
                return dataclasses.replace(inner, flops=inner.flops + _dims(value)[-1],
                                           biases=inner.biases + (op.operands[other],))
        lhs, rhs = (linear_form(v, root=False) for v in op.operands[:2])
        if lhs.matrix is None or rhs.matrix is None or lhs.x != rhs.x:
            return leaf
        return LinearForm(lhs.x, ("sum", lhs.matrix, rhs.matrix, op.operands[2]),
                          lhs.flops + rhs.flops + _dims(value)[-1], lhs.products + rhs.products,
                          lhs.biases + rhs.biases)
    return leaf


def _is_one(value) -> bool:
    op = value.owner
    return (not isinstance(op, ir.Block) and op.operation.name == "torch.constant.int"
            and ir.IntegerAttr(op.operation.attributes["value"]).value == 1)


def _matrix_time(matrix) -> BindingTime:
    if matrix[0] == "leaf":
        return value_time(matrix[1])
    vectors = [value_time(matrix[2])] if matrix[0] == "columns" else []
    return BindingTime.STATIC.join(*(_matrix_time(m) for m in matrix[1:] if isinstance(m, tuple)), *vectors)


def _build(matrix, dtype) -> ir.Value:
    """Emits the ops computing `matrix` at the current insertion point."""
    kind = matrix[0]
    if kind == "leaf":
        return matrix[1]
    lhs = _build(matrix[1], dtype)
    if kind == "dot":
        rhs = _build(matrix[2], dtype)
        type_ = vtensor_type([_dims(lhs)[0], _dims(rhs)[1]], dtype)
        op = torch_d.AtenMmOp(type_, lhs, rhs)
    elif kind == "scale":
        op = torch_d.AtenMulScalarOp(lhs.type, lhs, matrix[2])
    elif kind == "columns":
        op = torch_d.AtenMulTensorOp(lhs.type, lhs, matrix[2])
    else:
        op = torch_d.AtenAddTensorOp(lhs.type, lhs, _build(matrix[2], dtype), matrix[3])
    return timed(op)


def add_biases(value: ir.Value, biases) -> ir.Value:
    """`value + c` for each c in `biases`, at the current insertion point."""
    for bias in biases:
        one = const_int(1, annotate=True)
        value = torch_d.AtenAddTensorOp(value.type, value, bias, one).result
        set_op_time(value.owner, BindingTime.DYNAMIC)
    return value


def _reads_integer_weight(matrix) -> bool:
    """Whether `matrix` is built from an integer tensor converted to floats."""
    if matrix[0] == "leaf":
        owner = matrix[1].owner
        return not isinstance(owner, ir.Block) and is_widening_cast(owner.operation)
    return any(_reads_integer_weight(m) for m in matrix[1:] if isinstance(m, tuple))


def improve(func, merge_lora: bool, stats, merge_quantized: bool = True) -> None:
    block = func.regions[0].blocks[0]
    for op in reversed(list(block.operations)):
        op = op.operation
        if not op.name.startswith(_PRODUCTS + ("torch.aten.add.Tensor",)) or len(op.results) != 1:
            continue
        if value_time(op.result) != BindingTime.DYNAMIC or len(users(op.result)) == 0:
            continue
        form = linear_form(op.result)
        if form.matrix is None or form.products < 2:
            continue
        inputs, outputs = _dims(form.x)[-1], _dims(op.result)[-1]
        if inputs is None or outputs is None or inputs * outputs >= form.flops:
            continue  # merging would not lower request-time FLOPs
        if not merge_lora and _matrix_time(form.matrix) == BindingTime.ADAPTER:
            continue  # the cost policy keeps adapters factorized
        if not merge_quantized and _reads_integer_weight(form.matrix):
            continue  # a float product of an integer weight: four times its bytes (defer-dequant keeps it int8)
        with ir.InsertionPoint(op), op.location:
            matrix = _build(form.matrix, vtensor_shape(op.result.type)[1])
            product = torch_d.AtenMatmulOp(op.result.type, form.x, matrix).result
            set_op_time(product.owner, BindingTime.DYNAMIC)
            product = add_biases(product, form.biases)
        op.result.replace_all_uses_with(product)
        stats["lora-merge" if op.name == "torch.aten.add.Tensor" else "reassociate"] += 1
    erase_dead_ops(block)


@dataclasses.dataclass(frozen=True)
class BtImproveOptions:
    merge_lora: bool = True  # the cost policy may decline LoRA merges
    merge_quantized: bool = True  # false: no merge into an integer weight (a single-tenant --keep-quantized)


@register("bt-improve", "binding-time improvements: LoRA merge, FLOP-aware reassociation",
          options=BtImproveOptions)
def run(module_op, options, stats) -> None:
    for func in programs(module_op):
        if program_of(func) != FACTORIZED:
            improve(func, options.merge_lora, stats, options.merge_quantized)
