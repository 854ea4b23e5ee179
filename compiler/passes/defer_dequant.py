"""defer-dequant: an integer weight is converted to floats where it is used, so
the stages hold it in its own, narrower type.

An int8 weight cast to floats (compiler/quantized.py's export form of torchao's
weight-only layers) is static work: bt-propagate gives the cast the static time,
and bt-split would fold its result into a float parameter of four times the
int8 bytes (twice for f16). The cast costs little beside the product that reads
it (IREE fuses it into the product's dispatch). So each widening cast of an
earlier-stage integer tensor takes the earliest time of its users instead,
marked `bt.deferred`; layout work on the integer tensor (its transpose) stays
static and is folded in the integer type:

    %t = torch.aten.permute %q, %dims : [N,K] si8 -> [K,N] si8     {bt.time = static}
    %w = torch.aten.to.dtype %t, %int6, ... : [K,N] si8 -> [K,N] f32  {bt.time = static}
    %y = torch.aten.matmul %x, %w                                   {bt.time = dynamic}
  → %w = torch.aten.to.dtype %t, %int6, ... {bt.deferred, bt.time = dynamic}

The residual then receives %t as an int8 parameter. Where a merged LoRA weight
reads the cast (`W*v + s·A@B`), its users are adapter-time and so is the cast:
the static stage still keeps the int8 weight. bt-verify accepts a deferred op's
recomputation of earlier-stage values for such casts only (`is_widening_cast`).
"""

from torch_mlir import ir

from stageml.compiler.ir import TIME, parse_time, set_op_time, users, value_time, vtensor_shape
from stageml.compiler.passes import programs, register

DEFERRED = "bt.deferred"
_BITS = {"si8": 8, "ui8": 8, "si16": 16, "si32": 32, "si64": 64, "f16": 16, "bf16": 16, "f32": 32, "f64": 64}
_CASTS = ("torch.aten.to.dtype", "torch.prims.convert_element_type")


def is_widening_cast(op) -> bool:
    """Whether `op` converts an integer tensor to a float type of more bits."""
    if op.name not in _CASTS or len(op.results) != 1 or not str(op.operands[0].type).startswith("!torch.vtensor"):
        return False
    source, target = vtensor_shape(op.operands[0].type)[1], vtensor_shape(op.results[0].type)[1]
    return (source.startswith(("si", "ui")) and not target.startswith(("si", "ui", "i"))
            and _BITS.get(source, 64) < _BITS.get(target, 0))


def defer(func, stats) -> None:
    for op in func.regions[0].blocks[0].operations:
        op = op.operation
        if not is_widening_cast(op) or not users(op.results[0]):
            continue
        own = value_time(op.results[0])
        earliest = min(parse_time(user.attributes[TIME]) if TIME in user.attributes else own
                       for user in users(op.results[0]))
        if earliest > own:
            set_op_time(op, earliest)
            op.attributes[DEFERRED] = ir.UnitAttr.get()
            stats["deferred-dequant"] += 1


@register("defer-dequant", "convert earlier-stage integer weights to floats where they are used")
def run(module_op, options, stats) -> None:
    for func in programs(module_op):
        defer(func, stats)
