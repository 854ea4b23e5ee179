// RUN: stageml-opt %s -p resident-state | filecheck %s
// RUN: stageml-opt %s -p resident-state | filecheck %s --check-prefix=NONE

// The module's declared resident state (bt.resident, from bt-split: here
// two f32 tables and one f16 table of the "factorized" program, 3 slots
// each) becomes device globals: one flat mutable table per element type,
// each entry a contiguous range of it (factorized.adapter.0 at 0, 3*16*4
// elements; factorized.adapter.1 at 192, 3*4*12; factorized.adapter.2 at 0
// of the f16 table, 3*4*2). The owning @adapter_factorized gets a slot
// argument (bt.kind = "slot", with the slots it may name: bt.range), checked
// before any write, and, instead of returning its resident
// results, writes each into its entry at that slot; @forward_factorized
// reads each resident argument as a view of its table. The "main" program
// (state, not resident) is left alone.

// CHECK-DAG:   util.global private mutable @resident.f32 = dense<0.000000e+00> : tensor<336xf32>
// CHECK-DAG:   util.global private mutable @resident.f16 = dense<0.000000e+00> : tensor<24xf16>

// CHECK-LABEL: func.func @adapter(
// CHECK-SAME:    %arg0: tensor<4x2xf16> {bt.kind = "input", bt.name = "gate.weight"}) -> (tensor<4x2xf16> {bt.kind = "state", bt.name = "adapter.0"})
// CHECK-NEXT:    return %arg0
// CHECK-LABEL: func.func @forward(
// CHECK-SAME:    %arg0: tensor<4x2xf16> {bt.kind = "state", bt.name = "adapter.0", bt.result = 0 : i64})
// CHECK-NEXT:    return %arg0

// CHECK-LABEL: func.func @adapter_factorized
// CHECK-SAME:    %arg2: tensor<4x2xf16> {bt.kind = "input", bt.name = "gate.weight"},
// No results any more: right after the slot argument come the attributes.
// CHECK-SAME:    %arg3: i64 {bt.kind = "slot", bt.name = "slot", bt.range = {max = 2 : i64, min = 1 : i64}}) attributes {bt.program = "factorized", bt.stage = "adapter"} {
// A slot outside the table (or slot 0, the base model's) fails the call before any write.
// CHECK:         %[[LOW:.+]] = arith.cmpi sge, %arg3, %c1_i64
// CHECK:         %[[HIGH:.+]] = arith.cmpi slt, %arg3, %c3_i64
// CHECK:         %[[OK:.+]] = arith.andi %[[LOW]], %[[HIGH]]
// CHECK-NEXT:    cf.assert %[[OK]], "adapter slot out of range [1, 2]"
// CHECK:         %[[AT:.+]] = linalg.transpose ins(%arg0
// CHECK:         %[[BT:.+]] = linalg.transpose ins(%arg1
// CHECK:         %[[SLOT:[0-9]+]] = arith.index_cast %arg3 : i64 to index
// CHECK:         %[[T32:.+]] = util.global.load @resident.f32 : tensor<336xf32>
// CHECK:         %[[A:.+]] = tensor.collapse_shape %[[AT]] {{\[\[}}0, 1]] : tensor<16x4xf32> into tensor<64xf32>
// CHECK:         %[[C64:.+]] = arith.constant 64 : index
// CHECK:         %[[R0:[0-9]+]] = arith.muli %[[SLOT]], %[[C64]] : index
// CHECK:         %[[C0:.+]] = arith.constant 0 : index
// CHECK:         %[[O0:[0-9]+]] = arith.addi %[[R0]], %[[C0]] : index
// CHECK:         %[[W0:.+]] = tensor.insert_slice %[[A]] into %[[T32]][%[[O0]]] [64] [1] : tensor<64xf32> into tensor<336xf32>
// CHECK:         %[[T16:.+]] = util.global.load @resident.f16 : tensor<24xf16>
// CHECK:         %[[G:.+]] = tensor.collapse_shape %arg2 {{\[\[}}0, 1]] : tensor<4x2xf16> into tensor<8xf16>
// CHECK:         %[[C8:.+]] = arith.constant 8 : index
// CHECK:         %[[R2:[0-9]+]] = arith.muli %[[SLOT]], %[[C8]] : index
// CHECK:         %[[O2:[0-9]+]] = arith.addi %[[R2]], %{{.+}} : index
// CHECK:         %[[W2:.+]] = tensor.insert_slice %[[G]] into %[[T16]][%[[O2]]] [8] [1] : tensor<8xf16> into tensor<24xf16>
// CHECK:         %[[B:.+]] = tensor.collapse_shape %[[BT]] {{\[\[}}0, 1]] : tensor<4x12xf32> into tensor<48xf32>
// CHECK:         %[[C48:.+]] = arith.constant 48 : index
// CHECK:         %[[R1:[0-9]+]] = arith.muli %[[SLOT]], %[[C48]] : index
// CHECK:         %[[C192:.+]] = arith.constant 192 : index
// CHECK:         %[[O1:[0-9]+]] = arith.addi %[[R1]], %[[C192]] : index
// The second f32 write updates the first's result: both land in one table.
// CHECK:         %[[W1:.+]] = tensor.insert_slice %[[B]] into %[[W0]][%[[O1]]] [48] [1] : tensor<48xf32> into tensor<336xf32>
// CHECK-DAG:     util.global.store %[[W1]], @resident.f32 : tensor<336xf32>
// CHECK-DAG:     util.global.store %[[W2]], @resident.f16 : tensor<24xf16>
// CHECK:         return{{$}}

// CHECK-LABEL: func.func @forward_factorized
// CHECK-SAME:    (%arg0: tensor<?xi64> {bt.kind = "input", bt.name = "adapter_ids"})
// CHECK-SAME:    -> (tensor<?x16x4xf32> {bt.kind = "output", bt.name = "output.0"}, tensor<?x4x12xf32> {bt.kind = "output", bt.name = "output.1"}, tensor<?x4x2xf16> {bt.kind = "output", bt.name = "output.2"})
// CHECK-DAG:     %[[L16:.+]] = util.global.load @resident.f16 : tensor<24xf16>
// CHECK-DAG:     %[[V2:.+]] = tensor.extract_slice %[[L16]][0] [24] [1] : tensor<24xf16> to tensor<24xf16>
// CHECK-DAG:     %[[E2:.+]] = tensor.expand_shape %[[V2]] {{\[\[}}0, 1, 2]] output_shape [3, 4, 2] : tensor<24xf16> into tensor<3x4x2xf16>
// CHECK-DAG:     %[[TAB2:.+]] = tensor.cast %[[E2]] : tensor<3x4x2xf16> to tensor<?x4x2xf16>
// CHECK-DAG:     %[[L32:.+]] = util.global.load @resident.f32 : tensor<336xf32>
// CHECK-DAG:     %[[V1:.+]] = tensor.extract_slice %[[L32]][192] [144] [1] : tensor<336xf32> to tensor<144xf32>
// CHECK-DAG:     %[[E1:.+]] = tensor.expand_shape %[[V1]] {{\[\[}}0, 1, 2]] output_shape [3, 4, 12] : tensor<144xf32> into tensor<3x4x12xf32>
// CHECK-DAG:     %[[TAB1:.+]] = tensor.cast %[[E1]] : tensor<3x4x12xf32> to tensor<?x4x12xf32>
// CHECK-DAG:     %[[V0:.+]] = tensor.extract_slice %[[L32]][0] [192] [1] : tensor<336xf32> to tensor<192xf32>
// CHECK-DAG:     %[[E0:.+]] = tensor.expand_shape %[[V0]] {{\[\[}}0, 1, 2]] output_shape [3, 16, 4] : tensor<192xf32> into tensor<3x16x4xf32>
// CHECK-DAG:     %[[TAB0:.+]] = tensor.cast %[[E0]] : tensor<3x16x4xf32> to tensor<?x16x4xf32>
// CHECK:         tensor.extract %[[TAB0]][
// CHECK:         tensor.extract %[[TAB1]][
// CHECK:         tensor.extract %[[TAB2]][

// No resident argument or result is left.
// NONE-NOT: bt.kind = "resident"
#map = affine_map<(d0, d1, d2) -> (d0)>
#map1 = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
module attributes {bt.resident = [{dtype = "float32", name = "factorized.adapter.0", owner = "adapter", program = "factorized", shape = [3, 16, 4], slot_dim = 0 : i64}, {dtype = "float32", name = "factorized.adapter.1", owner = "adapter", program = "factorized", shape = [3, 4, 12], slot_dim = 0 : i64}, {dtype = "float16", name = "factorized.adapter.2", owner = "adapter", program = "factorized", shape = [3, 4, 2], slot_dim = 0 : i64}], bt.tenants = {max_adapters = 2 : i64, max_rank = 4 : i64}} {
  func.func @adapter(%arg0: tensor<4x2xf16> {bt.kind = "input", bt.name = "gate.weight"}) -> (tensor<4x2xf16> {bt.kind = "state", bt.name = "adapter.0"}) attributes {bt.program = "main", bt.stage = "adapter"} {
    return %arg0 : tensor<4x2xf16>
  }
  func.func @forward(%arg0: tensor<4x2xf16> {bt.kind = "state", bt.name = "adapter.0", bt.result = 0 : i64}) -> (tensor<4x2xf16> {bt.kind = "output", bt.name = "output.0"}) attributes {bt.program = "main", bt.stage = "dynamic"} {
    return %arg0 : tensor<4x2xf16>
  }
  func.func @adapter_factorized(%arg0: tensor<4x16xf32> {bt.kind = "input", bt.name = "fc.lora_A.default.weight"}, %arg1: tensor<12x4xf32> {bt.kind = "input", bt.name = "fc.lora_B.default.weight"}, %arg2: tensor<4x2xf16> {bt.kind = "input", bt.name = "gate.weight"}) -> (tensor<16x4xf32> {bt.kind = "resident", bt.name = "factorized.adapter.0"}, tensor<4x2xf16> {bt.kind = "resident", bt.name = "factorized.adapter.2"}, tensor<4x12xf32> {bt.kind = "resident", bt.name = "factorized.adapter.1"}) attributes {bt.program = "factorized", bt.stage = "adapter"} {
    %0 = tensor.empty() : tensor<16x4xf32>
    %transposed = linalg.transpose ins(%arg0 : tensor<4x16xf32>) outs(%0 : tensor<16x4xf32>) permutation = [1, 0]
    %1 = tensor.empty() : tensor<4x12xf32>
    %transposed_0 = linalg.transpose ins(%arg1 : tensor<12x4xf32>) outs(%1 : tensor<4x12xf32>) permutation = [1, 0]
    return %transposed, %arg2, %transposed_0 : tensor<16x4xf32>, tensor<4x2xf16>, tensor<4x12xf32>
  }
  func.func @forward_factorized(%arg0: tensor<?x16x4xf32> {bt.kind = "resident", bt.name = "factorized.adapter.0"}, %arg1: tensor<?x4x12xf32> {bt.kind = "resident", bt.name = "factorized.adapter.1"}, %arg2: tensor<?x4x2xf16> {bt.kind = "resident", bt.name = "factorized.adapter.2"}, %arg3: tensor<?xi64> {bt.kind = "input", bt.name = "adapter_ids"}) -> (tensor<?x16x4xf32> {bt.kind = "output", bt.name = "output.0"}, tensor<?x4x12xf32> {bt.kind = "output", bt.name = "output.1"}, tensor<?x4x2xf16> {bt.kind = "output", bt.name = "output.2"}) attributes {bt.program = "factorized", bt.stage = "dynamic"} {
    %c0 = arith.constant 0 : index
    %dim = tensor.dim %arg3, %c0 : tensor<?xi64>
    %0 = tensor.empty(%dim) : tensor<?x16x4xf32>
    %1 = linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "parallel", "parallel"]} ins(%arg3 : tensor<?xi64>) outs(%0 : tensor<?x16x4xf32>) {
    ^bb0(%in: i64, %out: f32):
      %6 = arith.index_cast %in : i64 to index
      %7 = linalg.index 1 : index
      %8 = linalg.index 2 : index
      %extracted = tensor.extract %arg0[%6, %7, %8] : tensor<?x16x4xf32>
      linalg.yield %extracted : f32
    } -> tensor<?x16x4xf32>
    %2 = tensor.empty(%dim) : tensor<?x4x12xf32>
    %3 = linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "parallel", "parallel"]} ins(%arg3 : tensor<?xi64>) outs(%2 : tensor<?x4x12xf32>) {
    ^bb0(%in: i64, %out: f32):
      %6 = arith.index_cast %in : i64 to index
      %7 = linalg.index 1 : index
      %8 = linalg.index 2 : index
      %extracted = tensor.extract %arg1[%6, %7, %8] : tensor<?x4x12xf32>
      linalg.yield %extracted : f32
    } -> tensor<?x4x12xf32>
    %4 = tensor.empty(%dim) : tensor<?x4x2xf16>
    %5 = linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "parallel", "parallel"]} ins(%arg3 : tensor<?xi64>) outs(%4 : tensor<?x4x2xf16>) {
    ^bb0(%in: i64, %out: f16):
      %6 = arith.index_cast %in : i64 to index
      %7 = linalg.index 1 : index
      %8 = linalg.index 2 : index
      %extracted = tensor.extract %arg2[%6, %7, %8] : tensor<?x4x2xf16>
      linalg.yield %extracted : f16
    } -> tensor<?x4x2xf16>
    return %1, %3, %5 : tensor<?x16x4xf32>, tensor<?x4x12xf32>, tensor<?x4x2xf16>
  }
}
