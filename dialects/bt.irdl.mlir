// The binding-time dialect.
//
//   #bt.time<"static" | "adapter" | "dynamic">   when a value becomes known;
//       carried as the `bt.time` attribute on ops and function arguments.
//   "bt.lift"(%v) {from, to, name}               %v, computed at `from`, is
//       used at the later time `to`; after bt-split each lift is a stage
//       boundary (a parameter or per-adapter state) called `name`.
//   "bt.gather"(%v, %ids) {from, to, name, stack} an earlier-stage stack
//       indexed by request-time ids: row i of the result is entry %ids[i] of
//       the stack. `stack` says which stack: "slots", the per-slot copies of
//       %v (one per loaded adapter; after bt-split a resident table, written
//       at adapter load), "leading", %v's own leading dimension (an expert
//       stack; tenant·E + expert for virtual experts), or "slot_entries", the
//       entries of the per-slot copies of a leading stack %v [E, ...]: row i
//       is entry %ids[i] = slot·E + e of the [slots·E, ...] table (a tenant's
//       LoRA factors of expert e). One lowering family (index_select by ids,
//       BGMV / grouped products) serves all three.
//   "bt.measure"(%v) {name, sites}               %v is a measurement its stage
//       reports to the runtime, not an input of any later stage: after
//       bt-split a result of the stage's function of kind "measure" called
//       `name`, about the LoRA sites `sites` (their lora_A names).
//
// The operand and result of bt.lift share one constraint variable, so their
// types must be equal; `from < to` is checked by bt-verify. A "slots"
// gather's result has one more (leading, row) dimension than its value; the
// others' have the value's rank (rows in place of the stack's entries).
irdl.dialect @bt {
  irdl.attribute @time {
    %static = irdl.is "static"
    %adapter = irdl.is "adapter"
    %dynamic = irdl.is "dynamic"
    %any_time = irdl.any_of(%static, %adapter, %dynamic)
    irdl.parameters(value: %any_time)
  }

  irdl.operation @lift {
    %type = irdl.any
    %from = irdl.base @bt::@time
    %to = irdl.base @bt::@time
    %name = irdl.base "#builtin.string"
    irdl.operands(value: %type)
    irdl.results(lifted: %type)
    irdl.attributes {"from" = %from, "to" = %to, "name" = %name}
  }

  irdl.operation @gather {
    %value = irdl.any
    %ids = irdl.any
    %rows = irdl.any
    %from = irdl.base @bt::@time
    %to = irdl.base @bt::@time
    %name = irdl.base "#builtin.string"
    %slots = irdl.is "slots"
    %leading = irdl.is "leading"
    %slot_entries = irdl.is "slot_entries"
    %stack = irdl.any_of(%slots, %leading, %slot_entries)
    irdl.operands(value: %value, ids: %ids)
    irdl.results(rows: %rows)
    irdl.attributes {"from" = %from, "to" = %to, "name" = %name, "stack" = %stack}
  }

  irdl.operation @measure {
    %value = irdl.any
    %name = irdl.base "#builtin.string"
    %sites = irdl.base "#builtin.array"
    irdl.operands(value: %value)
    irdl.attributes {"name" = %name, "sites" = %sites}
  }
}
