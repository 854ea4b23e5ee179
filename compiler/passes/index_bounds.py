"""index-bounds: every index into a table stays inside the table.

An index a request (or an adapter load) supplies — a token id into an
embedding, a row's adapter slot into a resident table, a routed expert —
must never read outside its table, whatever the caller sends. Each
indexing op of a stage function gets its indices clamped into the indexed
dimension's range (wrapped modulo its size where PyTorch allows negative
indices), and a stage argument used directly as indices records the values
it may take (`bt.range`, inclusive), so the runtime can refuse a bad
request with an error instead of a clamped answer:

    func @forward(%w : [128,64] {bt.kind = "parameter"}, %ids : [?,?] si64 {bt.kind = "input"}) {
      %e = torch.aten.embedding %w, %ids, ...
  → func @forward(%w, %ids {bt.kind = "input", bt.range = {min = 0, max = 127}}) {
      %c = torch.aten.clamp %ids, 0, (size(%w, 0) - 1)
      %e = torch.aten.embedding %w, %c, ...

Handled: aten.embedding, aten.index_select, aten.gather (clamped to
[0, n-1]: PyTorch rejects negative indices there) and aten.index.Tensor and
aten.index_put, a write (remainder modulo n: PyTorch wraps negative
indices). A table's row count
is its static size, or for resident state the declared slot count
(`bt.resident`); a dynamic size is read at run time (no `bt.range` then).
"""

from torch_mlir import ir
from torch_mlir.dialects import torch as torch_d

from stageml.compiler import facts
from stageml.compiler.ir import const_int, constant, vtensor_shape
from stageml.compiler.passes import register

# op name → (operand holding the indexed dimension, or None: dimension 0; operand holding the indices)
_CLAMPED = {"torch.aten.embedding": (None, 1), "torch.aten.index_select": (1, 2), "torch.aten.gather": (1, 2)}
# ops indexing dimension i with the i-th tensor of a list (None: that dimension whole)
_LISTED = ("torch.aten.index.Tensor", "torch.aten.index.Tensor_hacked_twin",  # reads
           "torch.aten.index_put", "torch.aten.index_put.hacked_twin")        # writes


def _static_rows(func, table, dim: int, resident: dict) -> int | None:
    """The table's size along `dim` when it is known now."""
    dims, _ = vtensor_shape(table.type)
    if dim < len(dims) and dims[dim] is not None:
        return dims[dim]
    if isinstance(table.owner, ir.Block):
        entry = facts.facts(func, "arg", table.arg_number)
        declared = resident.get(entry.get("name")) if entry.get("kind") == facts.RESIDENT_KIND else None
        if declared is not None and dim < len(declared["shape"]):
            return declared["shape"][dim]
    return None


def _bounded(index, table, dim: int, rows: int | None, wrap: bool) -> ir.Value:
    """`index` clamped (or wrapped) into [0, rows of `table` along `dim`)."""
    def size():
        return const_int(rows) if rows is not None else torch_d.AtenSizeIntOp(table, const_int(dim)).result
    if wrap:
        return torch_d.AtenRemainderScalarOp(index.type, index, size()).result
    last = const_int(rows - 1) if rows is not None else torch_d.AtenSubIntOp(size(), const_int(1)).result
    return torch_d.AtenClampOp(index.type, index, const_int(0), last).result


def _record_range(func, index, rows: int | None, wrap: bool, ranges: dict) -> None:
    """Narrows the `bt.range` of `index` when it is a stage argument and `rows` is known."""
    if not isinstance(index.owner, ir.Block) or rows is None:
        return
    entry = facts.facts(func, "arg", index.arg_number)
    if entry.get("kind") not in (facts.INPUT, facts.SLOT):
        return
    low, high = (-rows if wrap else 0), rows - 1
    old = ranges.get(index.arg_number, entry.get("range"))
    if old is not None:
        low, high = max(low, old["min"]), min(high, old["max"])
    ranges[index.arg_number] = {"min": low, "max": high}


def _bound_indices(func, op, resident: dict, ranges: dict, cache: dict) -> int:
    """Bounds the indices of one indexing op (the table is operand 0); returns how many it bounded."""
    table = op.operands[0]
    if op.name in _LISTED:
        listed = op.operands[1].owner
        if isinstance(listed, ir.Block) or listed.name != "torch.prim.ListConstruct":
            return 0
        indices = [(d, v) for d, v in enumerate(listed.operands) if not str(v.type).startswith("!torch.none")]
    else:
        dim_at, index_at = _CLAMPED[op.name]
        dim = 0 if dim_at is None else constant(op.operands[dim_at])
        if dim is None:
            return 0
        indices = [(dim, op.operands[index_at])]
    wrap = op.name in _LISTED
    with ir.InsertionPoint(op), op.location:
        bounded = {}
        for dim, index in indices:
            dim = dim + len(vtensor_shape(table.type)[0]) if dim < 0 else dim
            rows = _static_rows(func, table, dim, resident)
            _record_range(func, index, rows, wrap, ranges)
            key = (index, rows, wrap)  # one clamp of an index for every table of the same size
            if rows is None or key not in cache:
                cache[key] = _bounded(index, table, dim, rows, wrap)
            bounded[dim] = cache[key]
        if op.name in _LISTED:
            elements = [bounded.get(d, v) for d, v in enumerate(listed.operands)]
            op.operands[1] = torch_d.PrimListConstructOp(listed.result.type, elements).result
        else:
            op.operands[index_at] = bounded[next(iter(bounded))]
    return len(bounded)


@register("index-bounds", "clamp every table index into its table and record the values each "
          "index argument may take (bt.range)")
def run(module_op, options, stats) -> None:
    resident = {e["name"]: e for e in facts.get(module_op, facts.RESIDENT, [])}
    for func in facts.stage_functions(module_op):
        ranges, cache = {}, {}
        ops = [op.operation for op in func.regions[0].blocks[0].operations
               if op.operation.name in _CLAMPED or op.operation.name in _LISTED]
        for op in ops:
            stats["index-bounds"] += _bound_indices(func, op, resident, ranges, cache)
        for index, values in ranges.items():
            facts.set_facts(func, "arg", index, range=values)
