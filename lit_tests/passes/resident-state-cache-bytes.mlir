// RUN: stageml-opt %s -p resident-state | filecheck %s

// A generation step's buffers are its KV cache: their bytes (here 2 x 4 x 8
// f16 keys and values, 256 bytes) join the module's bt.generation.

// CHECK: module attributes {bt.generation = {cache_bytes = 256 : i64, max_seq = 8 : i64, sequences = 2 : i64}}
// CHECK-DAG: util.global private mutable @buffer.cache.k0 {bt.kind = "buffer", bt.name = "cache.k0"} = #flow.parameter.named<"model"::"cache.k0"> : tensor<2x4x8xf16>
// CHECK-DAG: util.global private mutable @buffer.cache.v0 {bt.kind = "buffer", bt.name = "cache.v0"} = #flow.parameter.named<"model"::"cache.v0"> : tensor<2x4x8xf16>

module attributes {bt.generation = {max_seq = 8 : i64, sequences = 2 : i64}} {
  func.func @forward(%ids: tensor<?xi64> {bt.kind = "input", bt.name = "ids"}, %k: tensor<2x4x8xf16> {bt.kind = "buffer", bt.name = "cache.k0"}, %v: tensor<2x4x8xf16> {bt.kind = "buffer", bt.name = "cache.v0"}) -> (tensor<2x4x8xf16> {bt.kind = "buffer", bt.name = "cache.k0"}, tensor<2x4x8xf16> {bt.kind = "buffer", bt.name = "cache.v0"}, tensor<?xi64> {bt.kind = "output", bt.name = "output.0"}) attributes {bt.program = "main", bt.stage = "dynamic"} {
    %k2 = arith.addf %k, %k : tensor<2x4x8xf16>
    return %k2, %v, %ids : tensor<2x4x8xf16>, tensor<2x4x8xf16>, tensor<?xi64>
  }
}
