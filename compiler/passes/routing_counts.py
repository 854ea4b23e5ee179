"""routing-counts: the multi-tenant request-time programs report where their routed rows went.

At each MoE layer with expert LoRA, bt-gather indexes the per-tenant expert
factors by entry ids `slot·E + e` in the factorized program; the main
program (one tenant, served merged) gathers that tenant's merged expert
stacks by the routed expert ids `e`. This pass counts the rows of each
entry and returns the counts per layer beside the model's outputs, `[slots,
E]` from the factorized program and `[1, E]` from the main one, so that the
runtime knows how many tokens each (tenant, expert) pair served (for the cost
policy and `mod.plan()`):

    %g = "bt.gather"(%f, %entry) {stack = "slot_entries", ...} : [E,K,R], [?] -> [?,K,R]
    return %y
  → %hit = torch.aten.eq.Tensor (unsqueeze %entry, 1), %iota     // [?, S·E]; %iota = [0 .. S·E-1]
    %n = torch.aten.sum.dim_IntList %hit, [0], false, int64        // [S·E]
    %c = torch.aten.view %n, [S, E]
    return %y, %c      // result facts: {bt.kind = "routing", bt.name = "routing.0",
                       //                bt.sites = [lora_A names of the sites it routes]}

(in the main program, the gathers are `bt.gather(%merged, %e) {stack = "leading"}`
of a stack computed from expert sites' factors, and S = 1). Every gather
sharing one ids value is one layer's routing; its sites are those whose factor
arguments the gathered values are computed from.
"""

import numpy as np
from torch_mlir import ir
from torch_mlir.dialects import func as func_d
from torch_mlir.dialects import torch as torch_d

from stageml.compiler import facts
from stageml.compiler.ir import argument_names, const_int, timed, vtensor_shape, vtensor_type
from stageml.compiler.passes import program_of, programs, register
from stageml.compiler.passes.bt_gather import SLOT_ENTRIES
from stageml.compiler.passes.bt_stacks import LEADING

_INT64 = 4           # torch's dtype code of int64


def _counts(entry: ir.Value, slots: int, experts: int) -> ir.Value:
    """[slots, experts] si64: how many of `entry`'s rows hold each entry id slot·E + e."""
    rows, entries = vtensor_shape(entry.type)[0][0], slots * experts
    iota = timed(torch_d.ValueTensorLiteralOp(ir.DenseElementsAttr.get(
        np.arange(entries, dtype=np.int64), signless=False, type=ir.IntegerType.get_signed(64))))
    column = timed(torch_d.AtenUnsqueezeOp(vtensor_type([rows, 1], "si64"), entry, const_int(1, annotate=True)))
    hit = timed(torch_d.AtenEqTensorOp(vtensor_type([rows, entries], "i1"), column, iota))
    dims = timed(torch_d.PrimListConstructOp(ir.Type.parse("!torch.list<int>"), [const_int(0, annotate=True)]))
    false = timed(torch_d.ConstantBoolOp(False))
    total = timed(torch_d.AtenSumDimIntListOp(vtensor_type([entries], "si64"), hit, dims, false,
                                              const_int(_INT64, annotate=True)))
    shape = timed(torch_d.PrimListConstructOp(ir.Type.parse("!torch.list<int>"),
                                              [const_int(slots, annotate=True),
                                               const_int(experts, annotate=True)]))
    return timed(torch_d.AtenViewOp(vtensor_type([slots, experts], "si64"), total, shape))


def count(func, sites: list, slots: int, stack: str) -> int:
    """Appends one counts result per routed layer to `func` (its gathers of `stack`, `slots`
    copies a layer); returns how many."""
    block = func.regions[0].blocks[0]
    layers = {}  # entry ids -> (experts, the sites' lora_A names), in program order
    for op in block.operations:
        op = op.operation
        if op.name != "bt.gather" or ir.StringAttr(op.attributes["stack"]).value != stack:
            continue
        names = argument_names(func, op.operands[0])
        _, known = layers.setdefault(op.operands[1], (vtensor_shape(op.operands[0].type)[0][0], []))
        known.extend(s["lora_A"] for s in sites if s["experts"] and s["lora_A"] not in known
                     and (s["lora_A"] in names or s["lora_B"] in names))
    layers = {entry: layer for entry, layer in layers.items() if layer[1]}  # (a stack no site adapts: no tenant's)
    if not layers:
        return 0
    ret = list(block.operations)[-1]
    with ir.InsertionPoint(ret), ret.location:
        counted = [_counts(entry, slots, experts) for entry, (experts, _) in layers.items()]
        func_d.ReturnOp(list(ret.operands) + counted)
    outputs = len(ret.operands)
    ret.erase()
    fn_type = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
    func.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(
        fn_type.inputs, list(fn_type.results) + [c.type for c in counted]))
    for i, (_, names) in enumerate(layers.values()):
        facts.set_facts(func, "res", outputs + i, kind=facts.ROUTING, name=f"{facts.ROUTING}.{i}", sites=names)
    return len(counted)


@register("routing-counts", "multi-tenant programs: return the rows routed to each (slot, expert) per MoE layer")
def run(module_op, options, stats) -> None:
    sites, tenants = facts.get(module_op, facts.SITES, []), facts.get(module_op, facts.TENANTS)
    if tenants is None:
        return
    for func in programs(module_op):
        if program_of(func) == facts.FACTORIZED:
            stats["routing-counts"] += count(func, sites, tenants["max_adapters"] + 1, SLOT_ENTRIES)
        else:
            stats["routing-counts"] += count(func, sites, 1, LEADING)
