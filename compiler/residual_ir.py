"""Helpers for the residual's IREE input (linalg on tensors, IREE's bindings)."""

import math

from iree.compiler import ir

from stageml.compiler import facts


def defining_op(value):
    """The operation defining `value`, or None for a block argument."""
    owner = value.owner
    return None if isinstance(owner, ir.Block) else owner.operation


def is_zero_fill(value) -> bool:
    """True when `value` is `linalg.fill` of the constant 0.0."""
    fill = defining_op(value)
    if fill is None or fill.name != "linalg.fill":
        return False
    scalar = defining_op(fill.operands[0])
    return (scalar is not None and scalar.name == "arith.constant"
            and ir.FloatAttr(scalar.attributes["value"]).value == 0.0)


def rewrite_request_functions(module_op, op_name: str, match, stats, counter: str) -> None:
    """Applies `match(op, rewriter)` to every `op_name` op of the request-time stage functions by
    IREE's bindings' walk driver; `match` returns True where it does not apply (the bindings'
    convention). Counts the rewrites in stats[counter]."""
    from iree.compiler import rewrite

    def pattern(op, rewriter):
        unmatched = match(op, rewriter)
        stats[counter] += not unmatched
        return unmatched

    with module_op.context:
        for func in facts.stage_functions(module_op, "dynamic"):
            patterns = rewrite.RewritePatternSet()
            patterns.add(op_name, pattern)
            rewrite.walk_and_apply_patterns(func, patterns.freeze())


def retype(func) -> None:
    """Sets `func`'s type to its arguments' and returned values' types."""
    block = func.regions[0].blocks[0]
    results = [v.type for v in list(block.operations)[-1].operands]
    func.attributes["function_type"] = ir.TypeAttr.get(
        ir.FunctionType.get([a.type for a in block.arguments], results))


def dim_bound(value, dim: int) -> int | None:
    """The most `value` (a tensor) can hold along `dim`, where the IR says it: a static size,
    an entry argument's export range (its `bt.dims` max), or what the ops that carry a dimension
    from one of those make of it (reshapes, casts, destination-passing ops, tensor.empty,
    flow.dispatch); None where unknown or unbounded:

        func @forward(%x: tensor<?x?x64xf16> {bt.dims = [{max = 8}, {max = 16}, ...]})
          %c = tensor.collapse_shape %x [[0, 1], [2]]     → dim_bound(%c, 0) = 8 * 16 = 128
    """
    type_ = ir.RankedTensorType(value.type)
    if not type_.is_dynamic_dim(dim):
        return type_.shape[dim]
    op = defining_op(value)
    if op is None:
        return _argument_bound(value, dim)
    name = op.name
    if name == "tensor.collapse_shape":
        group = [ir.IntegerAttr(d).value for d in ir.ArrayAttr(ir.ArrayAttr(op.attributes["reassociation"])[dim])]
        bounds = [dim_bound(op.operands[0], d) for d in group]
        return None if None in bounds else math.prod(bounds)
    if name == "tensor.expand_shape":
        groups = [[ir.IntegerAttr(d).value for d in ir.ArrayAttr(g)] for g in ir.ArrayAttr(op.attributes["reassociation"])]
        source = next(i for i, g in enumerate(groups) if dim in g)
        others = [type_.shape[d] for d in groups[source] if d != dim]
        if any(type_.is_dynamic_dim(d) for d in groups[source] if d != dim):
            return None
        bound = dim_bound(op.operands[0], source)
        return None if bound is None else bound // max(1, math.prod(others))
    if name == "tensor.cast":
        return dim_bound(op.operands[0], dim)
    if name == "tensor.empty" or name == "flow.dispatch":
        sizes = list(op.operands) if name == "tensor.empty" else list(op.opview.result_dims)
        results = list(op.results)
        before = sum(ir.RankedTensorType(r.type).num_dynamic_dims for r in results[:results.index(value)])
        dynamic = sum(1 for d in range(dim) if type_.is_dynamic_dim(d))
        return index_bound(sizes[before + dynamic])
    if hasattr(op.opview, "outputs"):  # destination-passing: each result is shaped as its init
        inits = list(op.opview.outputs)
        return dim_bound(inits[list(op.results).index(value)], dim)
    return None


def _argument_bound(value, dim: int) -> int | None:
    """An entry argument's export range along `dim` (its bt.dims max), else None."""
    owner = value.owner.owner  # the block's parent op
    if owner is None or owner.operation.name != "func.func":
        return None
    dims = facts.facts(owner.operation, "arg", ir.BlockArgument(value).arg_number).get("dims")
    return dims[dim].get("max") if dims and dim < len(dims) else None


def index_bound(value) -> int | None:
    """The most an index value can be, where the IR says it: constants, dimensions
    (dim_bound) and their products and sums (arith, affine.apply); None where unknown."""
    op = defining_op(value)
    if op is None:
        return None
    if op.name == "arith.constant":
        return ir.IntegerAttr(op.attributes["value"]).value
    if op.name == "tensor.dim":
        index = defining_op(op.operands[1])
        if index is None or index.name != "arith.constant":
            return None
        return dim_bound(op.operands[0], ir.IntegerAttr(index.attributes["value"]).value)
    if op.name in ("arith.index_cast", "arith.index_castui"):
        return index_bound(op.operands[0])
    if op.name in ("arith.muli", "arith.addi"):
        a, b = (index_bound(v) for v in op.operands)
        return None if a is None or b is None else a * b if op.name == "arith.muli" else a + b
    if op.name == "affine.apply":
        operands = [index_bound(v) for v in op.operands]
        affine_map = ir.AffineMapAttr(op.attributes["map"]).value
        return None if None in operands else _affine_bound(affine_map.results[0], operands, affine_map.n_dims)
    return None


def _affine_bound(expr, operands: list, dims: int) -> int | None:
    """The most a sum of products of non-negative operands and constants can be."""
    if ir.AffineConstantExpr.isinstance(expr):
        value = ir.AffineConstantExpr(expr).value
        return value if value >= 0 else None
    if ir.AffineDimExpr.isinstance(expr):
        return operands[ir.AffineDimExpr(expr).position]
    if ir.AffineSymbolExpr.isinstance(expr):
        return operands[dims + ir.AffineSymbolExpr(expr).position]
    for kind, combine in ((ir.AffineAddExpr, lambda a, b: a + b), (ir.AffineMulExpr, lambda a, b: a * b)):
        if kind.isinstance(expr):
            binary = kind(expr)
            a, b = _affine_bound(binary.lhs, operands, dims), _affine_bound(binary.rhs, operands, dims)
            return None if a is None or b is None else combine(a, b)
    return None
