// The plan dialect: a multi-tenant MoE residual's serving plan as IR.
//
//   "plan.summary"() {policy, budget, bytes_held}    the policy ("auto",
//       "merged" or "factorized"), the adapter memory budget in bytes (unit:
//       no limit) and the bytes the adapters hold;
//   "plan.layer"() {layer, sites, experts, factorized_bytes, merged_bytes,
//       lora_flops}                                   one MoE layer: its LoRA
//       sites (lora_A names), its expert count and, per (tenant, expert), the
//       bytes of its factors and of a merged copy, and the FLOPs its factors
//       add per routed row;
//   "plan.pair"() {layer, tenant, expert, form, bytes, tokens, reason}
//       one (layer, tenant, expert): its form ("factorized", "merged" or
//       "evicted"), the bytes held for it, the rows routed to it, and why.
//
// A plan is a module of these ops (stageml.dialects.plan writes and reads it).
// Each attribute has a constraint value of its own: attributes that shared one
// would have to be equal.
irdl.dialect @plan {
  irdl.operation @summary {
    %auto = irdl.is "auto"
    %merged = irdl.is "merged"
    %factorized = irdl.is "factorized"
    %policy = irdl.any_of(%auto, %merged, %factorized)
    %limit = irdl.base "#builtin.integer"
    %unlimited = irdl.base "#builtin.unit"
    %budget = irdl.any_of(%limit, %unlimited)
    %bytes_held = irdl.base "#builtin.integer"
    irdl.attributes {"policy" = %policy, "budget" = %budget, "bytes_held" = %bytes_held}
  }

  irdl.operation @layer {
    %layer = irdl.base "#builtin.integer"
    %sites = irdl.base "#builtin.array"
    %experts = irdl.base "#builtin.integer"
    %factorized_bytes = irdl.base "#builtin.integer"
    %merged_bytes = irdl.base "#builtin.integer"
    %lora_flops = irdl.base "#builtin.integer"
    irdl.attributes {"layer" = %layer, "sites" = %sites, "experts" = %experts,
                     "factorized_bytes" = %factorized_bytes, "merged_bytes" = %merged_bytes,
                     "lora_flops" = %lora_flops}
  }

  irdl.operation @pair {
    %layer = irdl.base "#builtin.integer"
    %tenant = irdl.base "#builtin.string"
    %expert = irdl.base "#builtin.integer"
    %factorized = irdl.is "factorized"
    %merged = irdl.is "merged"
    %evicted = irdl.is "evicted"
    %form = irdl.any_of(%factorized, %merged, %evicted)
    %bytes = irdl.base "#builtin.integer"
    %tokens = irdl.base "#builtin.integer"
    %reason = irdl.base "#builtin.string"
    irdl.attributes {"layer" = %layer, "tenant" = %tenant, "expert" = %expert, "form" = %form,
                     "bytes" = %bytes, "tokens" = %tokens, "reason" = %reason}
  }
}
