"""factorized-program: a multi-tenant compile's second program.

The "main" program is cloned into a "factorized" one, which later passes
treat by its role: bt-improve leaves its LoRA sites unmerged and bt-gather
serves each request row from its own adapter's factors.

    func.func @main(...) attributes {bt.program = "main"}
  → func.func @main(...) attributes {bt.program = "main"}
    func.func @main_factorized(...) attributes {bt.program = "factorized"}
"""

from torch_mlir import ir

from stageml.compiler import facts
from stageml.compiler.passes import programs, register


@register("factorized-program", "multi-tenant: clone the main program into a factorized one")
def run(module_op, options, stats) -> None:
    for func in programs(module_op):
        if facts.get(func, facts.PROGRAM) != facts.MAIN:
            continue
        clone = func.clone(ip=ir.InsertionPoint(func))
        clone.move_after(func)
        facts.put(clone, "sym_name", f"{facts.symbol(func)}_{facts.FACTORIZED}")
        facts.put(clone, facts.PROGRAM, facts.FACTORIZED)
        stats["factorized-program"] += 1
