"""use-parameters: the residual reads static values from parameter globals.

After partial evaluation has run @static, every static value a later stage
takes (a folded @static result or a weight used as it is) is a global
initialized from the parameter archive, and the static stage functions go:

    func.func @forward(%w: tensor<8x4xf32> {bt.kind = "parameter", bt.name = "static.0"}, %x ...)
  → util.global private @static.0 {bt.kind = "parameter", bt.name = "static.0"}
        = #flow.parameter.named<"model"::"static.0"> : tensor<8x4xf32>
    func.func @forward(%x ...) {
      %w = util.global.load @static.0 : tensor<8x4xf32> ... }

One global per parameter name, shared by every function that takes it.
"""

from iree.compiler import ir
from iree.compiler.dialects import tensor, util

from stageml.compiler import facts
from stageml.compiler.passes import register

SCOPE = "model"  # the parameter scope of the archive


def _global(module_op, name: str, type_, globals_: dict):
    if name not in globals_:
        with ir.InsertionPoint.at_block_begin(module_op.regions[0].blocks[0]):
            initial = ir.Attribute.parse(f'#flow.parameter.named<"{SCOPE}"::"{name}"> : {type_}')
            op = util.GlobalOp(name, type_, sym_visibility="private", initial_value=initial).operation
        facts.put(op, facts.NAME, name)
        facts.put(op, facts.KIND, facts.PARAMETER)
        globals_[name] = type_
    return globals_[name]


def use_parameters(module_op) -> int:
    """Rewrites every stage function; returns how many arguments became globals."""
    globals_, rewritten = {}, 0
    for func in facts.stage_functions(module_op, "static"):
        func.erase()
    for func in facts.stage_functions(module_op):
        block = func.regions[0].blocks[0]
        for index in reversed(range(len(block.arguments))):
            entry = facts.facts(func, "arg", index)
            if entry.get("kind") != facts.PARAMETER:
                continue
            arg = block.arguments[index]
            with ir.InsertionPoint.at_block_begin(block), func.location:
                type_ = _global(module_op, entry["name"], arg.type, globals_)
                value = util.GlobalLoadOp(type_, entry["name"]).result
                if value.type != arg.type:
                    value = tensor.CastOp(arg.type, value).result
            arg.replace_all_uses_with(value)
            facts.erase_argument(func, index)
            rewritten += 1
    return rewritten


@register("use-parameters", "static values of later stages become parameter globals; @static goes",
          context="iree")
def run(module_op, options, stats) -> None:
    with module_op.context, module_op.location:
        stats["parameters"] += use_parameters(module_op)
