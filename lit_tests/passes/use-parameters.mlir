// RUN: stageml-opt %s -p use-parameters | filecheck %s
// RUN: stageml-opt %s -p use-parameters | filecheck %s --check-prefix=NONE

// The residual (linalg on tensors, after partial evaluation has run
// @static) reads static values from parameter globals: each argument of
// kind "parameter" of a later stage (a folded @static result, static.0, or
// a weight used as it is, fc.bias) becomes a util.global initialized from
// the archive's "model" scope, carrying its facts, and a util.global.load
// at the top of each function that took it. One global per name, shared by
// @adapter and @forward. The static stage function goes (its weight,
// fc.weight, is no global). The other arguments (adapter-time inputs,
// state, request inputs) keep their places and facts, renumbered.

// CHECK-DAG:   util.global private @static.0 {bt.kind = "parameter", bt.name = "static.0"} = #flow.parameter.named<"model"::"static.0"> : tensor<16x12xf32>
// CHECK-DAG:   util.global private @fc.bias {bt.kind = "parameter", bt.name = "fc.bias"} = #flow.parameter.named<"model"::"fc.bias"> : tensor<12xf32>
// CHECK-NOT:   func.func @static
// CHECK-LABEL: func.func @adapter
// CHECK-SAME:    (%arg0: tensor<16x12xf32> {bt.kind = "input", bt.name = "fc.delta"})
// CHECK-SAME:    -> (tensor<16x12xf32> {bt.kind = "state", bt.name = "adapter.0"})
// CHECK-SAME:    attributes {bt.program = "main", bt.stage = "adapter"}
// CHECK-NEXT:    %[[S:.+]] = util.global.load @static.0 : tensor<16x12xf32>
// CHECK:         linalg.generic {{.*}} ins(%[[S]], %arg0 : tensor<16x12xf32>, tensor<16x12xf32>)

// CHECK-LABEL: func.func @forward
// CHECK-SAME:    (%arg0: tensor<16x12xf32> {bt.kind = "state", bt.name = "adapter.0", bt.result = 0 : i64},
// CHECK-SAME:     %arg1: tensor<?x16xf32> {bt.kind = "input", bt.name = "x"})
// CHECK-SAME:    -> (tensor<?x12xf32> {bt.kind = "output", bt.name = "output.0"}, tensor<?x12xf32> {bt.kind = "output", bt.name = "output.1"})
// CHECK-SAME:    attributes {bt.program = "main", bt.stage = "dynamic"}
// CHECK-NEXT:    %[[FS:.+]] = util.global.load @static.0 : tensor<16x12xf32>
// CHECK-NEXT:    %[[B:.+]] = util.global.load @fc.bias : tensor<12xf32>
// CHECK:         %[[Y:[0-9]+]] = linalg.matmul ins(%arg1, %arg0 : tensor<?x16xf32>, tensor<16x12xf32>)
// CHECK:         linalg.generic {{.*}} ins(%[[Y]], %[[B]] : tensor<?x12xf32>, tensor<12xf32>)
// CHECK:         linalg.matmul ins(%arg1, %[[FS]] : tensor<?x16xf32>, tensor<16x12xf32>)

// Nowhere: the static stage, a global of its weight, a parameter argument.
// NONE-NOT: bt.stage = "static"
// NONE-NOT: @fc.weight
// NONE-NOT: %arg{{[0-9]+}}: tensor<{{[^>]*}}> {bt.kind = "parameter"
#map = affine_map<(d0, d1) -> (d0, d1)>
#map1 = affine_map<(d0, d1) -> (d1)>
module {
  func.func @static(%arg0: tensor<12x16xf32> {bt.kind = "parameter", bt.name = "fc.weight"}) -> (tensor<16x12xf32> {bt.kind = "parameter", bt.name = "static.0"}) attributes {bt.program = "main", bt.stage = "static"} {
    %0 = tensor.empty() : tensor<16x12xf32>
    %transposed = linalg.transpose ins(%arg0 : tensor<12x16xf32>) outs(%0 : tensor<16x12xf32>) permutation = [1, 0]
    return %transposed : tensor<16x12xf32>
  }
  func.func @adapter(%arg0: tensor<16x12xf32> {bt.kind = "parameter", bt.name = "static.0"}, %arg1: tensor<16x12xf32> {bt.kind = "input", bt.name = "fc.delta"}) -> (tensor<16x12xf32> {bt.kind = "state", bt.name = "adapter.0"}) attributes {bt.program = "main", bt.stage = "adapter"} {
    %0 = tensor.empty() : tensor<16x12xf32>
    %1 = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel"]} ins(%arg0, %arg1 : tensor<16x12xf32>, tensor<16x12xf32>) outs(%0 : tensor<16x12xf32>) {
    ^bb0(%in: f32, %in_0: f32, %out: f32):
      %2 = arith.addf %in, %in_0 : f32
      linalg.yield %2 : f32
    } -> tensor<16x12xf32>
    return %1 : tensor<16x12xf32>
  }
  func.func @forward(%arg0: tensor<16x12xf32> {bt.kind = "parameter", bt.name = "static.0"}, %arg1: tensor<12xf32> {bt.kind = "parameter", bt.name = "fc.bias"}, %arg2: tensor<16x12xf32> {bt.kind = "state", bt.name = "adapter.0", bt.result = 0 : i64}, %arg3: tensor<?x16xf32> {bt.kind = "input", bt.name = "x"}) -> (tensor<?x12xf32> {bt.kind = "output", bt.name = "output.0"}, tensor<?x12xf32> {bt.kind = "output", bt.name = "output.1"}) attributes {bt.program = "main", bt.stage = "dynamic"} {
    %c0 = arith.constant 0 : index
    %cst = arith.constant 0.000000e+00 : f32
    %dim = tensor.dim %arg3, %c0 : tensor<?x16xf32>
    %0 = tensor.empty(%dim) : tensor<?x12xf32>
    %1 = linalg.fill ins(%cst : f32) outs(%0 : tensor<?x12xf32>) -> tensor<?x12xf32>
    %2 = linalg.matmul ins(%arg3, %arg2 : tensor<?x16xf32>, tensor<16x12xf32>) outs(%1 : tensor<?x12xf32>) -> tensor<?x12xf32>
    %3 = linalg.generic {indexing_maps = [#map, #map1, #map], iterator_types = ["parallel", "parallel"]} ins(%2, %arg1 : tensor<?x12xf32>, tensor<12xf32>) outs(%0 : tensor<?x12xf32>) {
    ^bb0(%in: f32, %in_0: f32, %out: f32):
      %5 = arith.addf %in, %in_0 : f32
      linalg.yield %5 : f32
    } -> tensor<?x12xf32>
    %4 = linalg.matmul ins(%arg3, %arg0 : tensor<?x16xf32>, tensor<16x12xf32>) outs(%1 : tensor<?x12xf32>) -> tensor<?x12xf32>
    return %3, %4 : tensor<?x12xf32>, tensor<?x12xf32>
  }
}
