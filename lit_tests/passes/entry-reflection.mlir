// RUN: stageml-opt %s -p entry-reflection | filecheck %s

// The residual's IREE input after every other pass. Each entry point (an
// adapter or request-time stage function) records its own description in
// iree.reflection (stageml.entry: stage, program, arguments and results in
// call order with their facts, shapes and dtypes, as JSON with sorted
// keys), which the compiled .vmfb keeps. The function that owns the
// resident slot tables (@adapter_factorized: bt.resident's owner in its
// program) also records the multi-tenant configuration (stageml.tenants).
// Other functions are left alone.

// CHECK-LABEL: func.func @forward_factorized
// CHECK-SAME:    iree.reflection = {stageml.entry = "{\22arguments\22: [{\22dims\22: [{\22max\22: 16, \22min\22: 0}, {\22max\22: 8, \22min\22: 8}], \22dtype\22: \22float32\22, \22kind\22: \22input\22, \22name\22: \22x\22, \22shape\22: [null, 8]}, {\22dtype\22: \22int64\22, \22kind\22: \22input\22, \22name\22: \22adapter_ids\22, \22range\22: {\22max\22: 2, \22min\22: 0}, \22shape\22: [null]}], \22program\22: \22factorized\22, \22results\22: [{\22dtype\22: \22float32\22, \22kind\22: \22output\22, \22name\22: \22output.0\22, \22shape\22: [null, 8]}], \22stage\22: \22dynamic\22, \22symbol\22: \22forward_factorized\22}"}
// CHECK-NOT:     stageml.tenants
// CHECK-LABEL: func.func @adapter_factorized
// CHECK-SAME:    iree.reflection = {stageml.entry = "{\22arguments\22: [{\22dtype\22: \22float32\22, \22kind\22: \22input\22, \22name\22: \22fc.lora_A.default.weight\22, \22shape\22: [4, 8]}, {\22dtype\22: \22int64\22, \22kind\22: \22slot\22, \22name\22: \22slot\22, \22range\22: {\22max\22: 2, \22min\22: 1}, \22shape\22: []}], \22program\22: \22factorized\22, \22results\22: [], \22stage\22: \22adapter\22, \22symbol\22: \22adapter_factorized\22}",
// CHECK-SAME:                      stageml.tenants = "{\22max_adapters\22: 2, \22max_rank\22: 4, \22sites\22: [{\22dtype\22: \22float32\22, \22experts\22: 0, \22in_features\22: 8, \22lora_A\22: \22fc.lora_A.default.weight\22, \22lora_B\22: \22fc.lora_B.default.weight\22, \22out_features\22: 8, \22rank\22: 4, \22scaling\22: 1.0}], \22unread\22: []}"}
// CHECK-LABEL: func.func private @helper
// CHECK-NOT:     iree.reflection

module attributes {bt.resident = [{dtype = "float32", name = "factorized.adapter.0", owner = "adapter", program = "factorized", shape = [3, 4, 8], slot_dim = 0 : i64}],
                   bt.sites = [{dtype = "float32", experts = 0 : i64, in_features = 8 : i64, lora_A = "fc.lora_A.default.weight", lora_B = "fc.lora_B.default.weight", out_features = 8 : i64, rank = 4 : i64, scaling = 1.000000e+00 : f64}],
                   bt.tenants = {max_adapters = 2 : i64, max_rank = 4 : i64},
                   bt.unread_factors = []} {
  func.func @forward_factorized(%arg0: tensor<?x8xf32> {bt.dims = [{max = 16 : i64, min = 0 : i64}, {max = 8 : i64, min = 8 : i64}], bt.kind = "input", bt.name = "x"},
                                %arg1: tensor<?xi64> {bt.kind = "input", bt.name = "adapter_ids", bt.range = {max = 2 : i64, min = 0 : i64}})
      -> (tensor<?x8xf32> {bt.kind = "output", bt.name = "output.0"}) attributes {bt.program = "factorized", bt.stage = "dynamic"} {
    return %arg0 : tensor<?x8xf32>
  }
  func.func @adapter_factorized(%arg0: tensor<4x8xf32> {bt.kind = "input", bt.name = "fc.lora_A.default.weight"},
                                %arg1: i64 {bt.kind = "slot", bt.name = "slot", bt.range = {max = 2 : i64, min = 1 : i64}})
      attributes {bt.program = "factorized", bt.stage = "adapter"} {
    return
  }
  func.func private @helper(%arg0: tensor<4xf32>) -> tensor<4xf32> {
    return %arg0 : tensor<4xf32>
  }
}
