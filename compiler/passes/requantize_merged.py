"""requantize-merged: a LoRA merge into an int8 weight stays int8, and its adapter
stage measures what re-quantizing costs.

With --keep-quantized, bt-improve merges a multi-tenant module's LoRA sites
into the main program's weights as for any base, `W·v + s·A^T B^T` with W the
int8 weight converted to floats and v its scale per output column: a float
matrix, four times the int8 bytes, from a static float copy of W·v. This pass
computes the merge at adapter time from the int8 weight itself (its conversion
deferred, as defer-dequant defers one) and re-quantizes each such merge at
adapter time the way torchao quantizes a weight (and PEFT re-quantizes a
merged torchao layer): per output column, scale' = max(amax|M| / 127.5, eps),
q' = clamp(round(M * (1 / scale')), -128, 127) in int8, so the request path
reads int8 again (defer-dequant converts q' where the product uses it):

    %m = torch.aten.add.Tensor (mul.Tensor (to.dtype %qt, f32), %v), %delta    {adapter}
    %y = torch.aten.matmul %x, %m                                              {dynamic}
  → %m = torch.aten.add.Tensor (mul.Tensor (to.dtype %qt, f32 {bt.deferred}), %v), %delta  {adapter}
    %s = clamp (div.Scalar (max.dim (abs %m), 0), 127.5), eps, none               {adapter}
    %q = to.dtype (clamp (round (mul.Tensor %m, (reciprocal %s))), -128, 127), si8
    %y = torch.aten.mul.Tensor (matmul %x, (to.dtype %q, f32)), %s             {dynamic}
    %e = sum ((to.dtype %q, f32) * %s - %m)^2 ; %d = sum %delta^2              {adapter}
    "bt.measure"(cat [%e, %d]) {name = "quantization_error.<i>", sites = [lora_A]}

Re-quantizing changes the merged weight's values: the measure is how much
(squared error against the exact merge, and the squared size of the update
itself), from which the runtime's policy allows the merged form only where the
error stays under the user's bound (runtime/tenants.py). Only the "main"
program merges; a single-tenant module keeps these sites factorized (driver).
"""

from torch_mlir import ir
from torch_mlir.dialects import torch as torch_d

from stageml.binding_time import BindingTime
from stageml.compiler import facts
from stageml.compiler.ir import (TIME, argument_names, const_int, defining_op, erase_dead_ops, set_op_time,
                                 time_attr, timed, value_time, vtensor_shape, vtensor_type)
from stageml.compiler.passes import program_of, programs, register
from stageml.compiler.passes.defer_dequant import DEFERRED, is_widening_cast

_INT8, _F32 = 1, 6  # torch's dtype codes
_EPS = 1.1920928955078125e-07  # torch.finfo(torch.float32).eps: torchao's smallest int8 scale


def _merge(value):
    """(the cast of W, v, delta) when `value` is `W·v + delta`, W a widening cast of a static integer
    weight and v static, delta adapter-time; else None."""
    op = defining_op(value)
    if op is None or op.name != "torch.aten.add.Tensor" or value_time(value) != BindingTime.ADAPTER:
        return None
    for base, delta in ((op.operands[0], op.operands[1]), (op.operands[1], op.operands[0])):
        scaled = defining_op(base)
        if (scaled is not None and scaled.name == "torch.aten.mul.Tensor" and value_time(base) == BindingTime.STATIC
                and defining_op(scaled.operands[0]) is not None and is_widening_cast(defining_op(scaled.operands[0]))
                and value_time(delta) == BindingTime.ADAPTER):
            return defining_op(scaled.operands[0]), scaled.operands[1], delta
    return None


def _float(value: float) -> ir.Value:
    op = torch_d.ConstantFloatOp(ir.FloatAttr.get(ir.F64Type.get(), value))
    set_op_time(op.operation, BindingTime.STATIC)
    return op.result


def _cast(value, dtype: str, code: int) -> ir.Value:
    false = timed(torch_d.ConstantBoolOp(False))
    none = timed(torch_d.ConstantNoneOp())
    dims = vtensor_shape(value.type)[0]
    return timed(torch_d.AtenToDtypeOp(vtensor_type(dims, dtype), value, const_int(code, annotate=True),
                                       false, false, none))


def _squares(value) -> ir.Value:
    """[sum(value * value)], a 1-element f32 tensor."""
    none = timed(torch_d.ConstantNoneOp())
    total = timed(torch_d.AtenSumOp(vtensor_type([], "f32"), timed(torch_d.AtenMulTensorOp(value.type, value, value)),
                                    none))
    return timed(torch_d.AtenUnsqueezeOp(vtensor_type([1], "f32"), total, const_int(0, annotate=True)))


def requantize(op, name: str, sites: list) -> None:
    """Rewrites product `op` of a merged int8 weight as described in the module doc."""
    x, merged = op.operands
    cast, v, delta = _merge(merged)
    (k, n), _ = vtensor_shape(merged.type)
    column = vtensor_type([n], "f32")
    with ir.InsertionPoint(op), op.location:
        # the merge at adapter time from the int8 weight (not from a static float copy of it)
        weight = cast.clone()
        weight.attributes[DEFERRED] = ir.UnitAttr.get()
        set_op_time(weight, BindingTime.ADAPTER)
        base = timed(torch_d.AtenMulTensorOp(merged.type, weight.results[0], v))
        merged = timed(torch_d.AtenAddTensorOp(merged.type, base, delta, const_int(1, annotate=True)))
        false = timed(torch_d.ConstantBoolOp(False))
        amax = torch_d.AtenMaxDimOp(column, vtensor_type([n], "si64"), timed(torch_d.AtenAbsOp(merged.type, merged)),
                                    const_int(0, annotate=True), false)  # (torch-mlir lowers max.dim, not amax)
        set_op_time(amax.operation, BindingTime.ADAPTER)
        amax = amax.results[0]
        scale = timed(torch_d.AtenClampOp(column, timed(torch_d.AtenDivScalarOp(column, amax, _float(127.5))),
                                          _float(_EPS), timed(torch_d.ConstantNoneOp())))
        scaled = timed(torch_d.AtenMulTensorOp(merged.type, merged, timed(torch_d.AtenReciprocalOp(column, scale))))
        clamped = timed(torch_d.AtenClampOp(merged.type, timed(torch_d.AtenRoundOp(merged.type, scaled)),
                                            _float(-128.0), _float(127.0)))
        q = _cast(clamped, "si8", _INT8)
        product = timed(torch_d.AtenMatmulOp(op.results[0].type, x, _cast(q, "f32", _F32)))
        result = timed(torch_d.AtenMulTensorOp(op.results[0].type, product, scale))
        error = timed(torch_d.AtenSubTensorOp(merged.type, timed(torch_d.AtenMulTensorOp(
            merged.type, _cast(q, "f32", _F32), scale)), merged, const_int(1, annotate=True)))
        pair = timed(torch_d.PrimListConstructOp(ir.Type.parse("!torch.list<vtensor>"),
                                                 [_squares(error), _squares(delta)]))
        measured = timed(torch_d.AtenCatOp(vtensor_type([2], "f32"), pair, const_int(0, annotate=True)))
        ir.Operation.create("bt.measure", operands=[measured], attributes={
            "name": ir.StringAttr.get(name), "sites": ir.ArrayAttr.get([ir.StringAttr.get(s) for s in sites]),
            TIME: time_attr(BindingTime.ADAPTER)})
    op.results[0].replace_all_uses_with(result)
    op.erase()


def run_on(func, sites: list, stats) -> None:
    block = func.regions[0].blocks[0]
    found = [op.operation for op in block.operations
             if op.operation.name in ("torch.aten.matmul", "torch.aten.mm")
             and value_time(op.operation.results[0]) == BindingTime.DYNAMIC
             and vtensor_shape(op.operation.operands[1].type)[1] == "f32"
             and _merge(op.operation.operands[1]) is not None]
    for index, op in enumerate(found):
        names = argument_names(func, op.operands[1])
        mine = [s["lora_A"] for s in sites if s["lora_A"] in names or s["lora_B"] in names]
        requantize(op, f"quantization_error.{index}", mine)
        stats["requantize-merged"] += 1
    erase_dead_ops(block)


@register("requantize-merged", "re-quantize LoRA merges into int8 weights and measure their error")
def run(module_op, options, stats) -> None:
    sites = facts.get(module_op, facts.SITES, [])
    for func in programs(module_op):
        if program_of(func) == facts.MAIN:
            run_on(func, sites, stats)
