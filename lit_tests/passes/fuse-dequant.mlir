// RUN: stageml-opt %s -p fuse-dequant | filecheck %s

// In request-time functions, a product of an int8 weight converted to floats
// (torch-mlir's lowering of defer-dequant's cast: an elementwise sitofp
// generic) reads the int8 weight itself: linalg.matmul converts its operands
// to the result's type, integers as signed. The input is the CPU target's
// IREE input of a quantized layer compiled with --keep-quantized (@static.0
// the int8 weight, [in, out]). Left alone: a conversion that also scales
// (%6, not a plain cast) and its product, and a conversion no product reads
// (%9).

// CHECK-LABEL: func.func @forward
// CHECK:         %[[Q:.+]] = util.global.load @static.0 : tensor<16x8xi8>
// CHECK:         %[[Y:.+]] = linalg.matmul ins(%arg0, %[[Q]] : tensor<?x16xf32>, tensor<16x8xi8>) outs(%{{.+}} : tensor<?x8xf32>) -> tensor<?x8xf32>
// CHECK:         arith.mulf
// CHECK:         linalg.matmul ins(%arg0, %{{.+}} : tensor<?x16xf32>, tensor<16x8xf32>)
// CHECK:         arith.sitofp %{{.+}} : i8 to f32
// CHECK-NEXT:    linalg.yield
// CHECK-NOT:     arith.sitofp
#map = affine_map<(d0, d1) -> (d0, d1)>
module {
  util.global private @static.0 {bt.kind = "parameter", bt.name = "static.0"} = #flow.parameter.named<"model"::"static.0"> : tensor<16x8xi8>
  util.global private @static.1 {bt.kind = "parameter", bt.name = "static.1"} = #flow.parameter.named<"model"::"static.1"> : tensor<16x8xi8>
  func.func @forward(%arg0: tensor<?x16xf32> {bt.kind = "input", bt.name = "input"}) -> (tensor<?x8xf32> {bt.kind = "output", bt.name = "output.0"}, tensor<?x8xf32> {bt.kind = "output", bt.name = "output.1"}, tensor<16x8xf32> {bt.kind = "output", bt.name = "output.2"}) attributes {bt.program = "main", bt.stage = "dynamic"} {
    %static.0 = util.global.load @static.0 : tensor<16x8xi8>
    %static.1 = util.global.load @static.1 : tensor<16x8xi8>
    %c0 = arith.constant 0 : index
    %cst = arith.constant 0.000000e+00 : f32
    %half = arith.constant 5.000000e-01 : f32
    %0 = tensor.empty() : tensor<16x8xf32>
    %1 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%static.0 : tensor<16x8xi8>) outs(%0 : tensor<16x8xf32>) {
    ^bb0(%in: i8, %out: f32):
      %10 = arith.sitofp %in : i8 to f32
      linalg.yield %10 : f32
    } -> tensor<16x8xf32>
    %dim = tensor.dim %arg0, %c0 : tensor<?x16xf32>
    %2 = tensor.empty(%dim) : tensor<?x8xf32>
    %3 = linalg.fill ins(%cst : f32) outs(%2 : tensor<?x8xf32>) -> tensor<?x8xf32>
    %4 = linalg.matmul ins(%arg0, %1 : tensor<?x16xf32>, tensor<16x8xf32>) outs(%3 : tensor<?x8xf32>) -> tensor<?x8xf32>
    %6 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%static.1 : tensor<16x8xi8>) outs(%0 : tensor<16x8xf32>) {
    ^bb0(%in: i8, %out: f32):
      %10 = arith.sitofp %in : i8 to f32
      %11 = arith.mulf %10, %half : f32
      linalg.yield %11 : f32
    } -> tensor<16x8xf32>
    %7 = linalg.matmul ins(%arg0, %6 : tensor<?x16xf32>, tensor<16x8xf32>) outs(%3 : tensor<?x8xf32>) -> tensor<?x8xf32>
    %9 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%static.1 : tensor<16x8xi8>) outs(%0 : tensor<16x8xf32>) {
    ^bb0(%in: i8, %out: f32):
      %10 = arith.sitofp %in : i8 to f32
      linalg.yield %10 : f32
    } -> tensor<16x8xf32>
    return %4, %7, %9 : tensor<?x8xf32>, tensor<?x8xf32>, tensor<16x8xf32>
  }
}
