// RUN: stageml-opt %s -p use-custom-kernels | filecheck %s
// RUN: stageml-opt %s -p 'use-custom-kernels{lowering=reference}' | filecheck %s --check-prefix=REF

// use-custom-kernels swaps the residual's hot products for StageML's
// hand-written Hopper kernels (flow.dispatch), or with lowering=reference for
// calls of their CPU references, with the same operands and push constants;
// what does not match stays linalg. The input is the residual's IREE input:
// stage functions say what they are (bt.stage, bt.program) and adapter state
// arguments which adapter result they are (bt.result).

#map = affine_map<(d0, d1) -> (d0, d1)>
#rows = affine_map<(d0, d1, d2) -> (d0, d1, d2)>

// CHECK: #[[EXPAND:.+]] = #hal.pipeline.layout<constants = 5, bindings = [#hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer>]>
// CHECK: hal.executable.source private @stageml_sm90 <objects = <{#{{.+}} = [#hal.executable.object<{path = "stageml_sm90.ptx"}>]}>>
// CHECK: hal.executable.export public @stageml_gemm_f16 ordinal(0)
// CHECK: hal.executable.export public @stageml_lora_bf16 ordinal(3)
// CHECK: hal.executable.export public @stageml_bgmv_f16 ordinal(4)
// CHECK: hal.executable.export public @stageml_gemm_wgmma_f16 ordinal(6)
// CHECK: %[[SPLIT:.+]] = arith.cmpi ule, %{{.+}}, %{{.+}} : index
// CHECK: %[[X:.+]] = arith.select %[[SPLIT]], %{{.+}}, %{{.+}} : index
// CHECK: %[[Z:.+]] = arith.select %[[SPLIT]], %c1, %{{.+}} : index
// CHECK: hal.return %[[X]], %c1, %[[Z]] : index, index, index
// CHECK-NEXT: } <workgroup_size = [288 : index, 1 : index, 1 : index], workgroup_local_memory = 197632>
// CHECK: hal.executable.export public @stageml_gemm_expand_f16 ordinal(8) layout(#[[EXPAND]])
// CHECK: hal.return %{{.+}}, %c1, %{{.+}} : index, index, index
// CHECK-NEXT: } <workgroup_size = [288 : index, 1 : index, 1 : index], workgroup_local_memory = 197632>

// REF-NOT: hal.executable.source
// REF-NOT: flow.dispatch

module {
  util.global private @w = #flow.parameter.named<"model"::"w"> : tensor<256x512xf16>
  util.global private @w320 = #flow.parameter.named<"model"::"w320"> : tensor<320x512xf16>

  // A request-time product against a global weight, f32 accumulation rounded
  // once to f16: the weight's pack into tiles (64x64 tiles of 8-column strips,
  // [N/64, K/64, 8, 64, 8]: W split to [K/64, 64, N/64, 8, 8], then
  // transposed) follows its load (IREE hoists it to load time). K = 256 and
  // N = 512 are multiples of 256 and 64: the wgmma GEMM.
  // CHECK-LABEL: func.func @gemm
  // CHECK:         %[[W:.+]] = util.global.load @w : tensor<256x512xf16>
  // CHECK-NEXT:    %[[SPLIT:.+]] = tensor.expand_shape %[[W]] {{\[\[}}0, 1], [2, 3, 4]] output_shape [4, 64, 8, 8, 8] : tensor<256x512xf16> into tensor<4x64x8x8x8xf16>
  // CHECK-NEXT:    %[[E:.+]] = tensor.empty() : tensor<8x4x8x64x8xf16>
  // CHECK-NEXT:    %[[S:.+]] = linalg.transpose ins(%[[SPLIT]] : tensor<4x64x8x8x8xf16>) outs(%[[E]] : tensor<8x4x8x64x8xf16>) permutation = [2, 0, 3, 1, 4]
  // CHECK:         %[[MI:.+]] = arith.index_cast %[[M:.+]] : index to i32
  // CHECK:         %[[Y:.+]] = flow.dispatch @stageml_sm90::@stageml_gemm_wgmma_f16[%[[M]], %{{.+}}](%arg0, %[[S]], %[[MI]], %c256_i32, %c512_i32) : (tensor<?x256xf16>{%{{.+}}}, tensor<8x4x8x64x8xf16>, i32, i32, i32) -> tensor<?x512xf16>{%[[M]]}
  // CHECK-NOT:     linalg.matmul
  // CHECK:         return %[[Y]]
  // REF-LABEL: func.func @gemm
  // REF:         %[[S:.+]] = linalg.transpose
  // REF:         %[[MI:.+]] = arith.index_cast %{{.+}} : index to i32
  // REF-DAG:     %[[X:.+]] = tensor.cast %arg0 : tensor<?x256xf16> to tensor<?x?xf16>
  // REF-DAG:     %[[SC:.+]] = tensor.cast %[[S]] : tensor<8x4x8x64x8xf16> to tensor<?x?x8x64x8xf16>
  // REF:         %[[R:.+]] = call @stageml_gemm_wgmma_f16_reference(%[[X]], %[[SC]], %[[MI]], %c256_i32, %c512_i32) : (tensor<?x?xf16>, tensor<?x?x8x64x8xf16>, i32, i32, i32) -> tensor<?x?xf16>
  // REF:         %[[Y:.+]] = tensor.cast %[[R]] : tensor<?x?xf16> to tensor<?x512xf16>
  // REF-NOT:     linalg.matmul
  // REF:         return %[[Y]]
  func.func @gemm(%x: tensor<?x256xf16>) -> tensor<?x512xf16> attributes {bt.stage = "dynamic", bt.program = "main"} {
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : f32
    %w = util.global.load @w : tensor<256x512xf16>
    %m = tensor.dim %x, %c0 : tensor<?x256xf16>
    %e = tensor.empty(%m) : tensor<?x512xf32>
    %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<?x512xf32>) -> tensor<?x512xf32>
    %p = linalg.matmul ins(%x, %w : tensor<?x256xf16>, tensor<256x512xf16>) outs(%acc : tensor<?x512xf32>) -> tensor<?x512xf32>
    %e16 = tensor.empty(%m) : tensor<?x512xf16>
    %y = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%p : tensor<?x512xf32>) outs(%e16 : tensor<?x512xf16>) {
    ^bb0(%in: f32, %out: f16):
      %t = arith.truncf %in : f32 to f16
      linalg.yield %t : f16
    } -> tensor<?x512xf16>
    return %y : tensor<?x512xf16>
  }

  // Products off the request path (no bt.stage: the packs are inline) with
  // K a multiple of 64 but not of 256, the wgmma GEMM's (K = 384, N = 512 and
  // K = 192, N = 128): the general GEMM.
  // CHECK-LABEL: func.func @gemm_general
  // CHECK:         %[[S1:.+]] = linalg.transpose ins(%{{.+}} : tensor<6x64x8x8x8xf16>) outs(%{{.+}} : tensor<8x6x8x64x8xf16>)
  // CHECK:         %[[S2:.+]] = linalg.transpose ins(%{{.+}} : tensor<3x64x2x8x8xf16>) outs(%{{.+}} : tensor<2x3x8x64x8xf16>)
  // CHECK:         flow.dispatch @stageml_sm90::@stageml_gemm_f16[%{{.+}}, %{{.+}}](%arg0, %[[S1]], %{{.+}}, %c384_i32, %c512_i32) : (tensor<?x384xf16>{%{{.+}}}, tensor<8x6x8x64x8xf16>, i32, i32, i32) -> tensor<?x512xf16>
  // CHECK:         flow.dispatch @stageml_sm90::@stageml_gemm_f16[%{{.+}}, %{{.+}}](%arg2, %[[S2]], %{{.+}}, %c192_i32, %c128_i32) : (tensor<?x192xf16>{%{{.+}}}, tensor<2x3x8x64x8xf16>, i32, i32, i32) -> tensor<?x128xf16>
  // CHECK-NOT:     stageml_gemm_wgmma
  // CHECK-NOT:     linalg.matmul
  // CHECK:         return
  // REF-LABEL: func.func @gemm_general
  // REF:         call @stageml_gemm_f16_reference(%{{.+}}, %{{.+}}, %{{.+}}, %c384_i32, %c512_i32)
  // REF:         call @stageml_gemm_f16_reference(%{{.+}}, %{{.+}}, %{{.+}}, %c192_i32, %c128_i32)
  // REF-NOT:     linalg.matmul
  // REF:         return
  func.func @gemm_general(%x: tensor<?x384xf16>, %w: tensor<384x512xf16>, %h: tensor<?x192xf16>, %v: tensor<192x128xf16>) -> (tensor<?x512xf16>, tensor<?x128xf16>) {
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : f32
    %m = tensor.dim %x, %c0 : tensor<?x384xf16>
    %e = tensor.empty(%m) : tensor<?x512xf32>
    %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<?x512xf32>) -> tensor<?x512xf32>
    %p = linalg.matmul ins(%x, %w : tensor<?x384xf16>, tensor<384x512xf16>) outs(%acc : tensor<?x512xf32>) -> tensor<?x512xf32>
    %e16 = tensor.empty(%m) : tensor<?x512xf16>
    %y = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%p : tensor<?x512xf32>) outs(%e16 : tensor<?x512xf16>) {
    ^bb0(%in: f32, %out: f16):
      %t = arith.truncf %in : f32 to f16
      linalg.yield %t : f16
    } -> tensor<?x512xf16>
    %n = tensor.dim %h, %c0 : tensor<?x192xf16>
    %e2 = tensor.empty(%n) : tensor<?x128xf32>
    %acc2 = linalg.fill ins(%zero : f32) outs(%e2 : tensor<?x128xf32>) -> tensor<?x128xf32>
    %q = linalg.matmul ins(%h, %v : tensor<?x192xf16>, tensor<192x128xf16>) outs(%acc2 : tensor<?x128xf32>) -> tensor<?x128xf32>
    %e2_16 = tensor.empty(%n) : tensor<?x128xf16>
    %z = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%q : tensor<?x128xf32>) outs(%e2_16 : tensor<?x128xf16>) {
    ^bb0(%in: f32, %out: f16):
      %t = arith.truncf %in : f32 to f16
      linalg.yield %t : f16
    } -> tensor<?x128xf16>
    return %y, %z : tensor<?x512xf16>, tensor<?x128xf16>
  }

  // An unmerged LoRA site, PEFT's order (scale after the second product), in
  // a function off the request path (no bt.stage), w packed inline. K = 256:
  // the tenant path's kernels, the site's adapter as slot 0 of one-slot
  // tables: a BGMV shrink over zero ids, scaled by 2.0 in f32, then the
  // expand kernel over the same ids.
  // CHECK-LABEL: func.func @lora
  // CHECK:         %[[SPLIT:.+]] = tensor.expand_shape %arg3
  // CHECK:         %[[S:.+]] = linalg.transpose ins(%[[SPLIT]] {{.+}} outs(%{{.+}} : tensor<8x4x8x64x8xbf16>)
  // CHECK:         %[[IDS:.+]] = linalg.fill ins(%c0_i64 : i64) outs(%{{.+}} : tensor<?xi64>)
  // CHECK:         %[[X:.+]] = tensor.expand_shape %arg0 {{.+}} into tensor<?x1x256xbf16>
  // CHECK:         %[[A:.+]] = tensor.expand_shape %arg1 {{.+}} into tensor<1x256x8xbf16>
  // CHECK:         %[[B:.+]] = tensor.expand_shape %arg2 {{.+}} into tensor<1x8x512xbf16>
  // CHECK:         %[[T:.+]] = flow.dispatch @stageml_sm90::@stageml_bgmv_bf16[%{{.+}}, %c8](%[[X]], %[[IDS]], %[[A]], %{{.+}}, %c256_i32, %c8_i32) : {{.+}} -> tensor<?x1x8xf32>
  // CHECK:         %[[TS:.+]] = linalg.generic {{.+}} ins(%[[T]] : tensor<?x1x8xf32>)
  // CHECK:           %[[TWO:.+]] = arith.constant 2.000000e+00 : f32
  // CHECK:           arith.mulf %{{.+}}, %[[TWO]] : f32
  // CHECK:         flow.dispatch @stageml_sm90::@stageml_gemm_expand_bf16[%{{.+}}, %{{.+}}](%arg0, %[[S]], %[[TS]], %[[IDS]], %[[B]], %{{.+}}, %{{.+}}, %c512_i32, %{{.+}}, %{{.+}}) : (tensor<?x256xbf16>{%{{.+}}}, tensor<8x4x8x64x8xbf16>, tensor<?x1x8xf32>{%{{.+}}}, tensor<?xi64>{%{{.+}}}, tensor<1x8x512xbf16>, i32, i32, i32, i32, i32) -> tensor<?x512xbf16>
  // CHECK-NOT:     linalg.matmul
  // CHECK-NOT:     stageml_lora
  // CHECK-NOT:     stageml_gemm_wgmma
  // CHECK:         return
  // REF-LABEL: func.func @lora
  // REF:         %[[SPLIT:.+]] = tensor.expand_shape %arg3
  // REF:         %[[S:.+]] = linalg.transpose ins(%[[SPLIT]]
  // REF:         %[[IDS:.+]] = linalg.fill ins(%c0_i64 : i64)
  // REF:         %[[T:.+]] = call @stageml_bgmv_bf16_reference(%{{.+}}, %[[IDS]], %{{.+}}, %{{.+}}, %c256_i32, %c8_i32) : (tensor<?x1x?xbf16>, tensor<?xi64>, tensor<?x?x?xbf16>, i32, i32, i32) -> tensor<?x1x?xf32>
  // REF:         arith.mulf
  // REF:         %[[SC:.+]] = tensor.cast %[[S]] : tensor<8x4x8x64x8xbf16> to tensor<?x?x8x64x8xbf16>
  // REF:         call @stageml_gemm_expand_bf16_reference(%{{.+}}, %[[SC]], %{{.+}}, %[[IDS]], %{{.+}}, %{{.+}}, %{{.+}}, %c512_i32, %{{.+}}, %{{.+}}) : (tensor<?x?xbf16>, tensor<?x?x8x64x8xbf16>, tensor<?x1x?xf32>, tensor<?xi64>, tensor<?x?x?xbf16>, i32, i32, i32, i32, i32) -> tensor<?x?xbf16>
  // REF-NOT:     linalg.matmul
  // REF:         return
  func.func @lora(%x: tensor<?x256xbf16>, %a: tensor<256x8xbf16>, %b: tensor<8x512xbf16>, %w: tensor<256x512xbf16>) -> tensor<?x512xbf16> {
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : f32
    %s = arith.constant 2.0 : bf16
    %m = tensor.dim %x, %c0 : tensor<?x256xbf16>
    %e = tensor.empty(%m) : tensor<?x512xf32>
    %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<?x512xf32>) -> tensor<?x512xf32>
    %p = linalg.matmul ins(%x, %w : tensor<?x256xbf16>, tensor<256x512xbf16>) outs(%acc : tensor<?x512xf32>) -> tensor<?x512xf32>
    %e16 = tensor.empty(%m) : tensor<?x512xbf16>
    %base = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%p : tensor<?x512xf32>) outs(%e16 : tensor<?x512xbf16>) {
    ^bb0(%in: f32, %out: bf16):
      %t = arith.truncf %in : f32 to bf16
      linalg.yield %t : bf16
    } -> tensor<?x512xbf16>
    %er = tensor.empty(%m) : tensor<?x8xf32>
    %accr = linalg.fill ins(%zero : f32) outs(%er : tensor<?x8xf32>) -> tensor<?x8xf32>
    %pd = linalg.matmul ins(%x, %a : tensor<?x256xbf16>, tensor<256x8xbf16>) outs(%accr : tensor<?x8xf32>) -> tensor<?x8xf32>
    %er16 = tensor.empty(%m) : tensor<?x8xbf16>
    %down = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%pd : tensor<?x8xf32>) outs(%er16 : tensor<?x8xbf16>) {
    ^bb0(%in: f32, %out: bf16):
      %t = arith.truncf %in : f32 to bf16
      linalg.yield %t : bf16
    } -> tensor<?x8xbf16>
    %pu = linalg.matmul ins(%down, %b : tensor<?x8xbf16>, tensor<8x512xbf16>) outs(%acc : tensor<?x512xf32>) -> tensor<?x512xf32>
    %up = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%pu : tensor<?x512xf32>) outs(%e16 : tensor<?x512xbf16>) {
    ^bb0(%in: f32, %out: bf16):
      %t = arith.truncf %in : f32 to bf16
      linalg.yield %t : bf16
    } -> tensor<?x512xbf16>
    %scaled = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%up : tensor<?x512xbf16>) outs(%e16 : tensor<?x512xbf16>) {
    ^bb0(%in: bf16, %out: bf16):
      %t = arith.mulf %in, %s : bf16
      linalg.yield %t : bf16
    } -> tensor<?x512xbf16>
    %y = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel"]} ins(%base, %scaled : tensor<?x512xbf16>, tensor<?x512xbf16>) outs(%e16 : tensor<?x512xbf16>) {
    ^bb0(%in: bf16, %in_1: bf16, %out: bf16):
      %t = arith.addf %in, %in_1 : bf16
      linalg.yield %t : bf16
    } -> tensor<?x512xbf16>
    return %y : tensor<?x512xbf16>
  }

  // Both scales, one on x@A (0.25) and one after the second product (2.0):
  // the kernel gets their product, 0.5 (0x3F000000), and the x@A of rank 32,
  // which would fit a GEMM of its own, stays inside the site.
  // CHECK-LABEL: func.func @lora_two_scales
  // CHECK:         flow.dispatch @stageml_sm90::@stageml_lora_f16[%{{.+}}, %{{.+}}](%arg0, %{{.+}}, %arg1, %arg2, %{{.+}}, %c64_i32, %c128_i32, %c32_i32, %c1056964608_i32)
  // CHECK-NOT:     stageml_gemm
  // CHECK-NOT:     linalg.matmul
  // CHECK:         return
  // REF-LABEL: func.func @lora_two_scales
  // REF:         call @stageml_lora_f16_reference(%{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %c64_i32, %c128_i32, %c32_i32, %c1056964608_i32)
  // REF-NOT:     linalg.matmul
  // REF:         return
  func.func @lora_two_scales(%x: tensor<?x64xf16>, %a: tensor<64x32xf16>, %b: tensor<32x128xf16>, %w: tensor<64x128xf16>) -> tensor<?x128xf16> {
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : f32
    %s1 = arith.constant 0.25 : f16
    %s2 = arith.constant 2.0 : f16
    %m = tensor.dim %x, %c0 : tensor<?x64xf16>
    %e = tensor.empty(%m) : tensor<?x128xf32>
    %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<?x128xf32>) -> tensor<?x128xf32>
    %p = linalg.matmul ins(%x, %w : tensor<?x64xf16>, tensor<64x128xf16>) outs(%acc : tensor<?x128xf32>) -> tensor<?x128xf32>
    %e16 = tensor.empty(%m) : tensor<?x128xf16>
    %base = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%p : tensor<?x128xf32>) outs(%e16 : tensor<?x128xf16>) {
    ^bb0(%in: f32, %out: f16):
      %t = arith.truncf %in : f32 to f16
      linalg.yield %t : f16
    } -> tensor<?x128xf16>
    %er = tensor.empty(%m) : tensor<?x32xf32>
    %accr = linalg.fill ins(%zero : f32) outs(%er : tensor<?x32xf32>) -> tensor<?x32xf32>
    %pd = linalg.matmul ins(%x, %a : tensor<?x64xf16>, tensor<64x32xf16>) outs(%accr : tensor<?x32xf32>) -> tensor<?x32xf32>
    %er16 = tensor.empty(%m) : tensor<?x32xf16>
    %down = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%pd : tensor<?x32xf32>) outs(%er16 : tensor<?x32xf16>) {
    ^bb0(%in: f32, %out: f16):
      %t = arith.truncf %in : f32 to f16
      linalg.yield %t : f16
    } -> tensor<?x32xf16>
    %down_scaled = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%down : tensor<?x32xf16>) outs(%er16 : tensor<?x32xf16>) {
    ^bb0(%in: f16, %out: f16):
      %t = arith.mulf %in, %s1 : f16
      linalg.yield %t : f16
    } -> tensor<?x32xf16>
    %pu = linalg.matmul ins(%down_scaled, %b : tensor<?x32xf16>, tensor<32x128xf16>) outs(%acc : tensor<?x128xf32>) -> tensor<?x128xf32>
    %up = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%pu : tensor<?x128xf32>) outs(%e16 : tensor<?x128xf16>) {
    ^bb0(%in: f32, %out: f16):
      %t = arith.truncf %in : f32 to f16
      linalg.yield %t : f16
    } -> tensor<?x128xf16>
    %scaled = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%up : tensor<?x128xf16>) outs(%e16 : tensor<?x128xf16>) {
    ^bb0(%in: f16, %out: f16):
      %t = arith.mulf %in, %s2 : f16
      linalg.yield %t : f16
    } -> tensor<?x128xf16>
    %y = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel"]} ins(%scaled, %base : tensor<?x128xf16>, tensor<?x128xf16>) outs(%e16 : tensor<?x128xf16>) {
    ^bb0(%in: f16, %in_1: f16, %out: f16):
      %t = arith.addf %in, %in_1 : f16
      linalg.yield %t : f16
    } -> tensor<?x128xf16>
    return %y : tensor<?x128xf16>
  }

  // x@A is also a result: the site stays unfused, its base product becomes
  // a GEMM of its own, the wgmma one (K = 256, N = 512); x@A (8 columns) and
  // the up product (K = 8) are too small for the kernels (K and N multiples
  // of 64) and stay with IREE.
  // CHECK-LABEL: func.func @lora_shared_down
  // CHECK-NOT:     stageml_lora
  // CHECK:         flow.dispatch @stageml_sm90::@stageml_gemm_wgmma_bf16[%{{.+}}, %{{.+}}](%arg0, %{{.+}}, %{{.+}}, %c256_i32, %c512_i32)
  // CHECK-NOT:     flow.dispatch
  // CHECK-COUNT-2: linalg.matmul
  // CHECK-NOT:     flow.dispatch
  // CHECK:         return
  // REF-LABEL: func.func @lora_shared_down
  // REF:         call @stageml_gemm_wgmma_bf16_reference
  // REF-NOT:     call
  // REF:         return
  func.func @lora_shared_down(%x: tensor<?x256xbf16>, %a: tensor<256x8xbf16>, %b: tensor<8x512xbf16>, %w: tensor<256x512xbf16>) -> (tensor<?x512xbf16>, tensor<?x8xbf16>) {
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : f32
    %s = arith.constant 2.0 : bf16
    %m = tensor.dim %x, %c0 : tensor<?x256xbf16>
    %e = tensor.empty(%m) : tensor<?x512xf32>
    %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<?x512xf32>) -> tensor<?x512xf32>
    %p = linalg.matmul ins(%x, %w : tensor<?x256xbf16>, tensor<256x512xbf16>) outs(%acc : tensor<?x512xf32>) -> tensor<?x512xf32>
    %e16 = tensor.empty(%m) : tensor<?x512xbf16>
    %base = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%p : tensor<?x512xf32>) outs(%e16 : tensor<?x512xbf16>) {
    ^bb0(%in: f32, %out: bf16):
      %t = arith.truncf %in : f32 to bf16
      linalg.yield %t : bf16
    } -> tensor<?x512xbf16>
    %er = tensor.empty(%m) : tensor<?x8xf32>
    %accr = linalg.fill ins(%zero : f32) outs(%er : tensor<?x8xf32>) -> tensor<?x8xf32>
    %pd = linalg.matmul ins(%x, %a : tensor<?x256xbf16>, tensor<256x8xbf16>) outs(%accr : tensor<?x8xf32>) -> tensor<?x8xf32>
    %er16 = tensor.empty(%m) : tensor<?x8xbf16>
    %down = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%pd : tensor<?x8xf32>) outs(%er16 : tensor<?x8xbf16>) {
    ^bb0(%in: f32, %out: bf16):
      %t = arith.truncf %in : f32 to bf16
      linalg.yield %t : bf16
    } -> tensor<?x8xbf16>
    %pu = linalg.matmul ins(%down, %b : tensor<?x8xbf16>, tensor<8x512xbf16>) outs(%acc : tensor<?x512xf32>) -> tensor<?x512xf32>
    %up = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%pu : tensor<?x512xf32>) outs(%e16 : tensor<?x512xbf16>) {
    ^bb0(%in: f32, %out: bf16):
      %t = arith.truncf %in : f32 to bf16
      linalg.yield %t : bf16
    } -> tensor<?x512xbf16>
    %scaled = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%up : tensor<?x512xbf16>) outs(%e16 : tensor<?x512xbf16>) {
    ^bb0(%in: bf16, %out: bf16):
      %t = arith.mulf %in, %s : bf16
      linalg.yield %t : bf16
    } -> tensor<?x512xbf16>
    %y = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel"]} ins(%base, %scaled : tensor<?x512xbf16>, tensor<?x512xbf16>) outs(%e16 : tensor<?x512xbf16>) {
    ^bb0(%in: bf16, %in_1: bf16, %out: bf16):
      %t = arith.addf %in, %in_1 : bf16
      linalg.yield %t : bf16
    } -> tensor<?x512xbf16>
    return %y, %down : tensor<?x512xbf16>, tensor<?x8xbf16>
  }

  // Adapter state: a request-path argument with bt.result = 0, result 0 of
  // the program's adapter function. The pack moves into the adapter
  // function, which returns the tiles; the argument's type follows.
  // CHECK-LABEL: func.func @adapter(%arg0: tensor<256x512xf16>) -> tensor<8x4x8x64x8xf16>
  // CHECK:         %[[SPLIT:.+]] = tensor.expand_shape %arg0
  // CHECK:         %[[S:.+]] = linalg.transpose ins(%[[SPLIT]] {{.+}} outs(%{{.+}} : tensor<8x4x8x64x8xf16>)
  // CHECK:         return %[[S]]
  // CHECK-LABEL: func.func @forward(%arg0: tensor<8x4x8x64x8xf16> {bt.result = 0 : i64}, %arg1: tensor<?x256xf16>)
  // CHECK-NOT:     linalg.transpose
  // CHECK:         flow.dispatch @stageml_sm90::@stageml_gemm_wgmma_f16[%{{.+}}, %{{.+}}](%arg1, %arg0,
  // REF-LABEL: func.func @adapter(%arg0: tensor<256x512xf16>) -> tensor<8x4x8x64x8xf16>
  // REF:         tensor.expand_shape %arg0
  // REF:         linalg.transpose
  // REF-LABEL: func.func @forward(%arg0: tensor<8x4x8x64x8xf16> {bt.result = 0 : i64}, %arg1: tensor<?x256xf16>)
  // REF-NOT:     linalg.transpose
  // REF:         %[[SC:.+]] = tensor.cast %arg0 : tensor<8x4x8x64x8xf16> to tensor<?x?x8x64x8xf16>
  // REF:         call @stageml_gemm_wgmma_f16_reference(%{{.+}}, %[[SC]],
  func.func @adapter(%w: tensor<256x512xf16>) -> tensor<256x512xf16> attributes {bt.stage = "adapter", bt.program = "adapted"} {
    return %w : tensor<256x512xf16>
  }
  func.func @forward(%w: tensor<256x512xf16> {bt.result = 0 : i64}, %x: tensor<?x256xf16>) -> tensor<?x512xf16> attributes {bt.stage = "dynamic", bt.program = "adapted"} {
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : f32
    %m = tensor.dim %x, %c0 : tensor<?x256xf16>
    %e = tensor.empty(%m) : tensor<?x512xf32>
    %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<?x512xf32>) -> tensor<?x512xf32>
    %p = linalg.matmul ins(%x, %w : tensor<?x256xf16>, tensor<256x512xf16>) outs(%acc : tensor<?x512xf32>) -> tensor<?x512xf32>
    %e16 = tensor.empty(%m) : tensor<?x512xf16>
    %y = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%p : tensor<?x512xf32>) outs(%e16 : tensor<?x512xf16>) {
    ^bb0(%in: f32, %out: f16):
      %t = arith.truncf %in : f32 to f16
      linalg.yield %t : f16
    } -> tensor<?x512xf16>
    return %y : tensor<?x512xf16>
  }

  // Adapter state with two uses: packing it in the adapter function would
  // change its type for both, and packing it here would cost a pass over it
  // per request, so both products stay with IREE.
  // CHECK-LABEL: func.func @adapter_shared(%arg0: tensor<256x512xf16>) -> tensor<256x512xf16>
  // CHECK-NOT:     linalg.transpose
  // CHECK-LABEL: func.func @forward_shared(%arg0: tensor<256x512xf16> {bt.result = 0 : i64}
  // CHECK-NOT:     flow.dispatch
  // CHECK-COUNT-2: linalg.matmul
  // CHECK-NOT:     flow.dispatch
  // CHECK:         return
  // REF-LABEL: func.func @forward_shared
  // REF-NOT:     call
  // REF:         return
  func.func @adapter_shared(%w: tensor<256x512xf16>) -> tensor<256x512xf16> attributes {bt.stage = "adapter", bt.program = "shared"} {
    return %w : tensor<256x512xf16>
  }
  func.func @forward_shared(%w: tensor<256x512xf16> {bt.result = 0 : i64}, %x: tensor<?x256xf16>, %h: tensor<?x256xf16>) -> (tensor<?x512xf16>, tensor<?x512xf16>) attributes {bt.stage = "dynamic", bt.program = "shared"} {
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : f32
    %m = tensor.dim %x, %c0 : tensor<?x256xf16>
    %e = tensor.empty(%m) : tensor<?x512xf32>
    %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<?x512xf32>) -> tensor<?x512xf32>
    %p = linalg.matmul ins(%x, %w : tensor<?x256xf16>, tensor<256x512xf16>) outs(%acc : tensor<?x512xf32>) -> tensor<?x512xf32>
    %e16 = tensor.empty(%m) : tensor<?x512xf16>
    %y = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%p : tensor<?x512xf32>) outs(%e16 : tensor<?x512xf16>) {
    ^bb0(%in: f32, %out: f16):
      %t = arith.truncf %in : f32 to f16
      linalg.yield %t : f16
    } -> tensor<?x512xf16>
    %q = linalg.matmul ins(%h, %w : tensor<?x256xf16>, tensor<256x512xf16>) outs(%acc : tensor<?x512xf32>) -> tensor<?x512xf32>
    %z = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%q : tensor<?x512xf32>) outs(%e16 : tensor<?x512xf16>) {
    ^bb0(%in: f32, %out: f16):
      %t = arith.truncf %in : f32 to f16
      linalg.yield %t : f16
    } -> tensor<?x512xf16>
    return %y, %z : tensor<?x512xf16>, tensor<?x512xf16>
  }

  // A one-adapter LoRA site on adapter state a, b (K = 256) against the
  // global w: the site's scale (0.5, on x@A) moves into the adapter
  // function, which returns b times 0.5; the request path scales nothing.
  // CHECK-LABEL: func.func @adapter_lora(%arg0: tensor<256x8xf16>, %arg1: tensor<8x512xf16>) -> (tensor<256x8xf16>, tensor<8x512xf16>)
  // CHECK:         %[[B:.+]] = linalg.generic {{.+}} ins(%arg1 : tensor<8x512xf16>)
  // CHECK:           %[[HALF:.+]] = arith.constant 5.000000e-01 : f16
  // CHECK:           arith.mulf %{{.+}}, %[[HALF]] : f16
  // CHECK:         return %arg0, %[[B]]
  // CHECK-LABEL: func.func @forward_lora(%arg0: tensor<256x8xf16> {bt.result = 0 : i64}, %arg1: tensor<8x512xf16> {bt.result = 1 : i64}, %arg2: tensor<?x256xf16>)
  // CHECK:         flow.dispatch @stageml_sm90::@stageml_bgmv_f16
  // CHECK-NOT:     arith.mulf
  // CHECK:         flow.dispatch @stageml_sm90::@stageml_gemm_expand_f16
  // CHECK-NOT:     linalg.matmul
  // CHECK:         return
  // REF-LABEL: func.func @adapter_lora
  // REF:           arith.mulf
  // REF-LABEL: func.func @forward_lora
  // REF:         call @stageml_bgmv_f16_reference
  // REF-NOT:     arith.mulf
  // REF:         call @stageml_gemm_expand_f16_reference
  func.func @adapter_lora(%a: tensor<256x8xf16>, %b: tensor<8x512xf16>) -> (tensor<256x8xf16>, tensor<8x512xf16>) attributes {bt.stage = "adapter", bt.program = "lora"} {
    return %a, %b : tensor<256x8xf16>, tensor<8x512xf16>
  }
  func.func @forward_lora(%a: tensor<256x8xf16> {bt.result = 0 : i64}, %b: tensor<8x512xf16> {bt.result = 1 : i64}, %x: tensor<?x256xf16>) -> tensor<?x512xf16> attributes {bt.stage = "dynamic", bt.program = "lora"} {
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : f32
    %s = arith.constant 0.5 : f16
    %w = util.global.load @w : tensor<256x512xf16>
    %m = tensor.dim %x, %c0 : tensor<?x256xf16>
    %e = tensor.empty(%m) : tensor<?x512xf32>
    %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<?x512xf32>) -> tensor<?x512xf32>
    %p = linalg.matmul ins(%x, %w : tensor<?x256xf16>, tensor<256x512xf16>) outs(%acc : tensor<?x512xf32>) -> tensor<?x512xf32>
    %e16 = tensor.empty(%m) : tensor<?x512xf16>
    %base = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%p : tensor<?x512xf32>) outs(%e16 : tensor<?x512xf16>) {
    ^bb0(%in: f32, %out: f16):
      %t = arith.truncf %in : f32 to f16
      linalg.yield %t : f16
    } -> tensor<?x512xf16>
    %er = tensor.empty(%m) : tensor<?x8xf32>
    %accr = linalg.fill ins(%zero : f32) outs(%er : tensor<?x8xf32>) -> tensor<?x8xf32>
    %pd = linalg.matmul ins(%x, %a : tensor<?x256xf16>, tensor<256x8xf16>) outs(%accr : tensor<?x8xf32>) -> tensor<?x8xf32>
    %er16 = tensor.empty(%m) : tensor<?x8xf16>
    %down = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%pd : tensor<?x8xf32>) outs(%er16 : tensor<?x8xf16>) {
    ^bb0(%in: f32, %out: f16):
      %t = arith.truncf %in : f32 to f16
      linalg.yield %t : f16
    } -> tensor<?x8xf16>
    %scaled = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%down : tensor<?x8xf16>) outs(%er16 : tensor<?x8xf16>) {
    ^bb0(%in: f16, %out: f16):
      %t = arith.mulf %in, %s : f16
      linalg.yield %t : f16
    } -> tensor<?x8xf16>
    %pu = linalg.matmul ins(%scaled, %b : tensor<?x8xf16>, tensor<8x512xf16>) outs(%acc : tensor<?x512xf32>) -> tensor<?x512xf32>
    %up = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%pu : tensor<?x512xf32>) outs(%e16 : tensor<?x512xf16>) {
    ^bb0(%in: f32, %out: f16):
      %t = arith.truncf %in : f32 to f16
      linalg.yield %t : f16
    } -> tensor<?x512xf16>
    %y = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel"]} ins(%base, %up : tensor<?x512xf16>, tensor<?x512xf16>) outs(%e16 : tensor<?x512xf16>) {
    ^bb0(%in: f16, %in_1: f16, %out: f16):
      %t = arith.addf %in, %in_1 : f16
      linalg.yield %t : f16
    } -> tensor<?x512xf16>
    return %y : tensor<?x512xf16>
  }

  // A request-path product against an argument that is not adapter state
  // (no bt.result) stays with IREE: its pack would be a pass over the weight
  // per request.
  // CHECK-LABEL: func.func @forward_unmarked
  // CHECK-NOT:     flow.dispatch
  // CHECK:         linalg.matmul
  // REF-LABEL: func.func @forward_unmarked
  // REF-NOT:     call
  // REF:         linalg.matmul
  func.func @forward_unmarked(%w: tensor<256x512xf16>, %x: tensor<?x256xf16>) -> tensor<?x512xf16> attributes {bt.stage = "dynamic", bt.program = "unmarked"} {
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : f32
    %m = tensor.dim %x, %c0 : tensor<?x256xf16>
    %e = tensor.empty(%m) : tensor<?x512xf32>
    %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<?x512xf32>) -> tensor<?x512xf32>
    %p = linalg.matmul ins(%x, %w : tensor<?x256xf16>, tensor<256x512xf16>) outs(%acc : tensor<?x512xf32>) -> tensor<?x512xf32>
    %e16 = tensor.empty(%m) : tensor<?x512xf16>
    %y = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%p : tensor<?x512xf32>) outs(%e16 : tensor<?x512xf16>) {
    ^bb0(%in: f32, %out: f16):
      %t = arith.truncf %in : f32 to f16
      linalg.yield %t : f16
    } -> tensor<?x512xf16>
    return %y : tensor<?x512xf16>
  }

  // A multi-tenant residual's per-row product of one-token rows (fuse-gathers'
  // form): each row against its own slot of the factor table.
  // CHECK-LABEL: func.func @forward_factorized
  // CHECK:         %[[BI:.+]] = arith.index_cast %[[B:.+]] : index to i32
  // CHECK:         flow.dispatch @stageml_sm90::@stageml_bgmv_f16[%[[B]], %{{.+}}](%arg0, %arg1, %arg2, %[[BI]], %c256_i32, %c16_i32) : (tensor<?x1x256xf16>{%{{.+}}}, tensor<?xi64>{%{{.+}}}, tensor<5x256x16xf16>, i32, i32, i32) -> tensor<?x1x16xf32>{%[[B]]}
  // CHECK-NOT:     tensor.extract
  // REF-LABEL: func.func @forward_factorized
  // REF:         %[[BI:.+]] = arith.index_cast %{{.+}} : index to i32
  // REF-DAG:     %[[X:.+]] = tensor.cast %arg0 : tensor<?x1x256xf16> to tensor<?x1x?xf16>
  // REF-DAG:     %[[T:.+]] = tensor.cast %arg2 : tensor<5x256x16xf16> to tensor<?x?x?xf16>
  // REF:         %[[R:.+]] = call @stageml_bgmv_f16_reference(%[[X]], %arg1, %[[T]], %[[BI]], %c256_i32, %c16_i32) : (tensor<?x1x?xf16>, tensor<?xi64>, tensor<?x?x?xf16>, i32, i32, i32) -> tensor<?x1x?xf32>
  // REF:         tensor.cast %[[R]] : tensor<?x1x?xf32> to tensor<?x1x16xf32>
  // REF-NOT:     tensor.extract
  func.func @forward_factorized(%x: tensor<?x1x256xf16>, %ids: tensor<?xi64>, %table: tensor<5x256x16xf16> {bt.kind = "resident"}) -> tensor<?x1x16xf32> attributes {bt.stage = "dynamic", bt.program = "factorized"} {
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : f32
    %b = tensor.dim %x, %c0 : tensor<?x1x256xf16>
    %e = tensor.empty(%b) : tensor<?x1x16xf32>
    %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<?x1x16xf32>) -> tensor<?x1x16xf32>
    %y = linalg.generic {indexing_maps = [affine_map<(b, m, n, k) -> (b, m, k)>, affine_map<(b, m, n, k) -> (b)>, affine_map<(b, m, n, k) -> (b, m, n)>], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%x, %ids : tensor<?x1x256xf16>, tensor<?xi64>) outs(%acc : tensor<?x1x16xf32>) {
    ^bb0(%in: f16, %id: i64, %out: f32):
      %row = arith.index_cast %id : i64 to index
      %n = linalg.index 2 : index
      %k = linalg.index 3 : index
      %w = tensor.extract %table[%row, %k, %n] : tensor<5x256x16xf16>
      %wf = arith.extf %w : f16 to f32
      %xf = arith.extf %in : f16 to f32
      %p = arith.mulf %xf, %wf : f32
      %s = arith.addf %out, %p : f32
      linalg.yield %s : f32
    } -> tensor<?x1x16xf32>
    return %y : tensor<?x1x16xf32>
  }

  // A multi-tenant site (fuse-gathers' form): the base product against a
  // global weight plus the expand of each row's own adapter, the per-row
  // product of the rounded shrink t by the B table, rounded and collapsed to
  // [M, N]. K = 256 and N = 512 (multiples of 256 and 64): the base product
  // and the expand become one stageml_gemm_expand, which reads t in f32 and
  // rounds once (the truncf of t, the expand's product, its truncf, the
  // collapse and the add go); rows is the ids' count. The shrink stays a BGMV.
  // CHECK-LABEL: func.func @forward_tenants
  // CHECK:         %[[S:.+]] = linalg.transpose
  // CHECK:         %[[T:.+]] = flow.dispatch @stageml_sm90::@stageml_bgmv_f16[%{{.+}}, %{{.+}}](%{{.+}}, %arg1, %arg2, %{{.+}}, %c256_i32{{[_0-9]*}}, %c8_i32{{[_0-9]*}}) : {{.+}} -> tensor<?x1x8xf32>
  // CHECK:         %[[IDS:.+]] = tensor.dim %arg1, %{{.+}} : tensor<?xi64>
  // CHECK:         %[[ROWS:.+]] = arith.index_cast %[[IDS]] : index to i32
  // CHECK:         %[[Y:.+]] = flow.dispatch @stageml_sm90::@stageml_gemm_expand_f16[%{{.+}}, %{{.+}}](%arg0, %[[S]], %[[T]], %arg1, %arg3, %{{.+}}, %c256_i32{{[_0-9]*}}, %c512_i32{{[_0-9]*}}, %c8_i32{{[_0-9]*}}, %[[ROWS]]) : (tensor<?x256xf16>{%{{.+}}}, tensor<8x4x8x64x8xf16>, tensor<?x1x8xf32>{%{{.+}}}, tensor<?xi64>{%{{.+}}}, tensor<5x8x512xf16>, i32, i32, i32, i32, i32) -> tensor<?x512xf16>
  // CHECK-NOT:     linalg.generic
  // CHECK-NOT:     tensor.collapse_shape
  // CHECK:         return %[[Y]]
  // REF-LABEL: func.func @forward_tenants
  // REF:         %[[T:.+]] = call @stageml_bgmv_f16_reference(
  // REF:         %[[TC:.+]] = tensor.cast %[[T]] : tensor<?x1x?xf32> to tensor<?x1x8xf32>
  // REF:         %[[IDS:.+]] = tensor.dim %arg1, %{{.+}} : tensor<?xi64>
  // REF:         %[[ROWS:.+]] = arith.index_cast %[[IDS]] : index to i32
  // REF-DAG:     %[[TT:.+]] = tensor.cast %[[TC]] : tensor<?x1x8xf32> to tensor<?x1x?xf32>
  // REF-DAG:     %[[B:.+]] = tensor.cast %arg3 : tensor<5x8x512xf16> to tensor<?x?x?xf16>
  // REF:         call @stageml_gemm_expand_f16_reference(%{{.+}}, %{{.+}}, %[[TT]], %arg1, %[[B]], %{{.+}}, %c256_i32{{[_0-9]*}}, %c512_i32{{[_0-9]*}}, %c8_i32{{[_0-9]*}}, %[[ROWS]]) : (tensor<?x?xf16>, tensor<?x?x8x64x8xf16>, tensor<?x1x?xf32>, tensor<?xi64>, tensor<?x?x?xf16>, i32, i32, i32, i32, i32) -> tensor<?x?xf16>
  // REF-NOT:     linalg.generic
  // REF:         return
  func.func @forward_tenants(%x: tensor<?x256xf16>, %ids: tensor<?xi64>, %a: tensor<5x256x8xf16> {bt.kind = "resident"}, %b: tensor<5x8x512xf16> {bt.kind = "resident"}) -> tensor<?x512xf16> attributes {bt.stage = "dynamic", bt.program = "factorized"} {
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : f32
    %w = util.global.load @w : tensor<256x512xf16>
    %m = tensor.dim %x, %c0 : tensor<?x256xf16>
    %e = tensor.empty(%m) : tensor<?x512xf32>
    %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<?x512xf32>) -> tensor<?x512xf32>
    %p = linalg.matmul ins(%x, %w : tensor<?x256xf16>, tensor<256x512xf16>) outs(%acc : tensor<?x512xf32>) -> tensor<?x512xf32>
    %e16 = tensor.empty(%m) : tensor<?x512xf16>
    %base = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%p : tensor<?x512xf32>) outs(%e16 : tensor<?x512xf16>) {
    ^bb0(%in: f32, %out: f16):
      %r = arith.truncf %in : f32 to f16
      linalg.yield %r : f16
    } -> tensor<?x512xf16>
    %x3 = tensor.expand_shape %x [[0], [1, 2]] output_shape [%m, 1, 256] : tensor<?x256xf16> into tensor<?x1x256xf16>
    %te = tensor.empty(%m) : tensor<?x1x8xf32>
    %tacc = linalg.fill ins(%zero : f32) outs(%te : tensor<?x1x8xf32>) -> tensor<?x1x8xf32>
    %t = linalg.generic {indexing_maps = [affine_map<(b, m, n, k) -> (b, m, k)>, affine_map<(b, m, n, k) -> (b)>, affine_map<(b, m, n, k) -> (b, m, n)>], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%x3, %ids : tensor<?x1x256xf16>, tensor<?xi64>) outs(%tacc : tensor<?x1x8xf32>) {
    ^bb0(%in: f16, %id: i64, %out: f32):
      %slot = arith.index_cast %id : i64 to index
      %n = linalg.index 2 : index
      %k = linalg.index 3 : index
      %v = tensor.extract %a[%slot, %k, %n] : tensor<5x256x8xf16>
      %vf = arith.extf %v : f16 to f32
      %xf = arith.extf %in : f16 to f32
      %pr = arith.mulf %xf, %vf : f32
      %s = arith.addf %out, %pr : f32
      linalg.yield %s : f32
    } -> tensor<?x1x8xf32>
    %te16 = tensor.empty(%m) : tensor<?x1x8xf16>
    %t16 = linalg.generic {indexing_maps = [#rows, #rows], iterator_types = ["parallel", "parallel", "parallel"]} ins(%t : tensor<?x1x8xf32>) outs(%te16 : tensor<?x1x8xf16>) {
    ^bb0(%in: f32, %out: f16):
      %r = arith.truncf %in : f32 to f16
      linalg.yield %r : f16
    } -> tensor<?x1x8xf16>
    %le = tensor.empty(%m) : tensor<?x1x512xf32>
    %lacc = linalg.fill ins(%zero : f32) outs(%le : tensor<?x1x512xf32>) -> tensor<?x1x512xf32>
    %l = linalg.generic {indexing_maps = [affine_map<(b, m, n, k) -> (b, m, k)>, affine_map<(b, m, n, k) -> (b)>, affine_map<(b, m, n, k) -> (b, m, n)>], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%t16, %ids : tensor<?x1x8xf16>, tensor<?xi64>) outs(%lacc : tensor<?x1x512xf32>) {
    ^bb0(%in: f16, %id: i64, %out: f32):
      %slot = arith.index_cast %id : i64 to index
      %n = linalg.index 2 : index
      %k = linalg.index 3 : index
      %v = tensor.extract %b[%slot, %k, %n] : tensor<5x8x512xf16>
      %vf = arith.extf %v : f16 to f32
      %xf = arith.extf %in : f16 to f32
      %pr = arith.mulf %xf, %vf : f32
      %s = arith.addf %out, %pr : f32
      linalg.yield %s : f32
    } -> tensor<?x1x512xf32>
    %le16 = tensor.empty(%m) : tensor<?x1x512xf16>
    %l16 = linalg.generic {indexing_maps = [#rows, #rows], iterator_types = ["parallel", "parallel", "parallel"]} ins(%l : tensor<?x1x512xf32>) outs(%le16 : tensor<?x1x512xf16>) {
    ^bb0(%in: f32, %out: f16):
      %r = arith.truncf %in : f32 to f16
      linalg.yield %r : f16
    } -> tensor<?x1x512xf16>
    %l2 = tensor.collapse_shape %l16 [[0, 1], [2]] : tensor<?x1x512xf16> into tensor<?x512xf16>
    %y = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel"]} ins(%base, %l2 : tensor<?x512xf16>, tensor<?x512xf16>) outs(%e16 : tensor<?x512xf16>) {
    ^bb0(%in: f16, %in_1: f16, %out: f16):
      %r = arith.addf %in, %in_1 : f16
      linalg.yield %r : f16
    } -> tensor<?x512xf16>
    return %y : tensor<?x512xf16>
  }

  // The same site on rows of T tokens (fuse-gathers{multi-token}'s form): the
  // per-row products take the B*T token rows, each with its row's slot (%tids),
  // and reach the add [B, T, N] through reshapes of their rows, as does the
  // base product. The export bounds the rows: at most 8 x 16 = 128 token rows
  // (bt.dims, through the collapse), so the whole site, shrink included, is
  // one stageml_gemm_lora (site 0: the module's first); it computes the token
  // rows, and its [B*T, N] result is reshaped to [B, T, N].
  // CHECK-LABEL: func.func @forward_tenant_tokens
  // CHECK:         %[[XF:.+]] = tensor.collapse_shape %arg0 {{\[}}[0, 1], [2]]
  // CHECK:         %[[Y:.+]]:2 = flow.dispatch @stageml_sm90::@stageml_gemm_lora_f16[{{.+}}](%[[XF]], %{{.+}}, %arg1, %arg2, %arg3, %{{.+}}, %c256_i32{{[_0-9]*}}, %c512_i32{{[_0-9]*}}, %c8_i32{{[_0-9]*}}, %{{.+}}, %c1065353216_i32, %c0_i32) : {{.+}} -> (tensor<?x512xf16>{%{{.+}}}, tensor<1x?x8xf32>{%{{.+}}})
  // CHECK-NOT:     stageml_bgmv
  // CHECK-NOT:     linalg.generic
  // CHECK:         %[[Y3:.+]] = tensor.expand_shape %[[Y]]#0 {{\[}}[0, 1], [2]] output_shape [%{{.+}}, %{{.+}}, 512] : tensor<?x512xf16> into tensor<?x?x512xf16>
  // CHECK:         return %[[Y3]]
  // REF-LABEL: func.func @forward_tenant_tokens
  // REF:         call @stageml_gemm_lora_f16_reference(
  // REF-NOT:     stageml_bgmv
  // REF-NOT:     linalg.generic
  // REF:         tensor.expand_shape
  // REF:         return
  func.func @forward_tenant_tokens(%x: tensor<?x?x256xf16> {bt.dims = [{max = 8 : i64, min = 1 : i64}, {max = 16 : i64, min = 1 : i64}, {max = 256 : i64, min = 256 : i64}]}, %tids: tensor<?xi64>, %a: tensor<5x256x8xf16> {bt.kind = "resident"}, %b: tensor<5x8x512xf16> {bt.kind = "resident"}) -> tensor<?x?x512xf16> attributes {bt.stage = "dynamic", bt.program = "factorized"} {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %zero = arith.constant 0.0 : f32
    %w = util.global.load @w : tensor<256x512xf16>
    %bs = tensor.dim %x, %c0 : tensor<?x?x256xf16>
    %ts = tensor.dim %x, %c1 : tensor<?x?x256xf16>
    %xf = tensor.collapse_shape %x [[0, 1], [2]] : tensor<?x?x256xf16> into tensor<?x256xf16>
    %m = tensor.dim %xf, %c0 : tensor<?x256xf16>
    %e = tensor.empty(%m) : tensor<?x512xf32>
    %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<?x512xf32>) -> tensor<?x512xf32>
    %p = linalg.matmul ins(%xf, %w : tensor<?x256xf16>, tensor<256x512xf16>) outs(%acc : tensor<?x512xf32>) -> tensor<?x512xf32>
    %e16 = tensor.empty(%m) : tensor<?x512xf16>
    %base = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%p : tensor<?x512xf32>) outs(%e16 : tensor<?x512xf16>) {
    ^bb0(%in: f32, %out: f16):
      %r = arith.truncf %in : f32 to f16
      linalg.yield %r : f16
    } -> tensor<?x512xf16>
    %base3 = tensor.expand_shape %base [[0, 1], [2]] output_shape [%bs, %ts, 512] : tensor<?x512xf16> into tensor<?x?x512xf16>
    %x3 = tensor.expand_shape %xf [[0, 1], [2]] output_shape [%m, 1, 256] : tensor<?x256xf16> into tensor<?x1x256xf16>
    %te = tensor.empty(%m) : tensor<?x1x8xf32>
    %tacc = linalg.fill ins(%zero : f32) outs(%te : tensor<?x1x8xf32>) -> tensor<?x1x8xf32>
    %t = linalg.generic {indexing_maps = [affine_map<(b, m, n, k) -> (b, m, k)>, affine_map<(b, m, n, k) -> (b)>, affine_map<(b, m, n, k) -> (b, m, n)>], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%x3, %tids : tensor<?x1x256xf16>, tensor<?xi64>) outs(%tacc : tensor<?x1x8xf32>) {
    ^bb0(%in: f16, %id: i64, %out: f32):
      %slot = arith.index_cast %id : i64 to index
      %n = linalg.index 2 : index
      %k = linalg.index 3 : index
      %v = tensor.extract %a[%slot, %k, %n] : tensor<5x256x8xf16>
      %vf = arith.extf %v : f16 to f32
      %xf1 = arith.extf %in : f16 to f32
      %pr = arith.mulf %xf1, %vf : f32
      %s = arith.addf %out, %pr : f32
      linalg.yield %s : f32
    } -> tensor<?x1x8xf32>
    %t2 = tensor.collapse_shape %t [[0, 1], [2]] : tensor<?x1x8xf32> into tensor<?x8xf32>
    %t3 = tensor.expand_shape %t2 [[0, 1], [2]] output_shape [%bs, %ts, 8] : tensor<?x8xf32> into tensor<?x?x8xf32>
    %te16 = tensor.empty(%bs, %ts) : tensor<?x?x8xf16>
    %t16 = linalg.generic {indexing_maps = [#rows, #rows], iterator_types = ["parallel", "parallel", "parallel"]} ins(%t3 : tensor<?x?x8xf32>) outs(%te16 : tensor<?x?x8xf16>) {
    ^bb0(%in: f32, %out: f16):
      %r = arith.truncf %in : f32 to f16
      linalg.yield %r : f16
    } -> tensor<?x?x8xf16>
    %t16f = tensor.collapse_shape %t16 [[0, 1], [2]] : tensor<?x?x8xf16> into tensor<?x8xf16>
    %t16r = tensor.expand_shape %t16f [[0, 1], [2]] output_shape [%m, 1, 8] : tensor<?x8xf16> into tensor<?x1x8xf16>
    %le = tensor.empty(%m) : tensor<?x1x512xf32>
    %lacc = linalg.fill ins(%zero : f32) outs(%le : tensor<?x1x512xf32>) -> tensor<?x1x512xf32>
    %l = linalg.generic {indexing_maps = [affine_map<(b, m, n, k) -> (b, m, k)>, affine_map<(b, m, n, k) -> (b)>, affine_map<(b, m, n, k) -> (b, m, n)>], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%t16r, %tids : tensor<?x1x8xf16>, tensor<?xi64>) outs(%lacc : tensor<?x1x512xf32>) {
    ^bb0(%in: f16, %id: i64, %out: f32):
      %slot = arith.index_cast %id : i64 to index
      %n = linalg.index 2 : index
      %k = linalg.index 3 : index
      %v = tensor.extract %b[%slot, %k, %n] : tensor<5x8x512xf16>
      %vf = arith.extf %v : f16 to f32
      %xf1 = arith.extf %in : f16 to f32
      %pr = arith.mulf %xf1, %vf : f32
      %s = arith.addf %out, %pr : f32
      linalg.yield %s : f32
    } -> tensor<?x1x512xf32>
    %l2 = tensor.collapse_shape %l [[0, 1], [2]] : tensor<?x1x512xf32> into tensor<?x512xf32>
    %l3 = tensor.expand_shape %l2 [[0, 1], [2]] output_shape [%bs, %ts, 512] : tensor<?x512xf32> into tensor<?x?x512xf32>
    %le16 = tensor.empty(%bs, %ts) : tensor<?x?x512xf16>
    %l16 = linalg.generic {indexing_maps = [#rows, #rows], iterator_types = ["parallel", "parallel", "parallel"]} ins(%l3 : tensor<?x?x512xf32>) outs(%le16 : tensor<?x?x512xf16>) {
    ^bb0(%in: f32, %out: f16):
      %r = arith.truncf %in : f32 to f16
      linalg.yield %r : f16
    } -> tensor<?x?x512xf16>
    %y = linalg.generic {indexing_maps = [#rows, #rows, #rows], iterator_types = ["parallel", "parallel", "parallel"]} ins(%base3, %l16 : tensor<?x?x512xf16>, tensor<?x?x512xf16>) outs(%le16 : tensor<?x?x512xf16>) {
    ^bb0(%in: f16, %in_1: f16, %out: f16):
      %r = arith.addf %in, %in_1 : f16
      linalg.yield %r : f16
    } -> tensor<?x?x512xf16>
    return %y : tensor<?x?x512xf16>
  }

  // K = 320, a multiple of 64 but not of 256 (the fused kernel's): the base
  // product is a general GEMM, the shrink and the expand BGMVs, and the
  // roundings, the collapse and the add stay.
  // CHECK-LABEL: func.func @forward_tenants_general
  // CHECK:         flow.dispatch @stageml_sm90::@stageml_gemm_f16[{{.+}}](%arg0, %{{.+}}, %{{.+}}, %c320_i32{{[_0-9]*}}, %c512_i32{{[_0-9]*}})
  // CHECK:         flow.dispatch @stageml_sm90::@stageml_bgmv_f16[{{.+}}](%{{.+}}, %arg1, %arg2, %{{.+}}, %c320_i32{{[_0-9]*}}, %c8_i32{{[_0-9]*}})
  // CHECK:         flow.dispatch @stageml_sm90::@stageml_bgmv_f16[{{.+}}](%{{.+}}, %arg1, %arg3, %{{.+}}, %c8_i32{{[_0-9]*}}, %c512_i32{{[_0-9]*}})
  // CHECK:         tensor.collapse_shape
  // CHECK:         arith.addf
  // CHECK-NOT:     stageml_gemm_expand
  // CHECK:         return
  // REF-LABEL: func.func @forward_tenants_general
  // REF:         call @stageml_gemm_f16_reference(
  // REF-COUNT-2: call @stageml_bgmv_f16_reference(
  // REF-NOT:     stageml_gemm_expand
  // REF:         return
  func.func @forward_tenants_general(%x: tensor<?x320xf16>, %ids: tensor<?xi64>, %a: tensor<5x320x8xf16> {bt.kind = "resident"}, %b: tensor<5x8x512xf16> {bt.kind = "resident"}) -> tensor<?x512xf16> attributes {bt.stage = "dynamic", bt.program = "factorized"} {
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : f32
    %w = util.global.load @w320 : tensor<320x512xf16>
    %m = tensor.dim %x, %c0 : tensor<?x320xf16>
    %e = tensor.empty(%m) : tensor<?x512xf32>
    %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<?x512xf32>) -> tensor<?x512xf32>
    %p = linalg.matmul ins(%x, %w : tensor<?x320xf16>, tensor<320x512xf16>) outs(%acc : tensor<?x512xf32>) -> tensor<?x512xf32>
    %e16 = tensor.empty(%m) : tensor<?x512xf16>
    %base = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%p : tensor<?x512xf32>) outs(%e16 : tensor<?x512xf16>) {
    ^bb0(%in: f32, %out: f16):
      %r = arith.truncf %in : f32 to f16
      linalg.yield %r : f16
    } -> tensor<?x512xf16>
    %x3 = tensor.expand_shape %x [[0], [1, 2]] output_shape [%m, 1, 320] : tensor<?x320xf16> into tensor<?x1x320xf16>
    %te = tensor.empty(%m) : tensor<?x1x8xf32>
    %tacc = linalg.fill ins(%zero : f32) outs(%te : tensor<?x1x8xf32>) -> tensor<?x1x8xf32>
    %t = linalg.generic {indexing_maps = [affine_map<(b, m, n, k) -> (b, m, k)>, affine_map<(b, m, n, k) -> (b)>, affine_map<(b, m, n, k) -> (b, m, n)>], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%x3, %ids : tensor<?x1x320xf16>, tensor<?xi64>) outs(%tacc : tensor<?x1x8xf32>) {
    ^bb0(%in: f16, %id: i64, %out: f32):
      %slot = arith.index_cast %id : i64 to index
      %n = linalg.index 2 : index
      %k = linalg.index 3 : index
      %v = tensor.extract %a[%slot, %k, %n] : tensor<5x320x8xf16>
      %vf = arith.extf %v : f16 to f32
      %xf = arith.extf %in : f16 to f32
      %pr = arith.mulf %xf, %vf : f32
      %s = arith.addf %out, %pr : f32
      linalg.yield %s : f32
    } -> tensor<?x1x8xf32>
    %te16 = tensor.empty(%m) : tensor<?x1x8xf16>
    %t16 = linalg.generic {indexing_maps = [#rows, #rows], iterator_types = ["parallel", "parallel", "parallel"]} ins(%t : tensor<?x1x8xf32>) outs(%te16 : tensor<?x1x8xf16>) {
    ^bb0(%in: f32, %out: f16):
      %r = arith.truncf %in : f32 to f16
      linalg.yield %r : f16
    } -> tensor<?x1x8xf16>
    %le = tensor.empty(%m) : tensor<?x1x512xf32>
    %lacc = linalg.fill ins(%zero : f32) outs(%le : tensor<?x1x512xf32>) -> tensor<?x1x512xf32>
    %l = linalg.generic {indexing_maps = [affine_map<(b, m, n, k) -> (b, m, k)>, affine_map<(b, m, n, k) -> (b)>, affine_map<(b, m, n, k) -> (b, m, n)>], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%t16, %ids : tensor<?x1x8xf16>, tensor<?xi64>) outs(%lacc : tensor<?x1x512xf32>) {
    ^bb0(%in: f16, %id: i64, %out: f32):
      %slot = arith.index_cast %id : i64 to index
      %n = linalg.index 2 : index
      %k = linalg.index 3 : index
      %v = tensor.extract %b[%slot, %k, %n] : tensor<5x8x512xf16>
      %vf = arith.extf %v : f16 to f32
      %xf = arith.extf %in : f16 to f32
      %pr = arith.mulf %xf, %vf : f32
      %s = arith.addf %out, %pr : f32
      linalg.yield %s : f32
    } -> tensor<?x1x512xf32>
    %le16 = tensor.empty(%m) : tensor<?x1x512xf16>
    %l16 = linalg.generic {indexing_maps = [#rows, #rows], iterator_types = ["parallel", "parallel", "parallel"]} ins(%l : tensor<?x1x512xf32>) outs(%le16 : tensor<?x1x512xf16>) {
    ^bb0(%in: f32, %out: f16):
      %r = arith.truncf %in : f32 to f16
      linalg.yield %r : f16
    } -> tensor<?x1x512xf16>
    %l2 = tensor.collapse_shape %l16 [[0, 1], [2]] : tensor<?x1x512xf16> into tensor<?x512xf16>
    %y = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel"]} ins(%base, %l2 : tensor<?x512xf16>, tensor<?x512xf16>) outs(%e16 : tensor<?x512xf16>) {
    ^bb0(%in: f16, %in_1: f16, %out: f16):
      %r = arith.addf %in, %in_1 : f16
      linalg.yield %r : f16
    } -> tensor<?x512xf16>
    return %y : tensor<?x512xf16>
  }


  // The rounded shrink is also a result: its truncf must stay, so the site is
  // not fused; the base product is a wgmma GEMM, shrink and expand BGMVs.
  // CHECK-LABEL: func.func @forward_tenants_shared
  // CHECK:         flow.dispatch @stageml_sm90::@stageml_gemm_wgmma_f16[
  // CHECK-COUNT-2: flow.dispatch @stageml_sm90::@stageml_bgmv_f16[
  // CHECK-NOT:     stageml_gemm_expand
  // CHECK:         return
  // REF-LABEL: func.func @forward_tenants_shared
  // REF:         call @stageml_gemm_wgmma_f16_reference(
  // REF-COUNT-2: call @stageml_bgmv_f16_reference(
  // REF-NOT:     stageml_gemm_expand
  // REF:         return
  func.func @forward_tenants_shared(%x: tensor<?x256xf16>, %ids: tensor<?xi64>, %a: tensor<5x256x8xf16> {bt.kind = "resident"}, %b: tensor<5x8x512xf16> {bt.kind = "resident"}) -> (tensor<?x512xf16>, tensor<?x1x8xf16>) attributes {bt.stage = "dynamic", bt.program = "factorized"} {
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : f32
    %w = util.global.load @w : tensor<256x512xf16>
    %m = tensor.dim %x, %c0 : tensor<?x256xf16>
    %e = tensor.empty(%m) : tensor<?x512xf32>
    %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<?x512xf32>) -> tensor<?x512xf32>
    %p = linalg.matmul ins(%x, %w : tensor<?x256xf16>, tensor<256x512xf16>) outs(%acc : tensor<?x512xf32>) -> tensor<?x512xf32>
    %e16 = tensor.empty(%m) : tensor<?x512xf16>
    %base = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%p : tensor<?x512xf32>) outs(%e16 : tensor<?x512xf16>) {
    ^bb0(%in: f32, %out: f16):
      %r = arith.truncf %in : f32 to f16
      linalg.yield %r : f16
    } -> tensor<?x512xf16>
    %x3 = tensor.expand_shape %x [[0], [1, 2]] output_shape [%m, 1, 256] : tensor<?x256xf16> into tensor<?x1x256xf16>
    %te = tensor.empty(%m) : tensor<?x1x8xf32>
    %tacc = linalg.fill ins(%zero : f32) outs(%te : tensor<?x1x8xf32>) -> tensor<?x1x8xf32>
    %t = linalg.generic {indexing_maps = [affine_map<(b, m, n, k) -> (b, m, k)>, affine_map<(b, m, n, k) -> (b)>, affine_map<(b, m, n, k) -> (b, m, n)>], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%x3, %ids : tensor<?x1x256xf16>, tensor<?xi64>) outs(%tacc : tensor<?x1x8xf32>) {
    ^bb0(%in: f16, %id: i64, %out: f32):
      %slot = arith.index_cast %id : i64 to index
      %n = linalg.index 2 : index
      %k = linalg.index 3 : index
      %v = tensor.extract %a[%slot, %k, %n] : tensor<5x256x8xf16>
      %vf = arith.extf %v : f16 to f32
      %xf = arith.extf %in : f16 to f32
      %pr = arith.mulf %xf, %vf : f32
      %s = arith.addf %out, %pr : f32
      linalg.yield %s : f32
    } -> tensor<?x1x8xf32>
    %te16 = tensor.empty(%m) : tensor<?x1x8xf16>
    %t16 = linalg.generic {indexing_maps = [#rows, #rows], iterator_types = ["parallel", "parallel", "parallel"]} ins(%t : tensor<?x1x8xf32>) outs(%te16 : tensor<?x1x8xf16>) {
    ^bb0(%in: f32, %out: f16):
      %r = arith.truncf %in : f32 to f16
      linalg.yield %r : f16
    } -> tensor<?x1x8xf16>
    %le = tensor.empty(%m) : tensor<?x1x512xf32>
    %lacc = linalg.fill ins(%zero : f32) outs(%le : tensor<?x1x512xf32>) -> tensor<?x1x512xf32>
    %l = linalg.generic {indexing_maps = [affine_map<(b, m, n, k) -> (b, m, k)>, affine_map<(b, m, n, k) -> (b)>, affine_map<(b, m, n, k) -> (b, m, n)>], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%t16, %ids : tensor<?x1x8xf16>, tensor<?xi64>) outs(%lacc : tensor<?x1x512xf32>) {
    ^bb0(%in: f16, %id: i64, %out: f32):
      %slot = arith.index_cast %id : i64 to index
      %n = linalg.index 2 : index
      %k = linalg.index 3 : index
      %v = tensor.extract %b[%slot, %k, %n] : tensor<5x8x512xf16>
      %vf = arith.extf %v : f16 to f32
      %xf = arith.extf %in : f16 to f32
      %pr = arith.mulf %xf, %vf : f32
      %s = arith.addf %out, %pr : f32
      linalg.yield %s : f32
    } -> tensor<?x1x512xf32>
    %le16 = tensor.empty(%m) : tensor<?x1x512xf16>
    %l16 = linalg.generic {indexing_maps = [#rows, #rows], iterator_types = ["parallel", "parallel", "parallel"]} ins(%l : tensor<?x1x512xf32>) outs(%le16 : tensor<?x1x512xf16>) {
    ^bb0(%in: f32, %out: f16):
      %r = arith.truncf %in : f32 to f16
      linalg.yield %r : f16
    } -> tensor<?x1x512xf16>
    %l2 = tensor.collapse_shape %l16 [[0, 1], [2]] : tensor<?x1x512xf16> into tensor<?x512xf16>
    %y = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel"]} ins(%base, %l2 : tensor<?x512xf16>, tensor<?x512xf16>) outs(%e16 : tensor<?x512xf16>) {
    ^bb0(%in: f16, %in_1: f16, %out: f16):
      %r = arith.addf %in, %in_1 : f16
      linalg.yield %r : f16
    } -> tensor<?x512xf16>
    return %y, %t16 : tensor<?x512xf16>, tensor<?x1x8xf16>
  }


  // No match: f32 products (the kernels are f16 / bf16), N = 96 and K = 32,
  // multiples of 32 and 8 but not of 64 (what the kernels need).
  // CHECK-LABEL: func.func @unmatched
  // CHECK-COUNT-3: linalg.matmul
  // CHECK-NOT:     flow.dispatch
  // REF-LABEL: func.func @unmatched
  // REF-COUNT-3: linalg.matmul
  // REF-NOT:     call
  // REF:         return
  func.func @unmatched(%x: tensor<4x64xf32>, %w: tensor<64x32xf32>, %h: tensor<4x64xf16>, %v: tensor<64x96xf16>, %g: tensor<4x32xf16>, %u: tensor<32x64xf16>) -> (tensor<4x32xf32>, tensor<4x96xf16>, tensor<4x64xf16>) {
    %zero = arith.constant 0.0 : f32
    %e = tensor.empty() : tensor<4x32xf32>
    %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<4x32xf32>) -> tensor<4x32xf32>
    %y = linalg.matmul ins(%x, %w : tensor<4x64xf32>, tensor<64x32xf32>) outs(%acc : tensor<4x32xf32>) -> tensor<4x32xf32>
    %e2 = tensor.empty() : tensor<4x96xf32>
    %acc2 = linalg.fill ins(%zero : f32) outs(%e2 : tensor<4x96xf32>) -> tensor<4x96xf32>
    %p = linalg.matmul ins(%h, %v : tensor<4x64xf16>, tensor<64x96xf16>) outs(%acc2 : tensor<4x96xf32>) -> tensor<4x96xf32>
    %e16 = tensor.empty() : tensor<4x96xf16>
    %z = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%p : tensor<4x96xf32>) outs(%e16 : tensor<4x96xf16>) {
    ^bb0(%in: f32, %out: f16):
      %t = arith.truncf %in : f32 to f16
      linalg.yield %t : f16
    } -> tensor<4x96xf16>
    %e3 = tensor.empty() : tensor<4x64xf32>
    %acc3 = linalg.fill ins(%zero : f32) outs(%e3 : tensor<4x64xf32>) -> tensor<4x64xf32>
    %q = linalg.matmul ins(%g, %u : tensor<4x32xf16>, tensor<32x64xf16>) outs(%acc3 : tensor<4x64xf32>) -> tensor<4x64xf32>
    %e3_16 = tensor.empty() : tensor<4x64xf16>
    %o = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%q : tensor<4x64xf32>) outs(%e3_16 : tensor<4x64xf16>) {
    ^bb0(%in: f32, %out: f16):
      %t = arith.truncf %in : f32 to f16
      linalg.yield %t : f16
    } -> tensor<4x64xf16>
    return %y, %z, %o : tensor<4x32xf32>, tensor<4x96xf16>, tensor<4x64xf16>
  }

  // The references used are cloned in, private (IREE inlines them), each
  // marked with the kernel it stands for, with the functions they call: the
  // wgmma GEMM's checks its multiples, then calls the GEMM's; the GEMM's, the
  // LoRA's and the expand's call the f32 product of x and the tiles, a part
  // they share (stageml.reference_part). Those not used are not cloned.
  // REF-DAG: func.func private @stageml_product_f16(%{{.+}}: tensor<?x?xf16>, %{{.+}}: tensor<?x?x8x64x8xf16>) -> tensor<?x?xf32> attributes {stageml.reference_part}
  // REF-DAG: func.func private @stageml_product_bf16(
  // REF-DAG: func.func private @stageml_gemm_f16_reference(%{{.+}}: tensor<?x?xf16>, %{{.+}}: tensor<?x?x8x64x8xf16>, %{{.+}}: i32, %{{.+}}: i32, %{{.+}}: i32) -> tensor<?x?xf16> attributes {stageml.reference_of = "stageml_gemm_f16"}
  // REF-DAG: cf.assert %{{.+}}, "stageml_gemm_f16: K and N must be multiples of 64"
  // REF-DAG: call @stageml_product_f16(%arg0, %arg1)
  // REF-DAG: func.func private @stageml_gemm_bf16_reference(
  // REF-DAG: func.func private @stageml_gemm_wgmma_f16_reference(%{{.+}}: tensor<?x?xf16>, %{{.+}}: tensor<?x?x8x64x8xf16>, %{{.+}}: i32, %{{.+}}: i32, %{{.+}}: i32) -> tensor<?x?xf16> attributes {stageml.reference_of = "stageml_gemm_wgmma_f16"}
  // REF-DAG: cf.assert %{{.+}}, "stageml_gemm_wgmma_f16: K must be a multiple of 256 and N of 64"
  // REF-DAG: call @stageml_gemm_f16_reference(%arg0, %arg1, %arg2, %arg3, %arg4)
  // REF-DAG: func.func private @stageml_gemm_wgmma_bf16_reference(
  // REF-DAG: call @stageml_gemm_bf16_reference(%arg0, %arg1, %arg2, %arg3, %arg4)
  // REF-DAG: func.func private @stageml_lora_f16_reference(
  // REF-DAG: func.func private @stageml_gemm_expand_f16_reference(%{{.+}}: tensor<?x?xf16>, %{{.+}}: tensor<?x?x8x64x8xf16>, %{{.+}}: tensor<?x1x?xf32>, %{{.+}}: tensor<?xi64>, %{{.+}}: tensor<?x?x?xf16>, %{{.+}}: i32, %{{.+}}: i32, %{{.+}}: i32, %{{.+}}: i32, %{{.+}}: i32) -> tensor<?x?xf16> attributes {stageml.reference_of = "stageml_gemm_expand_f16"}
  // REF-DAG: cf.assert %{{.+}}, "stageml_gemm_expand_f16: K must be a multiple of 256, N of 64, and R >= 1"
  // REF-DAG: func.func private @stageml_bgmv_f16_reference(
  // REF-DAG: func.func private @stageml_bgmv_bf16_reference(
  // REF-DAG: func.func private @stageml_gemm_expand_bf16_reference(
  // REF-NOT: stageml_lora_bf16_reference
}
