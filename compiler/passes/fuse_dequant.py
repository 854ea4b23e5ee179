"""fuse-dequant (a pattern on linalg.matmul): a product reads an integer weight
as it is, converting each element inside the product, instead of a float copy of
the whole weight made first.

With --keep-quantized (defer-dequant) the residual converts its int8 weights to
floats where they are used; torch-mlir lowers that to an elementwise generic
before the product, which IREE 3.13 compiles as a dispatch of its own on the CPU:
every call writes the weight out in floats (4x its bytes) and reads it back.
linalg.matmul itself takes operands of mixed element types (each converted to the
result's type, integers as signed: `arith.sitofp`, the same conversion), so:

    %w = linalg.generic {identity maps, parallel} ins(%q : KxNxi8) outs(%e : KxNxf32) {
           %f = arith.sitofp %in : i8 to f32
           linalg.yield %f }
    %y = linalg.matmul ins(%x, %w : MxKxf32, KxNxf32) outs(%acc : MxNxf32)
  → %y = linalg.matmul ins(%x, %q : MxKxf32, KxNxi8) outs(%acc : MxNxf32)

One dispatch, which IREE's data tiling packs the int8 weight for once, at load
(measured on a 2-vCPU EPYC, 2048x2048 weight: 0.97 ms a call at 1 row against
4.09 for the float copy; f32 weights take 0.40).
"""

from iree.compiler import ir
from iree.compiler.dialects import linalg

from stageml.compiler.passes import register
from stageml.compiler.residual_ir import defining_op, rewrite_request_functions


def _signed_widening(value, result_type):
    """The integer tensor whose elementwise `sitofp` to `result_type` `value` is, else None."""
    generic = defining_op(value)
    if generic is None or generic.name != "linalg.generic" or len(generic.operands) != 2:
        return None
    body = [op.operation for op in generic.regions[0].blocks[0].operations]
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(generic.attributes["indexing_maps"])]
    source = generic.operands[0]
    if ([op.name for op in body] != ["arith.sitofp", "linalg.yield"] or any(not m.is_permutation for m in maps)
            or len(set(str(m) for m in maps)) != 1 or body[0].operands[0] != generic.regions[0].blocks[0].arguments[0]
            or ir.RankedTensorType(value.type).element_type != result_type):
        return None
    return source


def fuse(op, rewriter) -> bool:
    """The pattern: True when it does not apply."""
    result_type = ir.RankedTensorType(op.results[0].type).element_type
    lhs, rhs = op.operands[0], op.operands[1]
    weight = _signed_widening(rhs, result_type)
    if weight is None:
        return True
    cast = rhs.owner
    with rewriter.ip, op.location:
        fused = linalg.matmul(lhs, weight, outs=[op.operands[2]])
    rewriter.replace_op(op, [fused])
    if all(len(list(r.uses)) == 0 for r in cast.results):
        rewriter.erase_op(cast)
    return False


@register("fuse-dequant", "products read integer weights as they are, converting inside the product",
          context="iree")
def run(module_op, options, stats) -> None:
    rewrite_request_functions(module_op, "linalg.matmul", fuse, stats, "fuse-dequant")
