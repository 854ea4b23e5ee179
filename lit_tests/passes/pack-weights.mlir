// RUN: stageml-opt %s -p 'pack-weights{cpu=znver4}' | filecheck %s --check-prefixes=CHECK,AVX512
// RUN: stageml-opt %s -p 'pack-weights{cpu=haswell}' | filecheck %s --check-prefixes=CHECK,AVX2

// Products against weights take the CPU's mmt4d layout: the weight packed
// once in the widest f32 tile's N0 x K0 (16 x 1 with AVX-512, 8 x 1 with
// AVX2), each product's rows in the narrowest M0 that covers them; more
// rows than one widest tile swap the operands.

module {
  util.global private @w = #flow.parameter.named<"model"::"w"> : tensor<64x32xf32>

  // @adapter returns the state it hands the request-time function packed.
  // CHECK-LABEL:  func.func @adapter
  // AVX512-SAME:    -> (tensor<2x64x16x1xf32> {bt.kind = "state", bt.name = "merged"})
  // AVX2-SAME:      -> (tensor<4x64x8x1xf32> {bt.kind = "state", bt.name = "merged"})
  // AVX512:         %[[S:.+]] = linalg.pack %arg0 outer_dims_perm = [1, 0] inner_dims_pos = [1, 0] inner_tiles = [16, 1] into %{{.+}} : tensor<64x32xf32> -> tensor<2x64x16x1xf32>
  // AVX2:           %[[S:.+]] = linalg.pack %arg0 outer_dims_perm = [1, 0] inner_dims_pos = [1, 0] inner_tiles = [8, 1] into %{{.+}} : tensor<64x32xf32> -> tensor<4x64x8x1xf32>
  // CHECK-NEXT:     return %[[S]]
  func.func @adapter(%a: tensor<64x32xf32> {bt.name = "a", bt.kind = "input"})
      -> (tensor<64x32xf32> {bt.name = "merged", bt.kind = "state"})
      attributes {bt.stage = "adapter", bt.program = "main"} {
    return %a : tensor<64x32xf32>
  }

  // CHECK-LABEL:  func.func @forward
  // AVX512-SAME:    (%arg0: tensor<2x64x16x1xf32> {bt.kind = "state", bt.name = "merged", bt.result = 0 : i64}
  // AVX2-SAME:      (%arg0: tensor<4x64x8x1xf32> {bt.kind = "state", bt.name = "merged", bt.result = 0 : i64}
  // The global's pack follows its load (IREE hoists it to load time).
  // CHECK:          %[[W:.+]] = util.global.load @w : tensor<64x32xf32>
  // AVX512:         %[[PW:.+]] = linalg.pack %[[W]] outer_dims_perm = [1, 0] inner_dims_pos = [1, 0] inner_tiles = [16, 1] into %{{.+}} : tensor<64x32xf32> -> tensor<2x64x16x1xf32>
  // AVX2:           %[[PW:.+]] = linalg.pack %[[W]] outer_dims_perm = [1, 0] inner_dims_pos = [1, 0] inner_tiles = [8, 1] into %{{.+}} : tensor<64x32xf32> -> tensor<4x64x8x1xf32>
  // A dynamic row count: an scf.if ladder on it, one pack -> mmt4d -> unpack each.
  // CHECK:          %[[ONE:.+]] = arith.cmpi ule, %[[ROWS:.+]], %c1 : index
  // CHECK:          scf.if %[[ONE]] -> (tensor<?x32xf32>) {
  // CHECK:            linalg.pack %arg1 padding_value(%{{.+}} : f32) inner_dims_pos = [0, 1] inner_tiles = [1, 1]
  // AVX512:           linalg.mmt4d ins(%{{.+}}, %arg0 : tensor<?x64x1x1xf32>, tensor<2x64x16x1xf32>) outs(%{{.+}} : tensor<?x2x1x16xf32>)
  // AVX2:             linalg.mmt4d ins(%{{.+}}, %arg0 : tensor<?x64x1x1xf32>, tensor<4x64x8x1xf32>) outs(%{{.+}} : tensor<?x4x1x8xf32>)
  // AVX512:           linalg.unpack %{{.+}} inner_dims_pos = [0, 1] inner_tiles = [1, 16] into %{{.+}} : tensor<?x2x1x16xf32> -> tensor<?x32xf32>
  // AVX2:             linalg.unpack %{{.+}} inner_dims_pos = [0, 1] inner_tiles = [1, 8] into %{{.+}} : tensor<?x4x1x8xf32> -> tensor<?x32xf32>
  // CHECK:          } else {
  // CHECK:            arith.cmpi ule, %[[ROWS]], %c2 : index
  // CHECK:              arith.cmpi ule, %[[ROWS]], %c4 : index
  // AVX512:               arith.cmpi ule, %[[ROWS]], %c8 : index
  // AVX512:               linalg.mmt4d ins(%{{.+}}, %arg0 : tensor<?x64x8x1xf32>, tensor<2x64x16x1xf32>) outs(%{{.+}} : tensor<?x2x8x16xf32>)
  // Beyond the narrow tiles the operands swap: the weight on mmt4d's left, read once for all row tiles.
  // AVX512:               linalg.mmt4d ins(%arg0, %{{.+}} : tensor<2x64x16x1xf32>, tensor<?x64x16x1xf32>) outs(%{{.+}} : tensor<2x?x16x16xf32>)
  // AVX512:               linalg.unpack %{{.+}} outer_dims_perm = [1, 0] inner_dims_pos = [1, 0] inner_tiles = [16, 16] into %{{.+}} : tensor<2x?x16x16xf32> -> tensor<?x32xf32>
  // AVX2-NOT:             arith.cmpi
  // AVX2:                 linalg.mmt4d ins(%arg0, %{{.+}} : tensor<4x64x8x1xf32>, tensor<?x64x8x1xf32>) outs(%{{.+}} : tensor<4x?x8x8xf32>)
  // AVX2:                 linalg.unpack %{{.+}} outer_dims_perm = [1, 0] inner_dims_pos = [1, 0] inner_tiles = [8, 8] into %{{.+}} : tensor<4x?x8x8xf32> -> tensor<?x32xf32>
  // A static row count (3): the smallest tile that covers it (M0 = 4).
  // CHECK:          %[[P3:.+]] = linalg.pack %arg2 padding_value(%{{.+}} : f32) inner_dims_pos = [0, 1] inner_tiles = [4, 1] into %{{.+}} : tensor<3x64xf32> -> tensor<1x64x4x1xf32>
  // AVX512:         %[[Y3:.+]] = linalg.mmt4d ins(%[[P3]], %[[PW]] : tensor<1x64x4x1xf32>, tensor<2x64x16x1xf32>) outs(%{{.+}} : tensor<1x2x4x16xf32>)
  // AVX2:           %[[Y3:.+]] = linalg.mmt4d ins(%[[P3]], %[[PW]] : tensor<1x64x4x1xf32>, tensor<4x64x8x1xf32>) outs(%{{.+}} : tensor<1x4x4x8xf32>)
  // AVX512:         linalg.unpack %[[Y3]] inner_dims_pos = [0, 1] inner_tiles = [4, 16] into %{{.+}} : tensor<1x2x4x16xf32> -> tensor<3x32xf32>
  // AVX2:           linalg.unpack %[[Y3]] inner_dims_pos = [0, 1] inner_tiles = [4, 8] into %{{.+}} : tensor<1x4x4x8xf32> -> tensor<3x32xf32>
  // CHECK-NOT:      linalg.matmul
  func.func @forward(%m: tensor<64x32xf32> {bt.name = "merged", bt.kind = "state", bt.result = 0 : i64},
                     %x: tensor<?x64xf32> {bt.name = "x", bt.kind = "input"},
                     %y: tensor<3x64xf32> {bt.name = "y", bt.kind = "input"})
      -> (tensor<?x32xf32>, tensor<3x32xf32>) attributes {bt.stage = "dynamic", bt.program = "main"} {
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : f32
    %w = util.global.load @w : tensor<64x32xf32>
    %rows = tensor.dim %x, %c0 : tensor<?x64xf32>
    %e = tensor.empty(%rows) : tensor<?x32xf32>
    %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<?x32xf32>) -> tensor<?x32xf32>
    %p = linalg.matmul ins(%x, %m : tensor<?x64xf32>, tensor<64x32xf32>) outs(%acc : tensor<?x32xf32>) -> tensor<?x32xf32>
    %e3 = tensor.empty() : tensor<3x32xf32>
    %acc3 = linalg.fill ins(%zero : f32) outs(%e3 : tensor<3x32xf32>) -> tensor<3x32xf32>
    %q = linalg.matmul ins(%y, %w : tensor<3x64xf32>, tensor<64x32xf32>) outs(%acc3 : tensor<3x32xf32>) -> tensor<3x32xf32>
    return %p, %q : tensor<?x32xf32>, tensor<3x32xf32>
  }
}
