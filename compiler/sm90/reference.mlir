// CPU references of StageML's Hopper kernels (kernels.cu), in linalg on tensors.
//
// `use-custom-kernels{lowering=reference}` replaces each match by a
// `func.call` of the reference below instead of the `flow.dispatch` of the
// kernel, with the very operands and i32 push constants the dispatch passes
// (tensor.cast to these dynamic types and back), so the matcher's output runs
// on IREE's CPU backend and tests can compare it with the unrewritten module.
// Each function carries `stageml.reference_of = "<kernel>"`, by which the pass
// finds it; it is cloned into a module that calls it, with the functions it
// calls in turn: another kernel's reference (a kernel with another's
// semantics and stronger guarantees checks those, then calls the other's
// reference) or a part several references share, which carries
// `stageml.reference_part`. IREE inlines them all.
//
// Every reference first asserts the caller guarantees of kernels.cu that its
// operands and constants can show (cf.assert: a wrong match fails at run
// time, naming the kernel, instead of reading out of bounds), then computes
// what the kernel computes: the same values, the same precision, the same
// rounding points; only the order of the f32 sums differs. T is f16 or bf16;
// rounding to T is round-to-nearest-even (__float2half_rn / __float2bfloat16_rn).
//
// w is W [K,N] in tiles, [N/64, K/64, 8, 64, 8]: 64x64 tiles of W, the k-tiles
// of a column tile contiguous, each tile 8 strips of 8 columns stored whole:
//   w[tn,tk,s,kk,c] = W[64tk + kk, 64tn + 8s + c]
// (use-custom-kernels packs so: tensor.expand_shape of W to [K/64, 64, N/64, 8, 8]
// and linalg.transpose [2, 0, 3, 1, 4]; the references undo it in
// stageml_product_T).
//
//   stageml_gemm_T(x: [M,K] T, w: [N/64,K/64,8,64,8] T, M, K, N: i32) -> y: [M,N] T
//     y = T(sum_k f32(x[m,k]) * f32(W[k,n]))              (f32 sum, one rounding)
//     guarantees: K % 64 = 0, N % 64 = 0, shapes as above
//
//   stageml_gemm_wgmma_T(x: [M,K] T, w: [N/64,K/64,8,64,8] T, M, K, N: i32) -> y: [M,N] T
//     stageml_gemm_T's semantics, for any M (wgmma, clusters of 2 blocks)
//     guarantees: K % 256 = 0, N % 64 = 0, shapes as stageml_gemm_T's
//
//   stageml_lora_T(x: [M,K] T, w: [N/64,K/64,8,64,8] T, a: [K,R] T, b: [R,N] T,
//                  M, K, N, R, scale_bits: i32) -> y: [M,N] T
//     scale = scale_bits as f32 (arith.bitcast); t = x@a stays f32 (never T)
//     v[m,n] = sum_k f32(x) * f32(W)                      (f32)
//     t[m,r] = sum_k f32(x) * f32(a)                      (f32)
//     l[m,n] = sum_r t[m,r] * f32(b[r,n])                 (f32)
//     y = T(fma(scale, l, v))                             (the scale once, after
//                                                          both products; one rounding)
//     guarantees: K % 64 = 0, N % 64 = 0, 1 <= R <= 32, shapes as above
//
//   stageml_gemm_expand_T(x: [M,K] T, w: [N/64,K/64,8,64,8] T, t: [M',1,R] f32,
//                         ids: [rows] i64, table: [S,R,N] T,
//                         M, K, N, R, rows: i32) -> y: [M,N] T
//     a multi-tenant layer's base product with its LoRA expand: t is each
//     row's shrink product (rows of t past M are not read), slot(m) = ids[m]
//     for m < rows, else 0
//     v[m,n] = sum_k f32(x) * f32(W)                      (f32)
//     l[m,n] = sum_r t[m,0,r] * f32(table[slot(m),r,n])   (f32)
//     y = T(v + l)                                        (one rounding)
//     guarantees: K % 256 = 0, N % 64 = 0, R >= 1, M' >= M, 0 <= ids[i] < S
//     (the kernel trusts them), S >= 1 where rows < M, shapes as above
//
//   stageml_gemm_lora_T(x: [M,K] T, w: [N/64,K/64,8,64,8] T, ids: [rows] i64,
//                       a: [S,K,R] T, b: [S,R,N] T, M, K, N, R, rows, scale_bits, site: i32)
//       -> y: [M,N] T   (the kernel's scratch ws is its own: no part of the semantics)
//     a multi-tenant LoRA site, shrink and expand in one kernel: slot(m) as for
//     stageml_gemm_expand_T, scale = scale_bits as f32, site unused
//     t[m,0,r] = scale * sum_k f32(x[m,k]) * f32(a[slot(m),k,r])   (f32, never T)
//     y = stageml_gemm_expand_T(x, w, t, ids, b)
//     guarantees: R <= 32 and stageml_gemm_expand_T's
//
//   stageml_bgmv_T(x: [B,1,K] T, ids: [B] i64, table: [S,K,N] T, B, K, N: i32)
//       -> y: [B,1,N] f32
//     y[b,0,n] = sum_k f32(x[b,0,k]) * f32(table[ids[b],k,n])   (f32, no rounding)
//     guarantees: 0 <= ids[b] < S (the kernel trusts them), shapes as above;
//     any K and N
//
// M (B) is the row count, the dispatch's first push constant; rows = 0 gives
// an empty result, as the kernels write nothing then.

// ---------------------------------------------------------------- the product

// v[m,n] = sum_k f32(x[m,k]) * f32(W[k,n]) (f32), W unpacked from w's tiles;
// K and N are w's (its callers check they are x's and the push constants').
func.func private @stageml_product_f16(%x: tensor<?x?xf16>, %w: tensor<?x?x8x64x8xf16>) -> tensor<?x?xf32>
    attributes {stageml.reference_part} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c64 = arith.constant 64 : index
  %zero = arith.constant 0.0 : f32
  %M = tensor.dim %x, %c0 : tensor<?x?xf16>
  %tn = tensor.dim %w, %c0 : tensor<?x?x8x64x8xf16>
  %tk = tensor.dim %w, %c1 : tensor<?x?x8x64x8xf16>
  %N = arith.muli %tn, %c64 : index
  %ue = tensor.empty(%tk, %tn) : tensor<?x64x?x8x8xf16>
  %u = linalg.transpose ins(%w : tensor<?x?x8x64x8xf16>) outs(%ue : tensor<?x64x?x8x8xf16>) permutation = [1, 3, 0, 2, 4]
  %wkn = tensor.collapse_shape %u [[0, 1], [2, 3, 4]] : tensor<?x64x?x8x8xf16> into tensor<?x?xf16>
  %ve = tensor.empty(%M, %N) : tensor<?x?xf32>
  %v0 = linalg.fill ins(%zero : f32) outs(%ve : tensor<?x?xf32>) -> tensor<?x?xf32>
  %v = linalg.matmul ins(%x, %wkn : tensor<?x?xf16>, tensor<?x?xf16>) outs(%v0 : tensor<?x?xf32>) -> tensor<?x?xf32>
  return %v : tensor<?x?xf32>
}

func.func private @stageml_product_bf16(%x: tensor<?x?xbf16>, %w: tensor<?x?x8x64x8xbf16>) -> tensor<?x?xf32>
    attributes {stageml.reference_part} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c64 = arith.constant 64 : index
  %zero = arith.constant 0.0 : f32
  %M = tensor.dim %x, %c0 : tensor<?x?xbf16>
  %tn = tensor.dim %w, %c0 : tensor<?x?x8x64x8xbf16>
  %tk = tensor.dim %w, %c1 : tensor<?x?x8x64x8xbf16>
  %N = arith.muli %tn, %c64 : index
  %ue = tensor.empty(%tk, %tn) : tensor<?x64x?x8x8xbf16>
  %u = linalg.transpose ins(%w : tensor<?x?x8x64x8xbf16>) outs(%ue : tensor<?x64x?x8x8xbf16>) permutation = [1, 3, 0, 2, 4]
  %wkn = tensor.collapse_shape %u [[0, 1], [2, 3, 4]] : tensor<?x64x?x8x8xbf16> into tensor<?x?xbf16>
  %ve = tensor.empty(%M, %N) : tensor<?x?xf32>
  %v0 = linalg.fill ins(%zero : f32) outs(%ve : tensor<?x?xf32>) -> tensor<?x?xf32>
  %v = linalg.matmul ins(%x, %wkn : tensor<?x?xbf16>, tensor<?x?xbf16>) outs(%v0 : tensor<?x?xf32>) -> tensor<?x?xf32>
  return %v : tensor<?x?xf32>
}

// ---------------------------------------------------------------- GEMM

func.func private @stageml_gemm_f16_reference(%x: tensor<?x?xf16>, %w: tensor<?x?x8x64x8xf16>,
    %m: i32, %k: i32, %n: i32) -> tensor<?x?xf16> attributes {stageml.reference_of = "stageml_gemm_f16"} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c64 = arith.constant 64 : index
  %M = arith.index_cast %m : i32 to index
  %K = arith.index_cast %k : i32 to index
  %N = arith.index_cast %n : i32 to index
  %xm = tensor.dim %x, %c0 : tensor<?x?xf16>
  %xk = tensor.dim %x, %c1 : tensor<?x?xf16>
  %tn = tensor.dim %w, %c0 : tensor<?x?x8x64x8xf16>
  %tk = tensor.dim %w, %c1 : tensor<?x?x8x64x8xf16>
  %wn = arith.muli %tn, %c64 : index
  %wk = arith.muli %tk, %c64 : index
  %s0 = arith.cmpi eq, %xm, %M : index
  %s1 = arith.cmpi eq, %xk, %K : index
  %s2 = arith.cmpi eq, %wk, %K : index
  %s3 = arith.cmpi eq, %wn, %N : index
  %s01 = arith.andi %s0, %s1 : i1
  %s23 = arith.andi %s2, %s3 : i1
  %shapes = arith.andi %s01, %s23 : i1
  cf.assert %shapes, "stageml_gemm_f16: x must be [M, K] and w [N/64, K/64, 8, 64, 8] (push constants M, K, N)"
  %kr = arith.remui %K, %c64 : index
  %nr = arith.remui %N, %c64 : index
  %rem = arith.ori %kr, %nr : index
  %aligned = arith.cmpi eq, %rem, %c0 : index
  cf.assert %aligned, "stageml_gemm_f16: K and N must be multiples of 64"
  %v = func.call @stageml_product_f16(%x, %w) : (tensor<?x?xf16>, tensor<?x?x8x64x8xf16>) -> tensor<?x?xf32>
  %ye = tensor.empty(%M, %N) : tensor<?x?xf16>
  %y = linalg.generic {indexing_maps = [affine_map<(m, n) -> (m, n)>, affine_map<(m, n) -> (m, n)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%v : tensor<?x?xf32>) outs(%ye : tensor<?x?xf16>) {
  ^bb0(%acc: f32, %out: f16):
    %r = arith.truncf %acc : f32 to f16
    linalg.yield %r : f16
  } -> tensor<?x?xf16>
  return %y : tensor<?x?xf16>
}

func.func private @stageml_gemm_bf16_reference(%x: tensor<?x?xbf16>, %w: tensor<?x?x8x64x8xbf16>,
    %m: i32, %k: i32, %n: i32) -> tensor<?x?xbf16> attributes {stageml.reference_of = "stageml_gemm_bf16"} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c64 = arith.constant 64 : index
  %M = arith.index_cast %m : i32 to index
  %K = arith.index_cast %k : i32 to index
  %N = arith.index_cast %n : i32 to index
  %xm = tensor.dim %x, %c0 : tensor<?x?xbf16>
  %xk = tensor.dim %x, %c1 : tensor<?x?xbf16>
  %tn = tensor.dim %w, %c0 : tensor<?x?x8x64x8xbf16>
  %tk = tensor.dim %w, %c1 : tensor<?x?x8x64x8xbf16>
  %wn = arith.muli %tn, %c64 : index
  %wk = arith.muli %tk, %c64 : index
  %s0 = arith.cmpi eq, %xm, %M : index
  %s1 = arith.cmpi eq, %xk, %K : index
  %s2 = arith.cmpi eq, %wk, %K : index
  %s3 = arith.cmpi eq, %wn, %N : index
  %s01 = arith.andi %s0, %s1 : i1
  %s23 = arith.andi %s2, %s3 : i1
  %shapes = arith.andi %s01, %s23 : i1
  cf.assert %shapes, "stageml_gemm_bf16: x must be [M, K] and w [N/64, K/64, 8, 64, 8] (push constants M, K, N)"
  %kr = arith.remui %K, %c64 : index
  %nr = arith.remui %N, %c64 : index
  %rem = arith.ori %kr, %nr : index
  %aligned = arith.cmpi eq, %rem, %c0 : index
  cf.assert %aligned, "stageml_gemm_bf16: K and N must be multiples of 64"
  %v = func.call @stageml_product_bf16(%x, %w) : (tensor<?x?xbf16>, tensor<?x?x8x64x8xbf16>) -> tensor<?x?xf32>
  %ye = tensor.empty(%M, %N) : tensor<?x?xbf16>
  %y = linalg.generic {indexing_maps = [affine_map<(m, n) -> (m, n)>, affine_map<(m, n) -> (m, n)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%v : tensor<?x?xf32>) outs(%ye : tensor<?x?xbf16>) {
  ^bb0(%acc: f32, %out: bf16):
    %r = arith.truncf %acc : f32 to bf16
    linalg.yield %r : bf16
  } -> tensor<?x?xbf16>
  return %y : tensor<?x?xbf16>
}

// ---------------------------------------------------------------- GEMM (wgmma)

func.func private @stageml_gemm_wgmma_f16_reference(%x: tensor<?x?xf16>, %w: tensor<?x?x8x64x8xf16>,
    %m: i32, %k: i32, %n: i32) -> tensor<?x?xf16> attributes {stageml.reference_of = "stageml_gemm_wgmma_f16"} {
  %c0 = arith.constant 0 : index
  %c64 = arith.constant 64 : index
  %c256 = arith.constant 256 : index
  %K = arith.index_cast %k : i32 to index
  %N = arith.index_cast %n : i32 to index
  %kr = arith.remui %K, %c256 : index
  %nr = arith.remui %N, %c64 : index
  %rem = arith.ori %kr, %nr : index
  %aligned = arith.cmpi eq, %rem, %c0 : index
  cf.assert %aligned, "stageml_gemm_wgmma_f16: K must be a multiple of 256 and N of 64"
  %y = func.call @stageml_gemm_f16_reference(%x, %w, %m, %k, %n)
      : (tensor<?x?xf16>, tensor<?x?x8x64x8xf16>, i32, i32, i32) -> tensor<?x?xf16>
  return %y : tensor<?x?xf16>
}

func.func private @stageml_gemm_wgmma_bf16_reference(%x: tensor<?x?xbf16>, %w: tensor<?x?x8x64x8xbf16>,
    %m: i32, %k: i32, %n: i32) -> tensor<?x?xbf16> attributes {stageml.reference_of = "stageml_gemm_wgmma_bf16"} {
  %c0 = arith.constant 0 : index
  %c64 = arith.constant 64 : index
  %c256 = arith.constant 256 : index
  %K = arith.index_cast %k : i32 to index
  %N = arith.index_cast %n : i32 to index
  %kr = arith.remui %K, %c256 : index
  %nr = arith.remui %N, %c64 : index
  %rem = arith.ori %kr, %nr : index
  %aligned = arith.cmpi eq, %rem, %c0 : index
  cf.assert %aligned, "stageml_gemm_wgmma_bf16: K must be a multiple of 256 and N of 64"
  %y = func.call @stageml_gemm_bf16_reference(%x, %w, %m, %k, %n)
      : (tensor<?x?xbf16>, tensor<?x?x8x64x8xbf16>, i32, i32, i32) -> tensor<?x?xbf16>
  return %y : tensor<?x?xbf16>
}

// ---------------------------------------------------------------- LoRA

func.func private @stageml_lora_f16_reference(%x: tensor<?x?xf16>, %w: tensor<?x?x8x64x8xf16>,
    %a: tensor<?x?xf16>, %b: tensor<?x?xf16>, %m: i32, %k: i32, %n: i32, %r: i32, %scale_bits: i32)
    -> tensor<?x?xf16> attributes {stageml.reference_of = "stageml_lora_f16"} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c32 = arith.constant 32 : index
  %c64 = arith.constant 64 : index
  %zero = arith.constant 0.0 : f32
  %M = arith.index_cast %m : i32 to index
  %K = arith.index_cast %k : i32 to index
  %N = arith.index_cast %n : i32 to index
  %R = arith.index_cast %r : i32 to index
  %xm = tensor.dim %x, %c0 : tensor<?x?xf16>
  %xk = tensor.dim %x, %c1 : tensor<?x?xf16>
  %tn = tensor.dim %w, %c0 : tensor<?x?x8x64x8xf16>
  %tk = tensor.dim %w, %c1 : tensor<?x?x8x64x8xf16>
  %ak = tensor.dim %a, %c0 : tensor<?x?xf16>
  %ar = tensor.dim %a, %c1 : tensor<?x?xf16>
  %br = tensor.dim %b, %c0 : tensor<?x?xf16>
  %bn = tensor.dim %b, %c1 : tensor<?x?xf16>
  %wn = arith.muli %tn, %c64 : index
  %wk = arith.muli %tk, %c64 : index
  %s0 = arith.cmpi eq, %xm, %M : index
  %s1 = arith.cmpi eq, %xk, %K : index
  %s2 = arith.cmpi eq, %wk, %K : index
  %s3 = arith.cmpi eq, %wn, %N : index
  %s4 = arith.cmpi eq, %ak, %K : index
  %s5 = arith.cmpi eq, %ar, %R : index
  %s6 = arith.cmpi eq, %br, %R : index
  %s7 = arith.cmpi eq, %bn, %N : index
  %s01 = arith.andi %s0, %s1 : i1
  %s23 = arith.andi %s2, %s3 : i1
  %s45 = arith.andi %s4, %s5 : i1
  %s67 = arith.andi %s6, %s7 : i1
  %s03 = arith.andi %s01, %s23 : i1
  %s47 = arith.andi %s45, %s67 : i1
  %shapes = arith.andi %s03, %s47 : i1
  cf.assert %shapes, "stageml_lora_f16: x must be [M, K], w [N/64, K/64, 8, 64, 8], a [K, R] and b [R, N] (push constants M, K, N, R)"
  %kr = arith.remui %K, %c64 : index
  %nr = arith.remui %N, %c64 : index
  %rem = arith.ori %kr, %nr : index
  %aligned = arith.cmpi eq, %rem, %c0 : index
  %r_lo = arith.cmpi sge, %R, %c1 : index
  %r_hi = arith.cmpi sle, %R, %c32 : index
  %r_ok = arith.andi %r_lo, %r_hi : i1
  %limits = arith.andi %aligned, %r_ok : i1
  cf.assert %limits, "stageml_lora_f16: K and N must be multiples of 64, and 1 <= R <= 32"
  %scale = arith.bitcast %scale_bits : i32 to f32
  %v = func.call @stageml_product_f16(%x, %w) : (tensor<?x?xf16>, tensor<?x?x8x64x8xf16>) -> tensor<?x?xf32>
  %te = tensor.empty(%M, %R) : tensor<?x?xf32>
  %t0 = linalg.fill ins(%zero : f32) outs(%te : tensor<?x?xf32>) -> tensor<?x?xf32>
  %t = linalg.matmul ins(%x, %a : tensor<?x?xf16>, tensor<?x?xf16>) outs(%t0 : tensor<?x?xf32>) -> tensor<?x?xf32>
  %le = tensor.empty(%M, %N) : tensor<?x?xf32>
  %l0 = linalg.fill ins(%zero : f32) outs(%le : tensor<?x?xf32>) -> tensor<?x?xf32>
  %l = linalg.matmul ins(%t, %b : tensor<?x?xf32>, tensor<?x?xf16>) outs(%l0 : tensor<?x?xf32>) -> tensor<?x?xf32>
  %ye = tensor.empty(%M, %N) : tensor<?x?xf16>
  %y = linalg.generic {indexing_maps = [affine_map<(m, n) -> (m, n)>, affine_map<(m, n) -> (m, n)>,
                                        affine_map<(m, n) -> (m, n)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%v, %l : tensor<?x?xf32>, tensor<?x?xf32>) outs(%ye : tensor<?x?xf16>) {
  ^bb0(%base: f32, %low_rank: f32, %out: f16):
    %sum = math.fma %scale, %low_rank, %base : f32
    %rounded = arith.truncf %sum : f32 to f16
    linalg.yield %rounded : f16
  } -> tensor<?x?xf16>
  return %y : tensor<?x?xf16>
}

func.func private @stageml_lora_bf16_reference(%x: tensor<?x?xbf16>, %w: tensor<?x?x8x64x8xbf16>,
    %a: tensor<?x?xbf16>, %b: tensor<?x?xbf16>, %m: i32, %k: i32, %n: i32, %r: i32, %scale_bits: i32)
    -> tensor<?x?xbf16> attributes {stageml.reference_of = "stageml_lora_bf16"} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c32 = arith.constant 32 : index
  %c64 = arith.constant 64 : index
  %zero = arith.constant 0.0 : f32
  %M = arith.index_cast %m : i32 to index
  %K = arith.index_cast %k : i32 to index
  %N = arith.index_cast %n : i32 to index
  %R = arith.index_cast %r : i32 to index
  %xm = tensor.dim %x, %c0 : tensor<?x?xbf16>
  %xk = tensor.dim %x, %c1 : tensor<?x?xbf16>
  %tn = tensor.dim %w, %c0 : tensor<?x?x8x64x8xbf16>
  %tk = tensor.dim %w, %c1 : tensor<?x?x8x64x8xbf16>
  %ak = tensor.dim %a, %c0 : tensor<?x?xbf16>
  %ar = tensor.dim %a, %c1 : tensor<?x?xbf16>
  %br = tensor.dim %b, %c0 : tensor<?x?xbf16>
  %bn = tensor.dim %b, %c1 : tensor<?x?xbf16>
  %wn = arith.muli %tn, %c64 : index
  %wk = arith.muli %tk, %c64 : index
  %s0 = arith.cmpi eq, %xm, %M : index
  %s1 = arith.cmpi eq, %xk, %K : index
  %s2 = arith.cmpi eq, %wk, %K : index
  %s3 = arith.cmpi eq, %wn, %N : index
  %s4 = arith.cmpi eq, %ak, %K : index
  %s5 = arith.cmpi eq, %ar, %R : index
  %s6 = arith.cmpi eq, %br, %R : index
  %s7 = arith.cmpi eq, %bn, %N : index
  %s01 = arith.andi %s0, %s1 : i1
  %s23 = arith.andi %s2, %s3 : i1
  %s45 = arith.andi %s4, %s5 : i1
  %s67 = arith.andi %s6, %s7 : i1
  %s03 = arith.andi %s01, %s23 : i1
  %s47 = arith.andi %s45, %s67 : i1
  %shapes = arith.andi %s03, %s47 : i1
  cf.assert %shapes, "stageml_lora_bf16: x must be [M, K], w [N/64, K/64, 8, 64, 8], a [K, R] and b [R, N] (push constants M, K, N, R)"
  %kr = arith.remui %K, %c64 : index
  %nr = arith.remui %N, %c64 : index
  %rem = arith.ori %kr, %nr : index
  %aligned = arith.cmpi eq, %rem, %c0 : index
  %r_lo = arith.cmpi sge, %R, %c1 : index
  %r_hi = arith.cmpi sle, %R, %c32 : index
  %r_ok = arith.andi %r_lo, %r_hi : i1
  %limits = arith.andi %aligned, %r_ok : i1
  cf.assert %limits, "stageml_lora_bf16: K and N must be multiples of 64, and 1 <= R <= 32"
  %scale = arith.bitcast %scale_bits : i32 to f32
  %v = func.call @stageml_product_bf16(%x, %w) : (tensor<?x?xbf16>, tensor<?x?x8x64x8xbf16>) -> tensor<?x?xf32>
  %te = tensor.empty(%M, %R) : tensor<?x?xf32>
  %t0 = linalg.fill ins(%zero : f32) outs(%te : tensor<?x?xf32>) -> tensor<?x?xf32>
  %t = linalg.matmul ins(%x, %a : tensor<?x?xbf16>, tensor<?x?xbf16>) outs(%t0 : tensor<?x?xf32>) -> tensor<?x?xf32>
  %le = tensor.empty(%M, %N) : tensor<?x?xf32>
  %l0 = linalg.fill ins(%zero : f32) outs(%le : tensor<?x?xf32>) -> tensor<?x?xf32>
  %l = linalg.matmul ins(%t, %b : tensor<?x?xf32>, tensor<?x?xbf16>) outs(%l0 : tensor<?x?xf32>) -> tensor<?x?xf32>
  %ye = tensor.empty(%M, %N) : tensor<?x?xbf16>
  %y = linalg.generic {indexing_maps = [affine_map<(m, n) -> (m, n)>, affine_map<(m, n) -> (m, n)>,
                                        affine_map<(m, n) -> (m, n)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%v, %l : tensor<?x?xf32>, tensor<?x?xf32>) outs(%ye : tensor<?x?xbf16>) {
  ^bb0(%base: f32, %low_rank: f32, %out: bf16):
    %sum = math.fma %scale, %low_rank, %base : f32
    %rounded = arith.truncf %sum : f32 to bf16
    linalg.yield %rounded : bf16
  } -> tensor<?x?xbf16>
  return %y : tensor<?x?xbf16>
}

// ---------------------------------------------------------------- GEMM with a fused expand

func.func private @stageml_gemm_expand_f16_reference(%x: tensor<?x?xf16>, %w: tensor<?x?x8x64x8xf16>,
    %t: tensor<?x1x?xf32>, %ids: tensor<?xi64>, %table: tensor<?x?x?xf16>,
    %m: i32, %k: i32, %n: i32, %r: i32, %rows: i32) -> tensor<?x?xf16>
    attributes {stageml.reference_of = "stageml_gemm_expand_f16"} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c64 = arith.constant 64 : index
  %c256 = arith.constant 256 : index
  %zero = arith.constant 0.0 : f32
  %true = arith.constant true
  %zero_i64 = arith.constant 0 : i64
  %M = arith.index_cast %m : i32 to index
  %K = arith.index_cast %k : i32 to index
  %N = arith.index_cast %n : i32 to index
  %R = arith.index_cast %r : i32 to index
  %ROWS = arith.index_cast %rows : i32 to index
  %xm = tensor.dim %x, %c0 : tensor<?x?xf16>
  %xk = tensor.dim %x, %c1 : tensor<?x?xf16>
  %tn = tensor.dim %w, %c0 : tensor<?x?x8x64x8xf16>
  %tk = tensor.dim %w, %c1 : tensor<?x?x8x64x8xf16>
  %tm = tensor.dim %t, %c0 : tensor<?x1x?xf32>
  %tr = tensor.dim %t, %c2 : tensor<?x1x?xf32>
  %ir = tensor.dim %ids, %c0 : tensor<?xi64>
  %slots = tensor.dim %table, %c0 : tensor<?x?x?xf16>
  %br = tensor.dim %table, %c1 : tensor<?x?x?xf16>
  %bn = tensor.dim %table, %c2 : tensor<?x?x?xf16>
  %wn = arith.muli %tn, %c64 : index
  %wk = arith.muli %tk, %c64 : index
  %s0 = arith.cmpi eq, %xm, %M : index
  %s1 = arith.cmpi eq, %xk, %K : index
  %s2 = arith.cmpi eq, %wk, %K : index
  %s3 = arith.cmpi eq, %wn, %N : index
  %s4 = arith.cmpi uge, %tm, %M : index
  %s5 = arith.cmpi eq, %tr, %R : index
  %s6 = arith.cmpi eq, %ir, %ROWS : index
  %s7 = arith.cmpi eq, %br, %R : index
  %s8 = arith.cmpi eq, %bn, %N : index
  %s01 = arith.andi %s0, %s1 : i1
  %s23 = arith.andi %s2, %s3 : i1
  %s45 = arith.andi %s4, %s5 : i1
  %s67 = arith.andi %s6, %s7 : i1
  %s03 = arith.andi %s01, %s23 : i1
  %s47 = arith.andi %s45, %s67 : i1
  %s07 = arith.andi %s03, %s47 : i1
  %shapes = arith.andi %s07, %s8 : i1
  cf.assert %shapes, "stageml_gemm_expand_f16: x must be [M, K], w [N/64, K/64, 8, 64, 8], t [M', 1, R] with M' >= M, ids [rows] and table [S, R, N] (push constants M, K, N, R, rows)"
  %kr = arith.remui %K, %c256 : index
  %nr = arith.remui %N, %c64 : index
  %rem = arith.ori %kr, %nr : index
  %aligned = arith.cmpi eq, %rem, %c0 : index
  %r_ok = arith.cmpi sge, %R, %c1 : index
  %limits = arith.andi %aligned, %r_ok : i1
  cf.assert %limits, "stageml_gemm_expand_f16: K must be a multiple of 256, N of 64, and R >= 1"
  %slots_i64 = arith.index_cast %slots : index to i64
  %ie = tensor.empty() : tensor<i1>
  %i0 = linalg.fill ins(%true : i1) outs(%ie : tensor<i1>) -> tensor<i1>
  %in_range = linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> ()>],
                              iterator_types = ["reduction"]}
      ins(%ids : tensor<?xi64>) outs(%i0 : tensor<i1>) {
  ^bb0(%id: i64, %all: i1):
    %lo = arith.cmpi sge, %id, %zero_i64 : i64
    %hi = arith.cmpi slt, %id, %slots_i64 : i64
    %ok = arith.andi %lo, %hi : i1
    %still = arith.andi %all, %ok : i1
    linalg.yield %still : i1
  } -> tensor<i1>
  %ids_ok = tensor.extract %in_range[] : tensor<i1>
  cf.assert %ids_ok, "stageml_gemm_expand_f16: every id must be a slot of the table (0 <= id < S)"
  %covered = arith.cmpi uge, %ROWS, %M : index
  %has_base = arith.cmpi sge, %slots, %c1 : index
  %base_ok = arith.ori %covered, %has_base : i1
  cf.assert %base_ok, "stageml_gemm_expand_f16: rows past the ids take slot 0, which the table must have"
  // slot(m): the ids, then slot 0 up to M rows
  %given = arith.minui %ROWS, %M : index
  %past = arith.subi %M, %given : index
  %padded = tensor.pad %ids low[0] high[%past] {
  ^bb0(%i: index):
    tensor.yield %zero_i64 : i64
  } : tensor<?xi64> to tensor<?xi64>
  %slot = tensor.extract_slice %padded[0] [%M] [1] : tensor<?xi64> to tensor<?xi64>
  %tmr = tensor.extract_slice %t[0, 0, 0] [%M, 1, %R] [1, 1, 1] : tensor<?x1x?xf32> to tensor<?x?xf32>
  %v = func.call @stageml_product_f16(%x, %w) : (tensor<?x?xf16>, tensor<?x?x8x64x8xf16>) -> tensor<?x?xf32>
  %le = tensor.empty(%M, %N) : tensor<?x?xf32>
  %l0 = linalg.fill ins(%zero : f32) outs(%le : tensor<?x?xf32>) -> tensor<?x?xf32>
  %l = linalg.generic {indexing_maps = [affine_map<(m, n, r) -> (m, r)>, affine_map<(m, n, r) -> (m)>,
                                        affine_map<(m, n, r) -> (m, n)>],
                       iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%tmr, %slot : tensor<?x?xf32>, tensor<?xi64>) outs(%l0 : tensor<?x?xf32>) {
  ^bb0(%tv: f32, %id: i64, %acc: f32):
    %s = arith.index_cast %id : i64 to index
    %col = linalg.index 1 : index
    %rank = linalg.index 2 : index
    %bv = tensor.extract %table[%s, %rank, %col] : tensor<?x?x?xf16>
    %bf = arith.extf %bv : f16 to f32
    %sum = math.fma %tv, %bf, %acc : f32
    linalg.yield %sum : f32
  } -> tensor<?x?xf32>
  %ye = tensor.empty(%M, %N) : tensor<?x?xf16>
  %y = linalg.generic {indexing_maps = [affine_map<(m, n) -> (m, n)>, affine_map<(m, n) -> (m, n)>,
                                        affine_map<(m, n) -> (m, n)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%v, %l : tensor<?x?xf32>, tensor<?x?xf32>) outs(%ye : tensor<?x?xf16>) {
  ^bb0(%base: f32, %low_rank: f32, %out: f16):
    %sum = arith.addf %base, %low_rank : f32
    %rounded = arith.truncf %sum : f32 to f16
    linalg.yield %rounded : f16
  } -> tensor<?x?xf16>
  return %y : tensor<?x?xf16>
}

func.func private @stageml_gemm_expand_bf16_reference(%x: tensor<?x?xbf16>, %w: tensor<?x?x8x64x8xbf16>,
    %t: tensor<?x1x?xf32>, %ids: tensor<?xi64>, %table: tensor<?x?x?xbf16>,
    %m: i32, %k: i32, %n: i32, %r: i32, %rows: i32) -> tensor<?x?xbf16>
    attributes {stageml.reference_of = "stageml_gemm_expand_bf16"} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c64 = arith.constant 64 : index
  %c256 = arith.constant 256 : index
  %zero = arith.constant 0.0 : f32
  %true = arith.constant true
  %zero_i64 = arith.constant 0 : i64
  %M = arith.index_cast %m : i32 to index
  %K = arith.index_cast %k : i32 to index
  %N = arith.index_cast %n : i32 to index
  %R = arith.index_cast %r : i32 to index
  %ROWS = arith.index_cast %rows : i32 to index
  %xm = tensor.dim %x, %c0 : tensor<?x?xbf16>
  %xk = tensor.dim %x, %c1 : tensor<?x?xbf16>
  %tn = tensor.dim %w, %c0 : tensor<?x?x8x64x8xbf16>
  %tk = tensor.dim %w, %c1 : tensor<?x?x8x64x8xbf16>
  %tm = tensor.dim %t, %c0 : tensor<?x1x?xf32>
  %tr = tensor.dim %t, %c2 : tensor<?x1x?xf32>
  %ir = tensor.dim %ids, %c0 : tensor<?xi64>
  %slots = tensor.dim %table, %c0 : tensor<?x?x?xbf16>
  %br = tensor.dim %table, %c1 : tensor<?x?x?xbf16>
  %bn = tensor.dim %table, %c2 : tensor<?x?x?xbf16>
  %wn = arith.muli %tn, %c64 : index
  %wk = arith.muli %tk, %c64 : index
  %s0 = arith.cmpi eq, %xm, %M : index
  %s1 = arith.cmpi eq, %xk, %K : index
  %s2 = arith.cmpi eq, %wk, %K : index
  %s3 = arith.cmpi eq, %wn, %N : index
  %s4 = arith.cmpi uge, %tm, %M : index
  %s5 = arith.cmpi eq, %tr, %R : index
  %s6 = arith.cmpi eq, %ir, %ROWS : index
  %s7 = arith.cmpi eq, %br, %R : index
  %s8 = arith.cmpi eq, %bn, %N : index
  %s01 = arith.andi %s0, %s1 : i1
  %s23 = arith.andi %s2, %s3 : i1
  %s45 = arith.andi %s4, %s5 : i1
  %s67 = arith.andi %s6, %s7 : i1
  %s03 = arith.andi %s01, %s23 : i1
  %s47 = arith.andi %s45, %s67 : i1
  %s07 = arith.andi %s03, %s47 : i1
  %shapes = arith.andi %s07, %s8 : i1
  cf.assert %shapes, "stageml_gemm_expand_bf16: x must be [M, K], w [N/64, K/64, 8, 64, 8], t [M', 1, R] with M' >= M, ids [rows] and table [S, R, N] (push constants M, K, N, R, rows)"
  %kr = arith.remui %K, %c256 : index
  %nr = arith.remui %N, %c64 : index
  %rem = arith.ori %kr, %nr : index
  %aligned = arith.cmpi eq, %rem, %c0 : index
  %r_ok = arith.cmpi sge, %R, %c1 : index
  %limits = arith.andi %aligned, %r_ok : i1
  cf.assert %limits, "stageml_gemm_expand_bf16: K must be a multiple of 256, N of 64, and R >= 1"
  %slots_i64 = arith.index_cast %slots : index to i64
  %ie = tensor.empty() : tensor<i1>
  %i0 = linalg.fill ins(%true : i1) outs(%ie : tensor<i1>) -> tensor<i1>
  %in_range = linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> ()>],
                              iterator_types = ["reduction"]}
      ins(%ids : tensor<?xi64>) outs(%i0 : tensor<i1>) {
  ^bb0(%id: i64, %all: i1):
    %lo = arith.cmpi sge, %id, %zero_i64 : i64
    %hi = arith.cmpi slt, %id, %slots_i64 : i64
    %ok = arith.andi %lo, %hi : i1
    %still = arith.andi %all, %ok : i1
    linalg.yield %still : i1
  } -> tensor<i1>
  %ids_ok = tensor.extract %in_range[] : tensor<i1>
  cf.assert %ids_ok, "stageml_gemm_expand_bf16: every id must be a slot of the table (0 <= id < S)"
  %covered = arith.cmpi uge, %ROWS, %M : index
  %has_base = arith.cmpi sge, %slots, %c1 : index
  %base_ok = arith.ori %covered, %has_base : i1
  cf.assert %base_ok, "stageml_gemm_expand_bf16: rows past the ids take slot 0, which the table must have"
  // slot(m): the ids, then slot 0 up to M rows
  %given = arith.minui %ROWS, %M : index
  %past = arith.subi %M, %given : index
  %padded = tensor.pad %ids low[0] high[%past] {
  ^bb0(%i: index):
    tensor.yield %zero_i64 : i64
  } : tensor<?xi64> to tensor<?xi64>
  %slot = tensor.extract_slice %padded[0] [%M] [1] : tensor<?xi64> to tensor<?xi64>
  %tmr = tensor.extract_slice %t[0, 0, 0] [%M, 1, %R] [1, 1, 1] : tensor<?x1x?xf32> to tensor<?x?xf32>
  %v = func.call @stageml_product_bf16(%x, %w) : (tensor<?x?xbf16>, tensor<?x?x8x64x8xbf16>) -> tensor<?x?xf32>
  %le = tensor.empty(%M, %N) : tensor<?x?xf32>
  %l0 = linalg.fill ins(%zero : f32) outs(%le : tensor<?x?xf32>) -> tensor<?x?xf32>
  %l = linalg.generic {indexing_maps = [affine_map<(m, n, r) -> (m, r)>, affine_map<(m, n, r) -> (m)>,
                                        affine_map<(m, n, r) -> (m, n)>],
                       iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%tmr, %slot : tensor<?x?xf32>, tensor<?xi64>) outs(%l0 : tensor<?x?xf32>) {
  ^bb0(%tv: f32, %id: i64, %acc: f32):
    %s = arith.index_cast %id : i64 to index
    %col = linalg.index 1 : index
    %rank = linalg.index 2 : index
    %bv = tensor.extract %table[%s, %rank, %col] : tensor<?x?x?xbf16>
    %bf = arith.extf %bv : bf16 to f32
    %sum = math.fma %tv, %bf, %acc : f32
    linalg.yield %sum : f32
  } -> tensor<?x?xf32>
  %ye = tensor.empty(%M, %N) : tensor<?x?xbf16>
  %y = linalg.generic {indexing_maps = [affine_map<(m, n) -> (m, n)>, affine_map<(m, n) -> (m, n)>,
                                        affine_map<(m, n) -> (m, n)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%v, %l : tensor<?x?xf32>, tensor<?x?xf32>) outs(%ye : tensor<?x?xbf16>) {
  ^bb0(%base: f32, %low_rank: f32, %out: bf16):
    %sum = arith.addf %base, %low_rank : f32
    %rounded = arith.truncf %sum : f32 to bf16
    linalg.yield %rounded : bf16
  } -> tensor<?x?xbf16>
  return %y : tensor<?x?xbf16>
}

// ---------------------------------------------------------------- a multi-tenant LoRA site in one kernel

func.func private @stageml_gemm_lora_f16_reference(%x: tensor<?x?xf16>, %w: tensor<?x?x8x64x8xf16>,
    %ids: tensor<?xi64>, %a: tensor<?x?x?xf16>, %b: tensor<?x?x?xf16>, %m: i32, %k: i32, %n: i32, %r: i32,
    %rows: i32, %scale_bits: i32, %site: i32) -> tensor<?x?xf16>
    attributes {stageml.reference_of = "stageml_gemm_lora_f16"} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c32 = arith.constant 32 : index
  %zero_i64 = arith.constant 0 : i64
  %M = arith.index_cast %m : i32 to index
  %R = arith.index_cast %r : i32 to index
  %ROWS = arith.index_cast %rows : i32 to index
  %r_ok = arith.cmpi ule, %R, %c32 : index
  cf.assert %r_ok, "stageml_gemm_lora_f16: R must be at most 32"
  // slot(m): the ids, then slot 0 up to M rows
  %given = arith.minui %ROWS, %M : index
  %past = arith.subi %M, %given : index
  %padded = tensor.pad %ids low[0] high[%past] {
  ^bb0(%i: index):
    tensor.yield %zero_i64 : i64
  } : tensor<?xi64> to tensor<?xi64>
  %slot = tensor.extract_slice %padded[0] [%M] [1] : tensor<?xi64> to tensor<?xi64>
  %xm = tensor.dim %x, %c0 : tensor<?x?xf16>
  %xk = tensor.dim %x, %c1 : tensor<?x?xf16>
  %x3 = tensor.expand_shape %x [[0, 1], [2]] output_shape [%xm, 1, %xk] : tensor<?x?xf16> into tensor<?x1x?xf16>
  %t = func.call @stageml_bgmv_f16_reference(%x3, %slot, %a, %m, %k, %r)
      : (tensor<?x1x?xf16>, tensor<?xi64>, tensor<?x?x?xf16>, i32, i32, i32) -> tensor<?x1x?xf32>
  %scale = arith.bitcast %scale_bits : i32 to f32
  %tm = tensor.dim %t, %c0 : tensor<?x1x?xf32>
  %tr = tensor.dim %t, %c2 : tensor<?x1x?xf32>
  %te = tensor.empty(%tm, %tr) : tensor<?x1x?xf32>
  %ts = linalg.generic {indexing_maps = [affine_map<(m, o, r) -> (m, o, r)>, affine_map<(m, o, r) -> (m, o, r)>],
                        iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%t : tensor<?x1x?xf32>) outs(%te : tensor<?x1x?xf32>) {
  ^bb0(%tv: f32, %out: f32):
    %scaled = arith.mulf %tv, %scale : f32
    linalg.yield %scaled : f32
  } -> tensor<?x1x?xf32>
  %y = func.call @stageml_gemm_expand_f16_reference(%x, %w, %ts, %ids, %b, %m, %k, %n, %r, %rows)
      : (tensor<?x?xf16>, tensor<?x?x8x64x8xf16>, tensor<?x1x?xf32>, tensor<?xi64>, tensor<?x?x?xf16>,
         i32, i32, i32, i32, i32) -> tensor<?x?xf16>
  return %y : tensor<?x?xf16>
}

func.func private @stageml_gemm_lora_bf16_reference(%x: tensor<?x?xbf16>, %w: tensor<?x?x8x64x8xbf16>,
    %ids: tensor<?xi64>, %a: tensor<?x?x?xbf16>, %b: tensor<?x?x?xbf16>, %m: i32, %k: i32, %n: i32, %r: i32,
    %rows: i32, %scale_bits: i32, %site: i32) -> tensor<?x?xbf16>
    attributes {stageml.reference_of = "stageml_gemm_lora_bf16"} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c32 = arith.constant 32 : index
  %zero_i64 = arith.constant 0 : i64
  %M = arith.index_cast %m : i32 to index
  %R = arith.index_cast %r : i32 to index
  %ROWS = arith.index_cast %rows : i32 to index
  %r_ok = arith.cmpi ule, %R, %c32 : index
  cf.assert %r_ok, "stageml_gemm_lora_bf16: R must be at most 32"
  // slot(m): the ids, then slot 0 up to M rows
  %given = arith.minui %ROWS, %M : index
  %past = arith.subi %M, %given : index
  %padded = tensor.pad %ids low[0] high[%past] {
  ^bb0(%i: index):
    tensor.yield %zero_i64 : i64
  } : tensor<?xi64> to tensor<?xi64>
  %slot = tensor.extract_slice %padded[0] [%M] [1] : tensor<?xi64> to tensor<?xi64>
  %xm = tensor.dim %x, %c0 : tensor<?x?xbf16>
  %xk = tensor.dim %x, %c1 : tensor<?x?xbf16>
  %x3 = tensor.expand_shape %x [[0, 1], [2]] output_shape [%xm, 1, %xk] : tensor<?x?xbf16> into tensor<?x1x?xbf16>
  %t = func.call @stageml_bgmv_bf16_reference(%x3, %slot, %a, %m, %k, %r)
      : (tensor<?x1x?xbf16>, tensor<?xi64>, tensor<?x?x?xbf16>, i32, i32, i32) -> tensor<?x1x?xf32>
  %scale = arith.bitcast %scale_bits : i32 to f32
  %tm = tensor.dim %t, %c0 : tensor<?x1x?xf32>
  %tr = tensor.dim %t, %c2 : tensor<?x1x?xf32>
  %te = tensor.empty(%tm, %tr) : tensor<?x1x?xf32>
  %ts = linalg.generic {indexing_maps = [affine_map<(m, o, r) -> (m, o, r)>, affine_map<(m, o, r) -> (m, o, r)>],
                        iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%t : tensor<?x1x?xf32>) outs(%te : tensor<?x1x?xf32>) {
  ^bb0(%tv: f32, %out: f32):
    %scaled = arith.mulf %tv, %scale : f32
    linalg.yield %scaled : f32
  } -> tensor<?x1x?xf32>
  %y = func.call @stageml_gemm_expand_bf16_reference(%x, %w, %ts, %ids, %b, %m, %k, %n, %r, %rows)
      : (tensor<?x?xbf16>, tensor<?x?x8x64x8xbf16>, tensor<?x1x?xf32>, tensor<?xi64>, tensor<?x?x?xbf16>,
         i32, i32, i32, i32, i32) -> tensor<?x?xbf16>
  return %y : tensor<?x?xbf16>
}

// ---------------------------------------------------------------- BGMV

func.func private @stageml_bgmv_f16_reference(%x: tensor<?x1x?xf16>, %ids: tensor<?xi64>,
    %table: tensor<?x?x?xf16>, %b: i32, %k: i32, %n: i32) -> tensor<?x1x?xf32>
    attributes {stageml.reference_of = "stageml_bgmv_f16"} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %zero = arith.constant 0.0 : f32
  %true = arith.constant true
  %B = arith.index_cast %b : i32 to index
  %K = arith.index_cast %k : i32 to index
  %N = arith.index_cast %n : i32 to index
  %xb = tensor.dim %x, %c0 : tensor<?x1x?xf16>
  %xk = tensor.dim %x, %c2 : tensor<?x1x?xf16>
  %ib = tensor.dim %ids, %c0 : tensor<?xi64>
  %slots = tensor.dim %table, %c0 : tensor<?x?x?xf16>
  %tk = tensor.dim %table, %c1 : tensor<?x?x?xf16>
  %tn = tensor.dim %table, %c2 : tensor<?x?x?xf16>
  %s0 = arith.cmpi eq, %xb, %B : index
  %s1 = arith.cmpi eq, %xk, %K : index
  %s2 = arith.cmpi eq, %ib, %B : index
  %s3 = arith.cmpi eq, %tk, %K : index
  %s4 = arith.cmpi eq, %tn, %N : index
  %s01 = arith.andi %s0, %s1 : i1
  %s23 = arith.andi %s2, %s3 : i1
  %s03 = arith.andi %s01, %s23 : i1
  %shapes = arith.andi %s03, %s4 : i1
  cf.assert %shapes, "stageml_bgmv_f16: x must be [B, 1, K], ids [B] and table [S, K, N] (push constants B, K, N)"
  %slots_i64 = arith.index_cast %slots : index to i64
  %zero_i64 = arith.constant 0 : i64
  %ie = tensor.empty() : tensor<i1>
  %i0 = linalg.fill ins(%true : i1) outs(%ie : tensor<i1>) -> tensor<i1>
  %in_range = linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> ()>],
                              iterator_types = ["reduction"]}
      ins(%ids : tensor<?xi64>) outs(%i0 : tensor<i1>) {
  ^bb0(%id: i64, %all: i1):
    %lo = arith.cmpi sge, %id, %zero_i64 : i64
    %hi = arith.cmpi slt, %id, %slots_i64 : i64
    %ok = arith.andi %lo, %hi : i1
    %still = arith.andi %all, %ok : i1
    linalg.yield %still : i1
  } -> tensor<i1>
  %ids_ok = tensor.extract %in_range[] : tensor<i1>
  cf.assert %ids_ok, "stageml_bgmv_f16: every id must be a slot of the table (0 <= id < S)"
  %x2 = tensor.collapse_shape %x [[0, 1], [2]] : tensor<?x1x?xf16> into tensor<?x?xf16>
  %ye = tensor.empty(%B, %N) : tensor<?x?xf32>
  %y0 = linalg.fill ins(%zero : f32) outs(%ye : tensor<?x?xf32>) -> tensor<?x?xf32>
  %y2 = linalg.generic {indexing_maps = [affine_map<(b, n, k) -> (b, k)>, affine_map<(b, n, k) -> (b)>,
                                         affine_map<(b, n, k) -> (b, n)>],
                        iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%x2, %ids : tensor<?x?xf16>, tensor<?xi64>) outs(%y0 : tensor<?x?xf32>) {
  ^bb0(%xv: f16, %id: i64, %acc: f32):
    %slot = arith.index_cast %id : i64 to index
    %col = linalg.index 1 : index
    %row = linalg.index 2 : index
    %tv = tensor.extract %table[%slot, %row, %col] : tensor<?x?x?xf16>
    %tf = arith.extf %tv : f16 to f32
    %xf = arith.extf %xv : f16 to f32
    %sum = math.fma %xf, %tf, %acc : f32
    linalg.yield %sum : f32
  } -> tensor<?x?xf32>
  %y = tensor.expand_shape %y2 [[0, 1], [2]] output_shape [%B, 1, %N] : tensor<?x?xf32> into tensor<?x1x?xf32>
  return %y : tensor<?x1x?xf32>
}

func.func private @stageml_bgmv_bf16_reference(%x: tensor<?x1x?xbf16>, %ids: tensor<?xi64>,
    %table: tensor<?x?x?xbf16>, %b: i32, %k: i32, %n: i32) -> tensor<?x1x?xf32>
    attributes {stageml.reference_of = "stageml_bgmv_bf16"} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %zero = arith.constant 0.0 : f32
  %true = arith.constant true
  %B = arith.index_cast %b : i32 to index
  %K = arith.index_cast %k : i32 to index
  %N = arith.index_cast %n : i32 to index
  %xb = tensor.dim %x, %c0 : tensor<?x1x?xbf16>
  %xk = tensor.dim %x, %c2 : tensor<?x1x?xbf16>
  %ib = tensor.dim %ids, %c0 : tensor<?xi64>
  %slots = tensor.dim %table, %c0 : tensor<?x?x?xbf16>
  %tk = tensor.dim %table, %c1 : tensor<?x?x?xbf16>
  %tn = tensor.dim %table, %c2 : tensor<?x?x?xbf16>
  %s0 = arith.cmpi eq, %xb, %B : index
  %s1 = arith.cmpi eq, %xk, %K : index
  %s2 = arith.cmpi eq, %ib, %B : index
  %s3 = arith.cmpi eq, %tk, %K : index
  %s4 = arith.cmpi eq, %tn, %N : index
  %s01 = arith.andi %s0, %s1 : i1
  %s23 = arith.andi %s2, %s3 : i1
  %s03 = arith.andi %s01, %s23 : i1
  %shapes = arith.andi %s03, %s4 : i1
  cf.assert %shapes, "stageml_bgmv_bf16: x must be [B, 1, K], ids [B] and table [S, K, N] (push constants B, K, N)"
  %slots_i64 = arith.index_cast %slots : index to i64
  %zero_i64 = arith.constant 0 : i64
  %ie = tensor.empty() : tensor<i1>
  %i0 = linalg.fill ins(%true : i1) outs(%ie : tensor<i1>) -> tensor<i1>
  %in_range = linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> ()>],
                              iterator_types = ["reduction"]}
      ins(%ids : tensor<?xi64>) outs(%i0 : tensor<i1>) {
  ^bb0(%id: i64, %all: i1):
    %lo = arith.cmpi sge, %id, %zero_i64 : i64
    %hi = arith.cmpi slt, %id, %slots_i64 : i64
    %ok = arith.andi %lo, %hi : i1
    %still = arith.andi %all, %ok : i1
    linalg.yield %still : i1
  } -> tensor<i1>
  %ids_ok = tensor.extract %in_range[] : tensor<i1>
  cf.assert %ids_ok, "stageml_bgmv_bf16: every id must be a slot of the table (0 <= id < S)"
  %x2 = tensor.collapse_shape %x [[0, 1], [2]] : tensor<?x1x?xbf16> into tensor<?x?xbf16>
  %ye = tensor.empty(%B, %N) : tensor<?x?xf32>
  %y0 = linalg.fill ins(%zero : f32) outs(%ye : tensor<?x?xf32>) -> tensor<?x?xf32>
  %y2 = linalg.generic {indexing_maps = [affine_map<(b, n, k) -> (b, k)>, affine_map<(b, n, k) -> (b)>,
                                         affine_map<(b, n, k) -> (b, n)>],
                        iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%x2, %ids : tensor<?x?xbf16>, tensor<?xi64>) outs(%y0 : tensor<?x?xf32>) {
  ^bb0(%xv: bf16, %id: i64, %acc: f32):
    %slot = arith.index_cast %id : i64 to index
    %col = linalg.index 1 : index
    %row = linalg.index 2 : index
    %tv = tensor.extract %table[%slot, %row, %col] : tensor<?x?x?xbf16>
    %tf = arith.extf %tv : bf16 to f32
    %xf = arith.extf %xv : bf16 to f32
    %sum = math.fma %xf, %tf, %acc : f32
    linalg.yield %sum : f32
  } -> tensor<?x?xf32>
  %y = tensor.expand_shape %y2 [[0, 1], [2]] output_shape [%B, 1, %N] : tensor<?x?xf32> into tensor<?x1x?xf32>
  return %y : tensor<?x1x?xf32>
}
