// RUN: stageml-opt %s -p fuse-gathers | filecheck %s

// In request-time (bt.stage = "dynamic") functions, torch-mlir's lowering
// of a per-row product, index_select(table, ids) as a gather generic and
// then a batch_matmul against the gathered [B,K,N], becomes one generic
// that reads each row's matrix straight from the slot table (BGMV-style):
// y[b,m,n] += x[b,m,k] * table[ids[b], k, n], k a reduction. The input is
// resident-state's output (@forward_factorized of a multi-tenant PEFT
// linear, 16 -> 12, max rank 4: the tables are views of @resident.f32). Only
// for one token per row (M = 1): with M = 8 (@tokens' %arg1) the
// batch_matmul stays, and so does the gather it reads.

// CHECK-DAG:   #[[X:map[0-9]*]] = affine_map<(d0, d1, d2, d3) -> (d0, d1, d3)>
// CHECK-DAG:   #[[IDS:map[0-9]*]] = affine_map<(d0, d1, d2, d3) -> (d0)>
// CHECK-DAG:   #[[Y:map[0-9]*]] = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>

// CHECK-LABEL: func.func @forward_factorized
// CHECK:         %[[TB:.+]] = tensor.cast %{{.+}} : tensor<3x4x12xf32> to tensor<?x4x12xf32>
// CHECK:         %[[TA:.+]] = tensor.cast %{{.+}} : tensor<3x16x4xf32> to tensor<?x16x4xf32>
// The gathers are gone, and so are the batch_matmuls.
// CHECK-NOT:     ins(%arg1 : tensor<?xi64>)
// CHECK-NOT:     linalg.batch_matmul
// CHECK:         %[[X3:.+]] = tensor.expand_shape %arg0 {{.*}} into tensor<?x1x16xf32>
// CHECK-NOT:     linalg.batch_matmul
// CHECK:         %[[XA:[0-9]+]] = linalg.generic {indexing_maps = [#[[X]], #[[IDS]], #[[Y]]], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%[[X3]], %arg1 : tensor<?x1x16xf32>, tensor<?xi64>) outs(%{{[0-9]+}} : tensor<?x1x4xf32>) {
// CHECK-NEXT:    ^bb0(%[[IN:[a-z0-9_]+]]: f32, %[[ID:[a-z0-9_]+]]: i64, %[[OUT:[a-z0-9_]+]]: f32):
// CHECK-NEXT:      %[[ROW:[0-9]+]] = arith.index_cast %[[ID]] : i64 to index
// CHECK-NEXT:      %[[N:[0-9]+]] = linalg.index 2 : index
// CHECK-NEXT:      %[[K:[0-9]+]] = linalg.index 3 : index
// CHECK-NEXT:      %[[W:.+]] = tensor.extract %[[TA]][%[[ROW]], %[[K]], %[[N]]] : tensor<?x16x4xf32>
// CHECK-NEXT:      %[[P:[0-9]+]] = arith.mulf %[[IN]], %[[W]] : f32
// CHECK-NEXT:      %[[S:[0-9]+]] = arith.addf %[[OUT]], %[[P]] : f32
// CHECK-NEXT:      linalg.yield %[[S]] : f32
// CHECK-NEXT:    } -> tensor<?x1x4xf32>
// CHECK-NOT:     linalg.batch_matmul
// CHECK:         %[[XAB:[0-9]+]] = linalg.generic {indexing_maps = [#[[X]], #[[IDS]], #[[Y]]], {{.*}} ins(%[[XA]], %arg1 : tensor<?x1x4xf32>, tensor<?xi64>) outs(%{{[0-9]+}} : tensor<?x1x12xf32>) {
// CHECK:           tensor.extract %[[TB]][%{{[0-9]+}}, %{{[0-9]+}}, %{{[0-9]+}}] : tensor<?x4x12xf32>
// CHECK:         } -> tensor<?x1x12xf32>
// CHECK-NOT:     linalg.batch_matmul
// CHECK:         tensor.collapse_shape %[[XAB]]
// CHECK-NOT:     linalg.batch_matmul
// CHECK:         return

// CHECK-LABEL: func.func @tokens
// CHECK:         %[[T:.+]] = tensor.cast %{{.+}} : tensor<3x16x4xf32> to tensor<?x16x4xf32>
// CHECK:         %[[G:[0-9]+]] = linalg.generic {{.*}} ins(%arg2 : tensor<?xi64>) outs(%{{[0-9]+}} : tensor<?x16x4xf32>)
// CHECK:         %[[Y1:[0-9]+]] = linalg.generic {indexing_maps = [#[[X]], #[[IDS]], #[[Y]]], {{.*}} ins(%arg0, %arg2 : tensor<?x1x16xf32>, tensor<?xi64>) outs(%{{[0-9]+}} : tensor<?x1x4xf32>)
// CHECK:           tensor.extract %[[T]][
// CHECK:         %[[Y8:[0-9]+]] = linalg.batch_matmul ins(%arg1, %[[G]] : tensor<?x8x16xf32>, tensor<?x16x4xf32>) outs(%{{[0-9]+}} : tensor<?x8x4xf32>)
// CHECK-NEXT:    return %[[Y1]], %[[Y8]]
#map = affine_map<(d0, d1) -> (d0, d1)>
#map1 = affine_map<(d0, d1, d2) -> (d0)>
#map2 = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
module {
  util.global private mutable @resident.f32 = dense<0.000000e+00> : tensor<336xf32>
  util.global private @factorized.static.0 {bt.kind = "parameter", bt.name = "factorized.static.0"} = #flow.parameter.named<"model"::"factorized.static.0"> : tensor<16x12xf32>
  func.func @forward_factorized(%arg0: tensor<?x16xf32> {bt.kind = "input", bt.name = "x"}, %arg1: tensor<?xi64> {bt.kind = "input", bt.name = "adapter_ids"}) -> (tensor<?x12xf32> {bt.kind = "output", bt.name = "output.0"}) attributes {bt.program = "factorized", bt.stage = "dynamic"} {
    %resident.f32 = util.global.load @resident.f32 : tensor<336xf32>
    %extracted_slice = tensor.extract_slice %resident.f32[192] [144] [1] : tensor<336xf32> to tensor<144xf32>
    %expanded = tensor.expand_shape %extracted_slice [[0, 1, 2]] output_shape [3, 4, 12] : tensor<144xf32> into tensor<3x4x12xf32>
    %cast = tensor.cast %expanded : tensor<3x4x12xf32> to tensor<?x4x12xf32>
    %extracted_slice_0 = tensor.extract_slice %resident.f32[0] [192] [1] : tensor<336xf32> to tensor<192xf32>
    %expanded_1 = tensor.expand_shape %extracted_slice_0 [[0, 1, 2]] output_shape [3, 16, 4] : tensor<192xf32> into tensor<3x16x4xf32>
    %cast_2 = tensor.cast %expanded_1 : tensor<3x16x4xf32> to tensor<?x16x4xf32>
    %factorized.static.0 = util.global.load @factorized.static.0 : tensor<16x12xf32>
    %c0 = arith.constant 0 : index
    %cst = arith.constant 0.000000e+00 : f32
    %dim = tensor.dim %arg1, %c0 : tensor<?xi64>
    %0 = tensor.empty(%dim) : tensor<?x16x4xf32>
    %1 = linalg.generic {indexing_maps = [#map1, #map2], iterator_types = ["parallel", "parallel", "parallel"]} ins(%arg1 : tensor<?xi64>) outs(%0 : tensor<?x16x4xf32>) {
    ^bb0(%in: i64, %out: f32):
      %16 = arith.index_cast %in : i64 to index
      %17 = linalg.index 1 : index
      %18 = linalg.index 2 : index
      %extracted = tensor.extract %cast_2[%16, %17, %18] : tensor<?x16x4xf32>
      linalg.yield %extracted : f32
    } -> tensor<?x16x4xf32>
    %2 = tensor.empty(%dim) : tensor<?x4x12xf32>
    %3 = linalg.generic {indexing_maps = [#map1, #map2], iterator_types = ["parallel", "parallel", "parallel"]} ins(%arg1 : tensor<?xi64>) outs(%2 : tensor<?x4x12xf32>) {
    ^bb0(%in: i64, %out: f32):
      %16 = arith.index_cast %in : i64 to index
      %17 = linalg.index 1 : index
      %18 = linalg.index 2 : index
      %extracted = tensor.extract %cast[%16, %17, %18] : tensor<?x4x12xf32>
      linalg.yield %extracted : f32
    } -> tensor<?x4x12xf32>
    %dim_3 = tensor.dim %arg0, %c0 : tensor<?x16xf32>
    %4 = tensor.empty(%dim_3) : tensor<?x12xf32>
    %5 = linalg.fill ins(%cst : f32) outs(%4 : tensor<?x12xf32>) -> tensor<?x12xf32>
    %6 = linalg.matmul ins(%arg0, %factorized.static.0 : tensor<?x16xf32>, tensor<16x12xf32>) outs(%5 : tensor<?x12xf32>) -> tensor<?x12xf32>
    %expanded_4 = tensor.expand_shape %arg0 [[0], [1, 2]] output_shape [%dim_3, 1, 16] : tensor<?x16xf32> into tensor<?x1x16xf32>
    %7 = arith.maxui %dim_3, %dim : index
    %8 = tensor.empty(%7) : tensor<?x1x4xf32>
    %9 = linalg.fill ins(%cst : f32) outs(%8 : tensor<?x1x4xf32>) -> tensor<?x1x4xf32>
    %10 = linalg.batch_matmul ins(%expanded_4, %1 : tensor<?x1x16xf32>, tensor<?x16x4xf32>) outs(%9 : tensor<?x1x4xf32>) -> tensor<?x1x4xf32>
    %11 = arith.maxui %7, %dim : index
    %12 = tensor.empty(%11) : tensor<?x1x12xf32>
    %13 = linalg.fill ins(%cst : f32) outs(%12 : tensor<?x1x12xf32>) -> tensor<?x1x12xf32>
    %14 = linalg.batch_matmul ins(%10, %3 : tensor<?x1x4xf32>, tensor<?x4x12xf32>) outs(%13 : tensor<?x1x12xf32>) -> tensor<?x1x12xf32>
    %collapsed = tensor.collapse_shape %14 [[0, 1], [2]] : tensor<?x1x12xf32> into tensor<?x12xf32>
    %15 = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel"]} ins(%6, %collapsed : tensor<?x12xf32>, tensor<?x12xf32>) outs(%4 : tensor<?x12xf32>) {
    ^bb0(%in: f32, %in_5: f32, %out: f32):
      %16 = arith.addf %in, %in_5 : f32
      linalg.yield %16 : f32
    } -> tensor<?x12xf32>
    return %15 : tensor<?x12xf32>
  }  func.func @tokens(%arg0: tensor<?x1x16xf32> {bt.kind = "input", bt.name = "x"}, %arg1: tensor<?x8x16xf32> {bt.kind = "input", bt.name = "y"}, %arg2: tensor<?xi64> {bt.kind = "input", bt.name = "adapter_ids"}) -> (tensor<?x1x4xf32> {bt.kind = "output", bt.name = "output.0"}, tensor<?x8x4xf32> {bt.kind = "output", bt.name = "output.1"}) attributes {bt.program = "factorized", bt.stage = "dynamic"} {
    %resident.f32 = util.global.load @resident.f32 : tensor<336xf32>
    %extracted_slice = tensor.extract_slice %resident.f32[0] [192] [1] : tensor<336xf32> to tensor<192xf32>
    %expanded = tensor.expand_shape %extracted_slice [[0, 1, 2]] output_shape [3, 16, 4] : tensor<192xf32> into tensor<3x16x4xf32>
    %cast = tensor.cast %expanded : tensor<3x16x4xf32> to tensor<?x16x4xf32>
    %c0 = arith.constant 0 : index
    %cst = arith.constant 0.000000e+00 : f32
    %dim = tensor.dim %arg2, %c0 : tensor<?xi64>
    %0 = tensor.empty(%dim) : tensor<?x16x4xf32>
    %1 = linalg.generic {indexing_maps = [#map1, #map2], iterator_types = ["parallel", "parallel", "parallel"]} ins(%arg2 : tensor<?xi64>) outs(%0 : tensor<?x16x4xf32>) {
    ^bb0(%in: i64, %out: f32):
      %8 = arith.index_cast %in : i64 to index
      %9 = linalg.index 1 : index
      %10 = linalg.index 2 : index
      %extracted = tensor.extract %cast[%8, %9, %10] : tensor<?x16x4xf32>
      linalg.yield %extracted : f32
    } -> tensor<?x16x4xf32>
    %2 = tensor.empty(%dim) : tensor<?x1x4xf32>
    %3 = linalg.fill ins(%cst : f32) outs(%2 : tensor<?x1x4xf32>) -> tensor<?x1x4xf32>
    %4 = linalg.batch_matmul ins(%arg0, %1 : tensor<?x1x16xf32>, tensor<?x16x4xf32>) outs(%3 : tensor<?x1x4xf32>) -> tensor<?x1x4xf32>
    %5 = tensor.empty(%dim) : tensor<?x8x4xf32>
    %6 = linalg.fill ins(%cst : f32) outs(%5 : tensor<?x8x4xf32>) -> tensor<?x8x4xf32>
    %7 = linalg.batch_matmul ins(%arg1, %1 : tensor<?x8x16xf32>, tensor<?x16x4xf32>) outs(%6 : tensor<?x8x4xf32>) -> tensor<?x8x4xf32>
    return %4, %7 : tensor<?x1x4xf32>, tensor<?x8x4xf32>
  }
}
