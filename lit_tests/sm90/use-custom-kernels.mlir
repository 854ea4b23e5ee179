// RUN: stageml-opt %s --pipeline sm90 | filecheck %s
// RUN: stageml-opt %s --pipeline sm90 --no-custom-kernels | filecheck %s --check-prefix=CODEGEN

// The sm90 pipeline attaches StageML's Hopper target and swaps the hot
// products for its hand-written kernels; what does not match stays linalg.

#map = affine_map<(d0, d1) -> (d0, d1)>

// CHECK: #[[SM90:.+]] = #hal.executable.target<"cuda", "cuda-nvptx-fb", {iree_codegen.target_info = #iree_gpu.target<arch = "sm_90", features = "+ptx80", {{.*}}max_workgroup_memory_bytes = 232448{{.*}}chip = <wgp_count = 132>>}>
// CHECK: #[[DEVICE:.+]] = #hal.device.target<"cuda", [#[[SM90]]]> : !hal.device
// CHECK: module attributes {hal.device.targets = [#[[DEVICE]]]}
// CHECK: hal.executable.source private @stageml_sm90 <objects = <{#[[SM90]] = [#hal.executable.object<{path = "stageml_sm90.ptx"}>]}>>
// CHECK: hal.executable.export public @stageml_gemm_f16 ordinal(0)
// CHECK: hal.executable.export public @stageml_lora_bf16 ordinal(3)

// CODEGEN: #[[SM90:.+]] = #hal.executable.target<"cuda", "cuda-nvptx-fb", {iree_codegen.target_info = #iree_gpu.target<arch = "sm_90"
// CODEGEN: #[[DEVICE:.+]] = #hal.device.target<"cuda", [#[[SM90]]]> : !hal.device
// CODEGEN: module attributes {hal.device.targets = [#[[DEVICE]]]}
// CODEGEN-NOT: hal.executable.source
// CODEGEN-NOT: flow.dispatch

module {
  util.global private @w = #flow.parameter.named<"model"::"w"> : tensor<256x512xf16>

  // A product against a global weight, f32 accumulation rounded once to f16:
  // the weight's pack into 32-column strips follows its load (IREE hoists it
  // to load time).
  // CHECK-LABEL: func.func @gemm
  // CHECK:         %[[W:.+]] = util.global.load @w : tensor<256x512xf16>
  // CHECK:         %[[S:.+]] = linalg.pack %[[W]] outer_dims_perm = [1, 0] inner_dims_pos = [1] inner_tiles = [32] into %{{.+}} : tensor<256x512xf16> -> tensor<16x256x32xf16>
  // CHECK:         %[[M:.+]] = tensor.dim %arg0, %c0 : tensor<?x256xf16>
  // CHECK:         %[[MI:.+]] = arith.index_cast %[[M]] : index to i32
  // CHECK:         %[[Y:.+]] = flow.dispatch @stageml_sm90::@stageml_gemm_f16[%[[M]], %c512](%arg0, %[[S]], %[[MI]], %c256_i32, %c512_i32) : (tensor<?x256xf16>{%[[M]]}, tensor<16x256x32xf16>, i32, i32, i32) -> tensor<?x512xf16>{%[[M]]}
  // CHECK-NOT:     linalg.matmul
  // CHECK:         return %[[Y]]
  // CODEGEN-LABEL: func.func @gemm
  // CODEGEN:         linalg.matmul
  func.func @gemm(%x: tensor<?x256xf16>) -> tensor<?x512xf16> {
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

  // An unmerged LoRA site, PEFT's order (scale after the second product):
  // one fused kernel; scale 2.0 travels as its f32 bits (0x40000000).
  // CHECK-LABEL: func.func @lora
  // CHECK:         flow.dispatch @stageml_sm90::@stageml_lora_bf16[%{{.+}}, %c512](%arg0, %{{.+}}, %arg1, %arg2, %{{.+}}, %c256_i32, %c512_i32, %c8_i32, %c1073741824_i32) : (tensor<?x256xbf16>{%{{.+}}}, tensor<16x256x32xbf16>, tensor<256x8xbf16>, tensor<8x512xbf16>, i32, i32, i32, i32, i32) -> tensor<?x512xbf16>
  // CHECK-NOT:     linalg.matmul
  // CHECK-NOT:     stageml_gemm
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

  // x@A is also a result: the site stays unfused (its products may still
  // become GEMMs; x@A's 8 columns are too few for the strips).
  // CHECK-LABEL: func.func @lora_shared_down
  // CHECK-NOT:     stageml_lora
  // CHECK:         return
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

  // Adapter state (a @forward argument marked with its @adapter result): the
  // pack moves into @adapter, which returns the strips.
  // CHECK-LABEL: func.func @adapter(%arg0: tensor<256x512xf16>) -> tensor<16x256x32xf16>
  // CHECK:         %[[S:.+]] = linalg.pack %arg0 {{.+}} -> tensor<16x256x32xf16>
  // CHECK:         return %[[S]]
  // CHECK-LABEL: func.func @forward(%arg0: tensor<16x256x32xf16> {stageml.adapter_result = 0 : i64}, %arg1: tensor<?x256xf16>)
  // CHECK-NOT:     linalg.pack
  // CHECK:         flow.dispatch @stageml_sm90::@stageml_gemm_f16[%{{.+}}, %c512](%arg1, %arg0,
  func.func @adapter(%w: tensor<256x512xf16>) -> tensor<256x512xf16> {
    return %w : tensor<256x512xf16>
  }
  func.func @forward(%w: tensor<256x512xf16> {stageml.adapter_result = 0 : i64}, %x: tensor<?x256xf16>) -> tensor<?x512xf16> {
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

  // A request-time function's product against any other value stays with
  // IREE: its pack would be a pass over the weight per request.
  // CHECK-LABEL: func.func @forward_unmarked
  // CHECK-NOT:     flow.dispatch
  // CHECK:         linalg.matmul
  func.func @forward_unmarked(%w: tensor<256x512xf16>, %x: tensor<?x256xf16>) -> tensor<?x512xf16> {
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
  // CHECK:         %[[B:.+]] = tensor.dim %arg0, %c0 : tensor<?x1x256xf16>
  // CHECK:         %[[BI:.+]] = arith.index_cast %[[B]] : index to i32
  // CHECK:         flow.dispatch @stageml_sm90::@stageml_bgmv_f16[%[[B]], %c16](%arg0, %arg1, %arg2, %[[BI]], %c256_i32, %c16_i32) : (tensor<?x1x256xf16>{%[[B]]}, tensor<?xi64>{%{{.+}}}, tensor<5x256x16xf16>, i32, i32, i32) -> tensor<?x1x16xf32>{%[[B]]}
  // CHECK-NOT:     tensor.extract
  func.func @forward_factorized(%x: tensor<?x1x256xf16>, %ids: tensor<?xi64>, %table: tensor<5x256x16xf16>) -> tensor<?x1x16xf32> {
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

  // No match: f32 products (the kernels are f16 / bf16), and N = 20, not a
  // multiple of 8 (16-byte rows).
  // CHECK-LABEL: func.func @unmatched
  // CHECK-COUNT-2: linalg.matmul
  // CHECK-NOT:     flow.dispatch
  func.func @unmatched(%x: tensor<4x64xf32>, %w: tensor<64x32xf32>, %h: tensor<4x64xf16>, %v: tensor<64x20xf16>) -> (tensor<4x32xf32>, tensor<4x20xf16>) {
    %zero = arith.constant 0.0 : f32
    %e = tensor.empty() : tensor<4x32xf32>
    %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<4x32xf32>) -> tensor<4x32xf32>
    %y = linalg.matmul ins(%x, %w : tensor<4x64xf32>, tensor<64x32xf32>) outs(%acc : tensor<4x32xf32>) -> tensor<4x32xf32>
    %e2 = tensor.empty() : tensor<4x20xf32>
    %acc2 = linalg.fill ins(%zero : f32) outs(%e2 : tensor<4x20xf32>) -> tensor<4x20xf32>
    %p = linalg.matmul ins(%h, %v : tensor<4x64xf16>, tensor<64x20xf16>) outs(%acc2 : tensor<4x20xf32>) -> tensor<4x20xf32>
    %e16 = tensor.empty() : tensor<4x20xf16>
    %z = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%p : tensor<4x20xf32>) outs(%e16 : tensor<4x20xf16>) {
    ^bb0(%in: f32, %out: f16):
      %t = arith.truncf %in : f32 to f16
      linalg.yield %t : f16
    } -> tensor<4x20xf16>
    return %y, %z : tensor<4x32xf32>, tensor<4x20xf16>
  }
}
