// RUN: stageml-opt %s | filecheck %s
// RUN: stageml-opt %s | stageml-opt | filecheck %s

// A serving plan (mod.plan("mlir")): the policy and budget (unit: no limit),
// one MoE layer with its sites and per-(tenant, expert) costs, and its
// (tenant, expert) pairs. It verifies, and its printed form parses again.

// CHECK:      "plan.summary"() {budget, bytes_held = 2048 : i64, policy = "auto"} : () -> ()
// CHECK-NEXT: "plan.layer"() {experts = 4 : i64, factorized_bytes = 512 : i64, layer = 0 : i64, lora_flops = 256 : i64, merged_bytes = 9216 : i64, sites = ["layers.0.mlp.experts.base_layer.lora_A.weight", "layers.0.mlp.experts.lora_A.weight"]} : () -> ()
// CHECK-NEXT: "plan.pair"() {bytes = 512 : i64, expert = 0 : i64, form = "factorized", layer = 0 : i64, reason = "no traffic since the last re-plan", tenant = "a", tokens = 0 : i64} : () -> ()
// CHECK-NEXT: "plan.pair"() {bytes = 9728 : i64, expert = 1 : i64, form = "merged", layer = 0 : i64, reason = "merging saves 4096 request-time FLOPs for 36864 bytes", tenant = "b", tokens = 16 : i64} : () -> ()
// CHECK-NEXT: "plan.pair"() {bytes = 0 : i64, expert = 2 : i64, form = "evicted", layer = 0 : i64, reason = "evicted (least recently used): reloaded when next used", tenant = "c", tokens = 3 : i64} : () -> ()
"plan.summary"() {policy = "auto", budget, bytes_held = 2048 : i64} : () -> ()
"plan.layer"() {layer = 0 : i64, sites = ["layers.0.mlp.experts.base_layer.lora_A.weight", "layers.0.mlp.experts.lora_A.weight"], experts = 4 : i64, factorized_bytes = 512 : i64, merged_bytes = 9216 : i64, lora_flops = 256 : i64} : () -> ()
"plan.pair"() {layer = 0 : i64, tenant = "a", expert = 0 : i64, form = "factorized", bytes = 512 : i64, tokens = 0 : i64, reason = "no traffic since the last re-plan"} : () -> ()
"plan.pair"() {layer = 0 : i64, tenant = "b", expert = 1 : i64, form = "merged", bytes = 9728 : i64, tokens = 16 : i64, reason = "merging saves 4096 request-time FLOPs for 36864 bytes"} : () -> ()
"plan.pair"() {layer = 0 : i64, tenant = "c", expert = 2 : i64, form = "evicted", bytes = 0 : i64, tokens = 3 : i64, reason = "evicted (least recently used): reloaded when next used"} : () -> ()
