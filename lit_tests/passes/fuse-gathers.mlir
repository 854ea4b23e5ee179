// RUN: stageml-opt %s -p fuse-gathers | filecheck %s
// RUN: stageml-opt %s -p 'fuse-gathers{multi-token=true}' | filecheck %s --check-prefix=TOKENS

// In request-time (bt.stage = "dynamic") functions, torch-mlir's lowering
// of a per-row product, index_select(table, ids) as a gather generic and
// then a batch_matmul against the gathered [B,K,N], becomes one generic
// that reads each row's matrix straight from the slot table (BGMV-style):
// y[b,m,n] += x[b,m,k] * table[ids[b], k, n], k a reduction. The input is
// resident-state's output (@forward_factorized of a multi-tenant PEFT
// linear, 16 -> 12, max rank 4: the tables are views of @resident.f32). Only
// for one token per row (M = 1): with M = 8 (@tokens' %arg1) the
// batch_matmul stays, and so does the gather it reads; so do both of
// @forward_tokens' (the f16 shrink and expand of rows of T tokens, T dynamic).
//
// With multi-token=true (the sm90 target's second run of the pass), rows of
// several tokens become the one-token form on their B*T token rows: x
// collapsed and expanded to [B*T, 1, K], each row's id broadcast to its
// tokens, the product into zeros reshaped back to [B, T, N].

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

// CHECK-LABEL: func.func @forward_tokens
// CHECK:         %[[GA:[0-9]+]] = linalg.generic {{.*}} ins(%arg1 : tensor<?xi64>) outs(%{{[0-9]+}} : tensor<?x16x4xf16>)
// CHECK:         %[[GB:[0-9]+]] = linalg.generic {{.*}} ins(%arg1 : tensor<?xi64>) outs(%{{[0-9]+}} : tensor<?x4x12xf16>)
// CHECK-NOT:     linalg.broadcast
// CHECK:         linalg.batch_matmul ins(%arg0, %[[GA]] : tensor<?x?x16xf16>, tensor<?x16x4xf16>) outs(%{{[0-9]+}} : tensor<?x?x4xf32>)
// CHECK-NOT:     linalg.broadcast
// CHECK:         linalg.batch_matmul ins(%{{[0-9]+}}, %[[GB]] : tensor<?x?x4xf16>, tensor<?x4x12xf16>) outs(%{{[0-9]+}} : tensor<?x?x12xf32>)

// TOKENS-DAG:  #[[X:map[0-9]*]] = affine_map<(d0, d1, d2, d3) -> (d0, d1, d3)>
// TOKENS-DAG:  #[[IDS:map[0-9]*]] = affine_map<(d0, d1, d2, d3) -> (d0)>
// TOKENS-DAG:  #[[Y:map[0-9]*]] = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>

// One-token rows as without the option.
// TOKENS-LABEL: func.func @forward_factorized
// TOKENS-NOT:     linalg.batch_matmul
// TOKENS-NOT:     linalg.broadcast
// TOKENS:         return

// TOKENS-LABEL: func.func @tokens
// TOKENS:         %[[Y1:[0-9]+]] = linalg.generic {indexing_maps = [#[[X]], #[[IDS]], #[[Y]]], {{.*}} ins(%arg0, %arg2 : tensor<?x1x16xf32>, tensor<?xi64>) outs(%{{[0-9]+}} : tensor<?x1x4xf32>)
// TOKENS-NOT:     linalg.batch_matmul
// TOKENS:         tensor.collapse_shape %arg1 {{.*}} : tensor<?x8x16xf32> into tensor<?x16xf32>
// TOKENS:         linalg.broadcast ins(%arg2 : tensor<?xi64>) outs(%{{[0-9]+}} : tensor<?x8xi64>) dimensions = [1]
// TOKENS:         linalg.generic {indexing_maps = [#[[X]], #[[IDS]], #[[Y]]], {{.*}} : tensor<?x1x16xf32>, tensor<?xi64>) outs(%{{[0-9]+}} : tensor<?x1x4xf32>)
// TOKENS:         %[[Y8:.+]] = tensor.expand_shape %{{.+}} output_shape [%{{.+}}, 8, 4] : tensor<?x4xf32> into tensor<?x8x4xf32>
// TOKENS-NEXT:    return %[[Y1]], %[[Y8]]

// TOKENS-LABEL: func.func @forward_tokens
// TOKENS:         %[[TB:.+]] = tensor.cast %{{.+}} : tensor<3x4x12xf16> to tensor<?x4x12xf16>
// TOKENS:         %[[TA:.+]] = tensor.cast %{{.+}} : tensor<3x16x4xf16> to tensor<?x16x4xf16>
// The gathers are gone, and so are the batch_matmuls.
// TOKENS-NOT:     outs(%{{[0-9]+}} : tensor<?x16x4xf16>)
// TOKENS-NOT:     linalg.batch_matmul
// The shrink: x's B*T token rows, each with its row's id, into zeros.
// TOKENS:         %[[ACC:[0-9]+]] = linalg.fill ins(%{{.+}} : f32) outs(%{{[0-9]+}} : tensor<?x?x4xf32>)
// TOKENS:         %[[B:.+]] = tensor.dim %[[ACC]], %{{.+}} : tensor<?x?x4xf32>
// TOKENS:         %[[T:.+]] = tensor.dim %[[ACC]], %{{.+}} : tensor<?x?x4xf32>
// TOKENS:         %[[FLAT:.+]] = tensor.collapse_shape %arg0 {{.*}} : tensor<?x?x16xf16> into tensor<?x16xf16>
// TOKENS:         %[[ROWS:.+]] = tensor.dim %[[FLAT]], %{{.+}} : tensor<?x16xf16>
// TOKENS:         %[[IDROWS:.+]] = tensor.dim %arg1, %{{.+}} : tensor<?xi64>
// TOKENS:         %[[E:[0-9]+]] = tensor.empty(%[[IDROWS]], %[[T]]) : tensor<?x?xi64>
// TOKENS:         %[[BROADCAST:.+]] = linalg.broadcast ins(%arg1 : tensor<?xi64>) outs(%[[E]] : tensor<?x?xi64>) dimensions = [1]
// TOKENS:         %[[TOKEN_IDS:.+]] = tensor.collapse_shape %[[BROADCAST]] {{.*}} : tensor<?x?xi64> into tensor<?xi64>
// TOKENS:         %[[Z:[0-9]+]] = tensor.empty(%[[ROWS]]) : tensor<?x1x4xf32>
// TOKENS:         %[[ZERO:[0-9]+]] = linalg.fill ins(%{{.+}} : f32) outs(%[[Z]] : tensor<?x1x4xf32>)
// TOKENS:         %[[XA:.+]] = tensor.expand_shape %[[FLAT]] {{.*}} output_shape [%[[ROWS]], 1, 16] : tensor<?x16xf16> into tensor<?x1x16xf16>
// TOKENS-NOT:     linalg.batch_matmul
// TOKENS:         %[[PA:[0-9]+]] = linalg.generic {indexing_maps = [#[[X]], #[[IDS]], #[[Y]]], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%[[XA]], %[[TOKEN_IDS]] : tensor<?x1x16xf16>, tensor<?xi64>) outs(%[[ZERO]] : tensor<?x1x4xf32>) {
// TOKENS-NEXT:    ^bb0(%[[IN:[a-z0-9_]+]]: f16, %[[ID:[a-z0-9_]+]]: i64, %[[OUT:[a-z0-9_]+]]: f32):
// TOKENS-NEXT:      %[[ROW:[0-9]+]] = arith.index_cast %[[ID]] : i64 to index
// TOKENS-NEXT:      %[[N:[0-9]+]] = linalg.index 2 : index
// TOKENS-NEXT:      %[[K:[0-9]+]] = linalg.index 3 : index
// TOKENS-NEXT:      %[[W:.+]] = tensor.extract %[[TA]][%[[ROW]], %[[K]], %[[N]]] : tensor<?x16x4xf16>
// TOKENS-NEXT:      %[[W32:[0-9]+]] = arith.extf %[[W]] : f16 to f32
// TOKENS-NEXT:      %[[X32:[0-9]+]] = arith.extf %[[IN]] : f16 to f32
// TOKENS-NEXT:      %[[P:[0-9]+]] = arith.mulf %[[X32]], %[[W32]] : f32
// TOKENS-NEXT:      %[[S:[0-9]+]] = arith.addf %[[OUT]], %[[P]] : f32
// TOKENS-NEXT:      linalg.yield %[[S]] : f32
// TOKENS-NEXT:    } -> tensor<?x1x4xf32>
// TOKENS-NEXT:    %[[FA:.+]] = tensor.collapse_shape %[[PA]] {{.*}} : tensor<?x1x4xf32> into tensor<?x4xf32>
// TOKENS-NEXT:    %[[YA:.+]] = tensor.expand_shape %[[FA]] {{.*}} output_shape [%[[B]], %[[T]], 4] : tensor<?x4xf32> into tensor<?x?x4xf32>
// TOKENS:         %[[A16:[0-9]+]] = linalg.generic {{.*}} ins(%[[YA]] : tensor<?x?x4xf32>) outs(%{{[0-9]+}} : tensor<?x?x4xf16>)
// The expand, on the rounded shrink's token rows the same way.
// TOKENS-NOT:     linalg.batch_matmul
// TOKENS:         tensor.collapse_shape %[[A16]] {{.*}} : tensor<?x?x4xf16> into tensor<?x4xf16>
// TOKENS:         linalg.broadcast ins(%arg1 : tensor<?xi64>) outs(%{{[0-9]+}} : tensor<?x?xi64>) dimensions = [1]
// TOKENS:         %[[PB:[0-9]+]] = linalg.generic {indexing_maps = [#[[X]], #[[IDS]], #[[Y]]], {{.*}} : tensor<?x1x4xf16>, tensor<?xi64>) outs(%{{[0-9]+}} : tensor<?x1x12xf32>) {
// TOKENS:           tensor.extract %[[TB]][%{{[0-9]+}}, %{{[0-9]+}}, %{{[0-9]+}}] : tensor<?x4x12xf16>
// TOKENS:         } -> tensor<?x1x12xf32>
// TOKENS-NEXT:    %[[FB:.+]] = tensor.collapse_shape %[[PB]] {{.*}} : tensor<?x1x12xf32> into tensor<?x12xf32>
// TOKENS-NEXT:    tensor.expand_shape %[[FB]] {{.*}} : tensor<?x12xf32> into tensor<?x?x12xf32>
// TOKENS-NOT:     linalg.batch_matmul
// TOKENS:         return
#map = affine_map<(d0, d1) -> (d0, d1)>
#map1 = affine_map<(d0, d1, d2) -> (d0)>
#map2 = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
module {
  util.global private mutable @resident.f32 = dense<0.000000e+00> : tensor<336xf32>
  util.global private mutable @resident.f16 = dense<0.000000e+00> : tensor<336xf16>
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
  func.func @forward_tokens(%arg0: tensor<?x?x16xf16> {bt.kind = "input", bt.name = "x"}, %arg1: tensor<?xi64> {bt.kind = "input", bt.name = "adapter_ids"}) -> (tensor<?x?x12xf16> {bt.kind = "output", bt.name = "output.0"}) attributes {bt.program = "factorized", bt.stage = "dynamic"} {
    %resident.f16 = util.global.load @resident.f16 : tensor<336xf16>
    %extracted_slice = tensor.extract_slice %resident.f16[192] [144] [1] : tensor<336xf16> to tensor<144xf16>
    %expanded = tensor.expand_shape %extracted_slice [[0, 1, 2]] output_shape [3, 4, 12] : tensor<144xf16> into tensor<3x4x12xf16>
    %cast = tensor.cast %expanded : tensor<3x4x12xf16> to tensor<?x4x12xf16>
    %extracted_slice_0 = tensor.extract_slice %resident.f16[0] [192] [1] : tensor<336xf16> to tensor<192xf16>
    %expanded_1 = tensor.expand_shape %extracted_slice_0 [[0, 1, 2]] output_shape [3, 16, 4] : tensor<192xf16> into tensor<3x16x4xf16>
    %cast_2 = tensor.cast %expanded_1 : tensor<3x16x4xf16> to tensor<?x16x4xf16>
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %cst = arith.constant 0.000000e+00 : f32
    %dim = tensor.dim %arg1, %c0 : tensor<?xi64>
    %0 = tensor.empty(%dim) : tensor<?x16x4xf16>
    %1 = linalg.generic {indexing_maps = [#map1, #map2], iterator_types = ["parallel", "parallel", "parallel"]} ins(%arg1 : tensor<?xi64>) outs(%0 : tensor<?x16x4xf16>) {
    ^bb0(%in: i64, %out: f16):
      %16 = arith.index_cast %in : i64 to index
      %17 = linalg.index 1 : index
      %18 = linalg.index 2 : index
      %extracted = tensor.extract %cast_2[%16, %17, %18] : tensor<?x16x4xf16>
      linalg.yield %extracted : f16
    } -> tensor<?x16x4xf16>
    %2 = tensor.empty(%dim) : tensor<?x4x12xf16>
    %3 = linalg.generic {indexing_maps = [#map1, #map2], iterator_types = ["parallel", "parallel", "parallel"]} ins(%arg1 : tensor<?xi64>) outs(%2 : tensor<?x4x12xf16>) {
    ^bb0(%in: i64, %out: f16):
      %16 = arith.index_cast %in : i64 to index
      %17 = linalg.index 1 : index
      %18 = linalg.index 2 : index
      %extracted = tensor.extract %cast[%16, %17, %18] : tensor<?x4x12xf16>
      linalg.yield %extracted : f16
    } -> tensor<?x4x12xf16>
    %dim_3 = tensor.dim %arg0, %c0 : tensor<?x?x16xf16>
    %dim_4 = tensor.dim %arg0, %c1 : tensor<?x?x16xf16>
    %4 = arith.maxui %dim_3, %dim : index
    %5 = tensor.empty(%4, %dim_4) : tensor<?x?x4xf32>
    %6 = linalg.fill ins(%cst : f32) outs(%5 : tensor<?x?x4xf32>) -> tensor<?x?x4xf32>
    %7 = linalg.batch_matmul ins(%arg0, %1 : tensor<?x?x16xf16>, tensor<?x16x4xf16>) outs(%6 : tensor<?x?x4xf32>) -> tensor<?x?x4xf32>
    %8 = tensor.empty(%4, %dim_4) : tensor<?x?x4xf16>
    %9 = linalg.generic {indexing_maps = [#map2, #map2], iterator_types = ["parallel", "parallel", "parallel"]} ins(%7 : tensor<?x?x4xf32>) outs(%8 : tensor<?x?x4xf16>) {
    ^bb0(%in: f32, %out: f16):
      %16 = arith.truncf %in : f32 to f16
      linalg.yield %16 : f16
    } -> tensor<?x?x4xf16>
    %10 = arith.maxui %4, %dim : index
    %11 = tensor.empty(%10, %dim_4) : tensor<?x?x12xf32>
    %12 = linalg.fill ins(%cst : f32) outs(%11 : tensor<?x?x12xf32>) -> tensor<?x?x12xf32>
    %13 = linalg.batch_matmul ins(%9, %3 : tensor<?x?x4xf16>, tensor<?x4x12xf16>) outs(%12 : tensor<?x?x12xf32>) -> tensor<?x?x12xf32>
    %14 = tensor.empty(%10, %dim_4) : tensor<?x?x12xf16>
    %15 = linalg.generic {indexing_maps = [#map2, #map2], iterator_types = ["parallel", "parallel", "parallel"]} ins(%13 : tensor<?x?x12xf32>) outs(%14 : tensor<?x?x12xf16>) {
    ^bb0(%in: f32, %out: f16):
      %16 = arith.truncf %in : f32 to f16
      linalg.yield %16 : f16
    } -> tensor<?x?x12xf16>
    return %15 : tensor<?x?x12xf16>
  }
}
