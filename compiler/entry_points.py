"""Entry points as the final IR describes them: what the manifest records and
the runtime calls, read from the stage functions' facts and types."""

from stageml.compiler import facts


def _dtype(ir, element) -> str:
    for cls, name in ((ir.F32Type, "float32"), (ir.F16Type, "float16"), (ir.BF16Type, "bfloat16"),
                      (ir.F64Type, "float64")):
        if isinstance(element, cls):
            return name
    if isinstance(element, ir.IntegerType):
        width = ir.IntegerType(element).width
        return "bool" if width == 1 else f"{'uint' if ir.IntegerType(element).is_unsigned else 'int'}{width}"
    raise ValueError(f"element type {element} has no numpy dtype")


def tensor_spec(type_) -> dict:
    """{"shape": [..., None for dynamic], "dtype": numpy name} of a tensor (or scalar) type."""
    ir = facts._ir(type_)
    if not isinstance(type_, ir.RankedTensorType):
        return {"shape": [], "dtype": _dtype(ir, type_)}
    t = ir.RankedTensorType(type_)
    return {"shape": [None if t.is_dynamic_dim(i) else t.shape[i] for i in range(t.rank)],
            "dtype": _dtype(ir, t.element_type)}


def describe(func) -> dict:
    """One stage function: symbol, stage, program, arguments and results in call order."""
    ir = facts._ir(func)
    fn_type = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
    return {"symbol": facts.symbol(func), "stage": facts.get(func, facts.STAGE),
            "program": facts.get(func, facts.PROGRAM),
            "arguments": [{**facts.facts(func, "arg", i), **tensor_spec(t)} for i, t in enumerate(fn_type.inputs)],
            "results": [{**facts.facts(func, "res", i), **tensor_spec(t)} for i, t in enumerate(fn_type.results)]}


def entry_points_of(module_op) -> list:
    """The functions that are entry points of the residual (its adapter and request-time stages)."""
    return [f for f in facts.stage_functions(module_op) if facts.get(f, facts.STAGE) != "static"]


def entry_points(module_op) -> list:
    """Every entry point of the residual, described."""
    return [describe(f) for f in entry_points_of(module_op)]


def routing_sites(described: list, program: str = facts.FACTORIZED) -> list:
    """The sites (lora_A names) of each MoE layer whose routing `program`'s request-time
    entry point returns (routing-counts), in its result order; [] without one."""
    return [r["sites"] for e in described if e["stage"] == "dynamic" and e["program"] == program
            for r in e["results"] if r["kind"] == facts.ROUTING]


def tenants(module_op) -> dict | None:
    """The multi-tenant configuration: {"max_adapters", "max_rank", "sites", "unread"}, or None."""
    configured = facts.get(module_op, facts.TENANTS)
    return None if configured is None else {**configured, "sites": facts.get(module_op, facts.SITES, []),
                                              "unread": facts.get(module_op, facts.UNREAD_FACTORS, [])}


def parameters(module_op) -> list:
    """The names of the parameters the residual reads: its parameter globals, and the starts of
    the buffers it keeps (resident-state)."""
    return [facts.get(op.operation, facts.NAME) for op in module_op.regions[0].blocks[0].operations
            if facts.get(op.operation, facts.KIND) in (facts.PARAMETER, facts.BUFFER)]
