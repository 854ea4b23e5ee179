"""bt-verify: check the binding-time invariants; fails with the op's location.

Congruence: no operation is earlier than any of its operands. Once lifts
exist, a tensor crosses to a later stage only through a `bt.lift` (or a
`bt.gather`) whose `from` is its operand's time and whose `to` is later.
No recomputation: an op later than all its operands (seen through lifts, at
the time they were computed) would redo earlier-stage work at every call of
its stage; only an effectful op may be (a random draw is request-time), and a
widening cast of an integer weight that defer-dequant marked `bt.deferred`.
"""

from torch_mlir import ir

from stageml.compiler.ir import TIME, is_effectful, is_rematerializable, parse_time, value_time
from stageml.compiler.passes import programs, register
from stageml.compiler.passes.defer_dequant import DEFERRED, is_widening_cast
from stageml.errors import CompileError

CROSSINGS = ("bt.lift", "bt.gather")  # the ops that carry a value to a later stage


def _fail(op, message):
    raise CompileError(f"bt-verify: {op.location}: '{op.name}' {message}")


def _origin(value):
    """When `value` was computed: a lift's operand time, else the value's own."""
    owner = value.owner
    if not isinstance(owner, ir.Block) and owner.name == "bt.lift":
        return parse_time(owner.attributes["from"])
    return value_time(value)


def verify(func) -> None:
    ops = [op.operation for op in func.regions[0].blocks[0].operations]
    lifted = any(op.name in CROSSINGS for op in ops)
    for op in ops:
        if op.name == "func.return":
            continue
        if TIME not in op.attributes:
            _fail(op, "has no binding time: run bt-propagate first")
        time = parse_time(op.attributes[TIME])
        for index, value in enumerate(op.operands):
            source = value_time(value)
            if source > time:
                _fail(op, f"is {time.label} but uses a {source.label} operand")
            if op.name in CROSSINGS and index == 0:
                if parse_time(op.attributes["from"]) != source or parse_time(op.attributes["to"]) <= source:
                    _fail(op, f"lifts a {source.label} value from {parse_time(op.attributes['from']).label} "
                              f"to {parse_time(op.attributes['to']).label}: a lift must go to a later time")
            elif lifted and source < time and not is_rematerializable(value):
                _fail(op, f"is {time.label} and uses a {source.label} operand without a bt.lift")
        if DEFERRED in op.attributes:
            if not is_widening_cast(op):
                _fail(op, "is marked bt.deferred, which only a widening cast of an integer tensor may be "
                          "(defer-dequant)")
            continue
        tensors = [v for v in op.operands if not is_rematerializable(v)]
        if (op.name not in CROSSINGS and tensors and not is_effectful(op)
                and max(_origin(v) for v in tensors) < time):
            _fail(op, f"is {time.label} but only reads {max(_origin(v) for v in tensors).label} values: "
                      f"it would recompute earlier-stage work on every call (bt-propagate makes it earlier)")


@register("bt-verify", "check congruence and explicit stage crossings")
def run(module_op, options, stats) -> None:
    for func in programs(module_op):
        verify(func)
