// StageML's hand-written Hopper (sm_90a) kernels, dispatched by IREE as custom
// dispatches. T is __half (_f16) or __nv_bfloat16 (_bf16); products accumulate
// in f32 and each output is rounded to T once.
//
//   stageml_gemm_T(const T* x, const T* w, T* y, int M, int K, int N)
//     y[M,N] = x[M,K] @ w[K,N]
//     y[m,n] = T(sum_k f32(x[m,k]) * f32(w[k,n])): f32 sums, one rounding.
//   stageml_lora_T(const T* x, const T* w, const T* a, const T* b, T* y,
//                  int M, int K, int N, int R, uint32_t scale_bits)
//     y = x @ w + scale * (x @ a) @ b, a[K,R], b[R,N], scale = bits as f32.
//     t = x @ a stays on chip in f32; w is read once.
//     v = sum_k f32(x) f32(w), t = sum_k f32(x) f32(a), l = sum_r t f32(b),
//     all f32 (t is never rounded to T); y = T(fmaf(scale, l, v)): the scale
//     is applied once, after both products, in f32; one rounding.
//   stageml_bgmv_T(const T* x, const int64_t* ids, const T* table, float* y, int B, int K, int N)
//     y[b,:] = x[b,:] @ table[ids[b]] (f32), table [S,K,N]: a multi-tenant
//     residual's per-row product with each row's own adapter factor (BGMV).
//     y[b,n] = sum_k f32(x[b,k]) * f32(table[ids[b],k,n]) in f32, not rounded.
//     x is [B,K] (one token per row), table dense [S][K][N] (no strips),
//     ids int64 slot numbers, which the kernel trusts: 0 <= ids[b] < S is the
//     caller's. Any K and N. Grid (ceil(N / 32), max(B, 1), 8), clusters of (1, 1, 8);
//     past 64 rows (ceil(N / 32), ceil(B / 16), 8), 16 rows a block. At most 80 registers
//     a thread (3 blocks an SM: the per-row grid's many short blocks).
//
//   stageml_gemm_wgmma_T(const T* x, const T* w, T* y, int M, int K, int N)
//     the GEMM's semantics, by wgmma and TMA for any M (below).
//   stageml_gemm_expand_T(const T* x, const T* w, const float* t, const int64_t* ids, const T* table,
//                         T* y, int M, int K, int N, int R, int rows)
//     a multi-tenant LoRA site's base product with each row's expand added:
//     y[m,n] = T(sum_k f32(x) f32(w) + sum_r t[m,r] * f32(table[slot(m),r,n])), one rounding;
//     t [M,R] f32 (the row's shrink x @ A_slot, never rounded), table [S,R,N],
//     slot(m) = ids[m] for m < rows (trusted in range), else 0.
//   stageml_gemm_lora_T(const T* x, const T* w, const int64_t* ids, const T* a, const T* b, T* y,
//                       float* ws, int M, int K, int N, int R, int rows, uint32_t scale_bits, int site)
//     a multi-tenant LoRA site in one kernel: the shrink t = x @ a[slot(m)] and the expand of
//     stageml_gemm_expand, a [S,K,R], b [S,R,N], scale = bits as f32 (1 for a site whose scale
//     sits in b):
//     t[m,r] = scale * sum_k f32(x[m,k]) f32(a[slot(m),k,r]) in f32 (never rounded), then
//     y[m,n] = T(sum_k f32(x) f32(w) + sum_r t[m,r] * f32(b[slot(m),r,n])), one rounding.
//     A warp of each block (past 48 rows, every warp) computes the shrink, in units of (chunk of
//     k, row) that it claims from a counter, into ws [ceil(K / kc), M, R] (f32, the call's
//     scratch: its contents before and after mean nothing), kc = min(1024, floor(7168 / R / 32)
//     * 32) k-rows (at most 14 KiB of a); each block waits for every unit before its epilogue
//     and adds the chunks in a fixed order. A block waits only once every unit is claimed by a
//     running block, which finishes it without waiting: no grid size or SM count can deadlock
//     it. The counters are g_lora_sync[site % kSyncSlots] (zero at load; the grid's last block
//     zeroes them again), so dispatches of one site must not overlap (IREE's queue runs a
//     call's dispatches in order; `site` keeps distinct sites apart).
//
// reference.mlir holds each kernel's CPU reference in linalg (the same
// operands and push constants; use-custom-kernels{lowering=reference}
// calls it instead of the kernel), and checks what of the caller
// guarantees below its operands show. A change of semantics here changes it.
//
// w comes in StageML's tile layout: [N/64][K/64][8][64][8], the [K,N] matrix
// in 64x64 tiles (k-tiles inner), each tile 8 strips of 8 columns, a strip
// 64 rows of 8 (16 bytes). The sm90 pipeline packs w so once, off the request
// path (at load for a static weight, in @adapter for a merged one). A strip's
// 8 rows are one 8x8 wgmma core matrix (128 contiguous bytes), and the tiles
// a block streams of each 64 columns are one contiguous range, fetched by one bulk copy.
//
// ABI (IREE CUDA): bindings as pointers in order (inputs, then y [and ws]), then the
// push constants as 32-bit values. Buffers are dense and row-major, but w in tiles.
// Block: 256 x 1 x 1 threads (gemm_wgmma, gemm_expand: 288; gemm_lora: 320). Grid, from M and N:
//   gemm, lora   M <= 64: (ceil(N / 32), 1, 1)       GEMV and streaming paths
//                M >  64: (ceil(N / 64), ceil(M / 64), 1)  tiled path
//                M = 0 launches ceil(N / 32) blocks, which return at once.
//   gemm_wgmma, gemm_expand, gemm_lora: clusters of (2, 1, 1) (compiled in), 197632 (gemm_lora:
//                230656) bytes of dynamic
//                shared memory; M <= 128: (2 ceil(N / 64), 1, 1) (a cluster: the two halves
//                of K of 64 columns); M > 128: (2 ceil(N / 128), 1, ceil(M / rows)), rows
//                128 up to 256 rows (a cluster: the two halves of K of 128 columns and 128
//                rows), else 256 (a cluster: two column tiles of 64 sharing x); which cluster takes
//                which tile: wg_tile.
//
// Caller guarantees: K and N multiples of 64 (gemm_wgmma, gemm_expand, gemm_lora: K of 256); 0 <= M;
// lora, gemm_lora: 1 <= R <= 32; gemm_expand: 1 <= R; M*K, K*N, M*N < 2^31; pointers aligned to their
// element.
// x and w 16-byte aligned select the fast paths; otherwise a scalar path
// (slow, any grid) computes the same result. y, a and b may have any
// 2-byte alignment on every path.
//
// GEMV path (M <= 4; for LoRA, R a multiple of 8 and a 16-byte aligned):
// CUDA-core FMAs, f32. A block owns 32 columns (4 strips) of w; thread t reads
// 16 bytes (8 columns, one strip) of rows t/4, t/4 + 64, ..., so each warp reads 8
// rows of 4 strips, 128 contiguous bytes each, with up to 16 rows in flight per thread.
// LoRA: a's row k rides along (ranks 8*(t%4)..+7). Warps are summed by
// shuffles, then in shared memory.
//
// Streaming path (4 < M <= 64; latency-bound as measured on an H200, 2-4x
// cuBLAS): a block owns 32 columns
// of w over all of K; its 8 warps take interleaved 16-row steps of K. Each lane loads
// 4 rows x 4 columns of w (8-byte loads straight from global, several steps
// in flight) and pairs rows with byte permutes into mma B fragments, so the
// lane's rows k..k+3 stand for the mma's k = 2c, 2c+1, 2c+8, 2c+9 (the same
// permutation is applied to x, whose 4 consecutive elements load as one
// 8-byte A fragment pair). mma.m16n8k16 then covers up to 64 rows of x in
// 16-row tiles. The 8 warps' partial sums are added in shared memory.
// LoRA: a is read the same way as 32 extra columns (zero beyond R), giving
// each block all of t = x @ a; the epilogue adds scale * t @ b[:, cols].
//
// Tiled path (M > 64): 64x64 output tiles, 32-deep k tiles in a cp.async
// pipeline (4 stages, 3 for LoRA), ldmatrix + mma.m16n8k16. Warps are
// 2 k-halves x 2 x 2 of 32x32; the k-halves are added in shared memory.
// LoRA: a's 32-row x 32-rank tile rides in each stage (through registers,
// as a's rows need not be 16-byte aligned) and is multiplied with the same
// x fragments; the epilogue adds scale * t @ b as above.
//
// wgmma path (gemm_wgmma, gemm_expand, gemm_lora; x and w 16-byte aligned): A and B swapped, so w is
// the wgmma's M side and the tokens its N: a block computes y^T for 64 columns of w (128 at
// 129-256 rows) and up to 256 tokens (wgmma m64nNk16, N = 16/32/64/128/256, the smallest that
// covers the block's rows). Up to 128 rows, over one half of K: the two blocks of a cluster take
// the two halves and add them through distributed shared memory, each writing half of the tokens
// (no workspace, a fixed order of sums). At 129-256 rows the same split, for 128 columns (each
// warpgroup its own 64) and a tile of 128 rows: a block takes in 1 MB of w and x where two column
// tiles of 64 sharing x took 1.5 (as measured on an H100, 4096²: 25.3-26.4 -> 23.0-24.5 µs).
// Beyond, over all of K for a tile of 256 rows: the two blocks of a cluster are neighbouring
// column tiles, and each stage's x is copied once, by TMA multicast into both (as measured on an
// H200: 512 rows 50.7 -> 36.1 µs). A ring of up to 8 stages (gemm_lora up to 64 rows: 4) in
// shared memory: w's tiles by one TMA bulk copy a stage and 64 columns (completing on the
// stage's mbarrier); x's rows, 64 k to a 128-byte row in the 128-byte swizzle, by TMA tensor
// copies where the block has more than
// 32 rows (the tensor map built on the device, in a per-SM slot of global memory; the copies
// issued by a producer warp, which refills a slot once the warpgroups that read it, in both
// blocks where they share x, arrive on its empty barrier), else by cp.async.
// Both operands feed wgmma from shared memory by descriptor (w: no swizzle, 128 bytes to
// the next core matrix along k, 1024 along M; x: 128-byte swizzle, 1024 bytes per 8 rows).
// As measured on an H200, 16-byte cp.async of x capped a block near 36 GB/s and 8x8 core
// matrices spread each 128-byte line of x over several L2 requests; TMA lifts both. The two
// warpgroups take the first and the second half of each stage's k16 steps (with 128 columns,
// each its own 64 over every step) and their partial tiles are added in the epilogue; one
// wgmma group stays in flight.
//
// gemm_lora's shrink (Shrink below): a tenth warp of each block (threads 288-319) claims units,
// one at a time, while the other nine run the GEMM's main loop: it sums one row over one chunk
// of k, the chunk's rows of a (at most 14 KiB) and of x brought by TMA bulk copies into shared memory
// (the next unit's in flight meanwhile), each lane over every 32nd k-row (16-byte reads of 8
// ranks), and the 32 lanes' ranks are added by 31 shuffles. So the shrink, which reads only a,
// x and the ids, runs beside the w stream. Past kShrinkSideMaxM rows (x by TMA: a producer warp
// streams w on its own) the compute warps also take units, from global memory, before their main
// loop: one warp's share would outlast the loop. The epilogue waits for the units, adds each of
// its rows' chunks into shared memory and expands from there.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 256;
constexpr int kStreamMaxM = 64;
constexpr int kStreamCols = 32;
constexpr int kTileM = 64, kTileN = 64, kTileK = 32;
constexpr int kMaxRank = 32;
constexpr int kStrip = 8;   // columns of w per strip
constexpr int kTileW = 64;  // rows and columns of w per tile
constexpr int kLd = 33;  // f32 row stride of the shared-memory reduction tiles (conflict-free)

// Element (k, n) of w in the tile layout [N/64][K/64][8][64][8].
__device__ __forceinline__ size_t w_at(int k, int n, int K) {
  const size_t tile = static_cast<size_t>(n >> 6) * (K >> 6) + (k >> 6);
  return ((tile * 8 + ((n >> 3) & 7)) * kTileW + (k & 63)) * kStrip + (n & 7);
}

template <typename T> struct IsBf16 { static constexpr bool value = false; };
template <> struct IsBf16<__nv_bfloat16> { static constexpr bool value = true; };

__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ T from_f32(float v);
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// d += A(16x16, row) * B(16x8, col), f32 accumulators.
template <typename T>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (IsBf16<T>::value)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Every thread of the cluster: its earlier writes (shared or global) are seen by the cluster's
// threads past the barrier. The release is a GPU-scope membar, which waits for the block's
// global stores.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// The two halves of a cluster barrier that orders no memory: for the blocks' lifetimes (no block
// leaves while another reads its shared memory: those reads have returned their values before
// the arrival) and for mbarriers made visible by fence.mbarrier_init.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;" ::: "memory"); }
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// The address `p` has in this block's shared memory, in block `rank`'s.
__device__ __forceinline__ uint32_t cluster_addr(const void* p, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(p)), "r"(rank));
  return remote;
}
// 16 bytes (or, ld_cluster1, one float) of block `rank`'s shared memory at the address `p` has in
// this block's.
__device__ __forceinline__ float4 ld_cluster(const float* p, uint32_t rank) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(cluster_addr(p, rank)) : "memory");
  return v;
}
__device__ __forceinline__ float ld_cluster1(const float* p, uint32_t rank) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(cluster_addr(p, rank)) : "memory");
  return v;
}

// 16-byte global -> shared copy; zero-fills when !ok (src is then not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(ok ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)) : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)) : "memory");
}

// Column j of two 4-column row pieces (rows k, k+1) as one k-major B register.
__device__ __forceinline__ uint32_t pair(uint2 lo, uint2 hi, int j) {
  return __byte_perm(j < 2 ? lo.x : lo.y, j < 2 ? hi.x : hi.y, (j & 1) ? 0x7632 : 0x5410);
}

// y[m0.., n0..] = src (the sum of nsrc f32 tiles) [+ scale * t @ b]; one column per thread.
template <typename T, bool LORA>
__device__ __forceinline__ void epilogue(const float* src, int nsrc, int stride, int ld, const float* ts, int rows,
                                         int cols, int m0, int n0, T* y, const T* b, int M, int N, int R,
                                         float scale) {
  const int n = threadIdx.x % cols, gn = n0 + n;
  if (gn >= N) return;
  float bcol[LORA ? kMaxRank : 1];
  if constexpr (LORA) {
#pragma unroll
    for (int r = 0; r < kMaxRank; ++r) bcol[r] = r < R ? to_f32(b[r * N + gn]) : 0.f;
  }
  for (int m = threadIdx.x / cols; m < rows && m0 + m < M; m += kThreads / cols) {
    float v = 0.f;
    for (int i = 0; i < nsrc; ++i) v += src[i * stride + m * ld + n];
    if constexpr (LORA) {
      float l = 0.f;
#pragma unroll
      for (int r = 0; r < kMaxRank; ++r) l = fmaf(ts[m * kLd + r], bcol[r], l);
      v = fmaf(scale, l, v);
    }
    y[(m0 + m) * N + gn] = from_f32<T>(v);
  }
}

// k steps a warp has in flight: enough 8-byte loads to cover HBM latency,
// fewer where x (MT tiles) and a take registers.
template <int MT, bool LORA> constexpr int kUnroll = MT == 1 ? 8 : MT == 2 ? (LORA ? 4 : 8) : (LORA ? 2 : 4);

// 2 NW consecutive T (NW 32-bit words) as f32.
template <typename T, int NW> __device__ __forceinline__ void unpack(const uint32_t (&u)[NW], float (&f)[2 * NW]) {
#pragma unroll
  for (int i = 0; i < NW; ++i) {
    float2 p;
    if constexpr (IsBf16<T>::value) p = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u[i]));
    else p = __half22float2(*reinterpret_cast<const __half2*>(&u[i]));
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}
// 8 consecutive T (16 bytes) as f32.
template <typename T> __device__ __forceinline__ void unpack8(uint4 v, float (&f)[8]) {
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
  unpack<T>(u, f);
}

// GEMV path (M <= MM rows, MM = 1 or 4), CUDA-core FMAs on 16-byte loads.
template <typename T, int MM, bool LORA>
__device__ __forceinline__ void gemv_path(const T* x, const T* w, const T* a, const T* b, T* y, int M, int K,
                                          int N, int R, float scale, float* smem) {
  static_assert(MM * 32 <= kThreads, "one thread per (row, column) in the final sum");
  constexpr int U = (MM == 1 ? 16 : 8) / (LORA ? 2 : 1);  // rows in flight per thread
  const int cg = threadIdx.x & 3, rl = threadIdx.x >> 2, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n0 = blockIdx.x * kStreamCols;
  if (n0 >= N) return;
  const bool a_on = LORA && 8 * cg < R;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  float acc[MM][8] = {}, tacc[LORA ? MM : 1][8] = {};
  for (int k0 = rl; k0 < K; k0 += 64 * U) {
    uint4 wv[U], av[LORA ? U : 1];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k = k0 + 64 * u;
      wv[u] = k < K ? __ldcs(reinterpret_cast<const uint4*>(w + w_at(k, n0 + 8 * cg, K))) : zero;
      if constexpr (LORA) av[u] = a_on && k < K ? __ldg(reinterpret_cast<const uint4*>(a + k * R + 8 * cg)) : zero;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k = k0 + 64 * u;
      float wf[8], af[8];
      unpack8<T>(wv[u], wf);
      if constexpr (LORA) unpack8<T>(av[u], af);
#pragma unroll
      for (int m = 0; m < MM; ++m) {
        const float xv = m < M && k < K ? to_f32(x[m * K + k]) : 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          acc[m][j] = fmaf(xv, wf[j], acc[m][j]);
          if constexpr (LORA) tacc[m][j] = fmaf(xv, af[j], tacc[m][j]);
        }
      }
    }
  }
  // Sum a warp's 8 rows (lanes 4r + cg) by shuffles, then the 8 warps in shared memory:
  // red[warp][m][32 columns], tred[warp][m][32 ranks].
  float* red = smem;
  float* tred = smem + 8 * MM * 32;
  auto warp_sum = [&](float (&v)[8], float* out, int m) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float s = v[j];
      s += __shfl_xor_sync(0xffffffffu, s, 4);
      s += __shfl_xor_sync(0xffffffffu, s, 8);
      s += __shfl_xor_sync(0xffffffffu, s, 16);
      if (lane < 4) out[(warp * MM + m) * 32 + 8 * cg + j] = s;
    }
  };
#pragma unroll
  for (int m = 0; m < MM; ++m) {
    warp_sum(acc[m], red, m);
    if constexpr (LORA) warp_sum(tacc[m], tred, m);
  }
  __syncthreads();
  float* sums = smem + 16 * MM * 32;  // [m][32] column sums, then [m][kLd] rank sums
  float* ts = sums + MM * 32;
  if (threadIdx.x < MM * 32) {
    float s = 0.f, t = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      s += red[i * MM * 32 + threadIdx.x];
      if constexpr (LORA) t += tred[i * MM * 32 + threadIdx.x];
    }
    sums[threadIdx.x] = s;
    if constexpr (LORA) ts[(threadIdx.x >> 5) * kLd + (threadIdx.x & 31)] = t;
  }
  __syncthreads();
  epilogue<T, LORA>(sums, 1, 0, 32, ts, MM, kStreamCols, 0, n0, y, b, M, N, R, scale);
}

// Streaming path, MT 16-row tiles of x (M <= 16 * MT).
template <typename T, int MT, bool LORA>
__device__ __forceinline__ void stream_path(const T* x, const T* w, const T* a, const T* b, T* y, int M, int K,
                                            int N, int R, float scale, float* smem) {
  constexpr int U = kUnroll<MT, LORA>;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int n0 = blockIdx.x * kStreamCols;
  if (n0 >= N) return;
  const int col = n0 + 4 * g;  // this lane's 4 columns of w (and of a: 4 * g)
  const bool col_ok = col < N, a_ok = 4 * g < R;
  const bool a_vec = R % 4 == 0 && (reinterpret_cast<uintptr_t>(a) & 7) == 0;
  const uint2 zero = make_uint2(0, 0);
  const uint16_t* a16 = reinterpret_cast<const uint16_t*>(a);

  float acc[MT][4][4] = {};
  float tacc[LORA ? MT : 1][4][4] = {};
  const int steps = (K + 15) / 16;
  for (int s0 = warp; s0 < steps; s0 += 8 * U) {
    uint2 wr[U][4], xr[U][MT][2], ar[U][4];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k = (s0 + 8 * u) * 16 + 4 * c;  // rows k..k+3; K % 8 == 0 makes them all valid or none
      const bool k_ok = k < K;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const bool ok = k_ok && col_ok;
        const uint2 v = __ldcs(reinterpret_cast<const uint2*>(ok ? w + w_at(k + i, col, K) : w));
        wr[u][i] = ok ? v : zero;
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int m = mt * 16 + h * 8 + g;
          const bool ok = k_ok && m < M;
          const uint2 v = __ldg(reinterpret_cast<const uint2*>(ok ? x + m * K + k : x));
          xr[u][mt][h] = ok ? v : zero;
        }
    }
    // LoRA: a[k+i][4g .. 4g+3], zero beyond R. 8-byte loads join the batch above; the
    // element-wise fallback (R % 4 != 0 or a misaligned) loads per step, to spare registers.
    const auto load_a = [&](int u) {
      const int k = (s0 + 8 * u) * 16 + 4 * c;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int off = (k + i) * R + 4 * g;
        if (a_vec) {
          const bool ok = k < K && a_ok;
          const uint2 v = __ldg(reinterpret_cast<const uint2*>(ok ? a + off : a));
          ar[u][i] = ok ? v : zero;
        } else {
          uint32_t e[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) e[q] = k < K && 4 * g + q < R ? __ldg(a16 + off + q) : 0u;
          ar[u][i] = make_uint2(e[0] | e[1] << 16, e[2] | e[3] << 16);
        }
      }
    };
    if constexpr (LORA) {
      if (a_vec) {
#pragma unroll
        for (int u = 0; u < U; ++u) load_a(u);
      }
    }
    // Step u's x tiles times one lane's 4 rows of B (w's or a's), its 4 n-tiles.
    const auto multiply = [&](int u, const uint2 (&rows)[4], float (&out)[MT][4][4]) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t b0 = pair(rows[0], rows[1], j), b1 = pair(rows[2], rows[3], j);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const uint32_t af[4] = {xr[u][mt][0].x, xr[u][mt][1].x, xr[u][mt][0].y, xr[u][mt][1].y};
          mma<T>(out[mt][j], af, b0, b1);
        }
      }
    };
#pragma unroll
    for (int u = 0; u < U; ++u) {
      multiply(u, wr[u], acc);
      if constexpr (LORA) {
        if (!a_vec) load_a(u);
        multiply(u, ar[u], tacc);
      }
    }
  }

  // Sum the 8 warps: warps 4-7 store into four slots, warps 0-3 add theirs.
  // Fragment (mt, j)[q] is row mt*16 + g + 8*(q/2), column 8c + 4*(q%2) + j.
  constexpr int kSlot = kStreamMaxM * kLd;
  float* slot = smem + (warp & 3) * kSlot;
  auto reduce = [&](const float (&v)[MT][4][4]) {
#pragma unroll
    for (int pass = 0; pass < 2; ++pass) {
      if ((warp >> 2) != pass) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              float* p = slot + (mt * 16 + g + 8 * (q >> 1)) * kLd + 8 * c + 4 * (q & 1) + j;
              *p = pass ? *p + v[mt][j][q] : v[mt][j][q];
            }
      }
      __syncthreads();
    }
  };
  float* ts = smem + 4 * kSlot;
  if constexpr (LORA) {
    reduce(tacc);
    for (int i = threadIdx.x; i < MT * 16 * kLd; i += kThreads)
      ts[i] = smem[i] + smem[kSlot + i] + smem[2 * kSlot + i] + smem[3 * kSlot + i];
    __syncthreads();
  }
  reduce(acc);
  epilogue<T, LORA>(smem, 4, kSlot, kLd, ts, MT * 16, kStreamCols, 0, n0, y, b, M, N, R, scale);
}

// Tiled path (M > 64).
template <typename T, bool LORA>
__device__ __forceinline__ void tile_path(const T* x, const T* w, const T* a, const T* b, T* y, int M, int K,
                                          int N, int R, float scale, float* smem) {
  constexpr int S = LORA ? 3 : 4;  // pipeline stages
  constexpr int XLD = kTileK + 8, WLD = kTileN + 8, ALD = kMaxRank + 8;  // padded: conflict-free ldmatrix
  constexpr int XS = kTileM * XLD, WS = kTileK * WLD, AS = LORA ? kTileK * ALD : 0, STAGE = XS + WS + AS;
  constexpr int OLD = kTileN + 1;  // f32 output tile row stride
  const int m0 = blockIdx.y * kTileM, n0 = blockIdx.x * kTileN;
  if (m0 >= M || n0 >= N) return;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
  const int kh = warp >> 2, wm = (warp >> 1) & 1, wn = warp & 1;
  const int ktiles = (K + kTileK - 1) / kTileK;
  uint16_t* sm = reinterpret_cast<uint16_t*>(smem);
  const uint16_t* a16 = reinterpret_cast<const uint16_t*>(a);

  const int xrow = tid >> 2, xcol = (tid & 3) * 8, wrow = tid & 31, wcol = (tid >> 5) * 8;  // a warp: one strip
  auto load_tile = [&](int kt) {
    const int k0 = kt * kTileK;
    uint16_t* st = sm + (kt % S) * STAGE;
    const bool xok = m0 + xrow < M && k0 + xcol < K;
    cp_async16(st + xrow * XLD + xcol, xok ? x + (m0 + xrow) * K + k0 + xcol : x, xok);
    const bool wok = k0 + wrow < K && n0 + wcol < N;
    cp_async16(st + XS + wrow * WLD + wcol, wok ? w + w_at(k0 + wrow, n0 + wcol, K) : w, wok);
  };
  // a[k0 + e/32][e%32] for e = tid + 256*i, zero beyond K and R.
  auto load_a = [&](int kt, uint16_t (&v)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int e = tid + kThreads * i, k = kt * kTileK + (e >> 5), r = e & 31;
      v[i] = k < K && r < R ? __ldg(a16 + k * R + r) : uint16_t(0);
    }
  };
  auto store_a = [&](int kt, const uint16_t (&v)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int e = tid + kThreads * i;
      sm[(kt % S) * STAGE + XS + WS + (e >> 5) * ALD + (e & 31)] = v[i];
    }
  };

#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < ktiles) {
      load_tile(s);
      if constexpr (LORA) {
        uint16_t v[4];
        load_a(s, v);
        store_a(s, v);
      }
    }
    cp_async_commit();
  }

  float acc[2][4][4] = {};
  float tacc[LORA ? 2 : 1][2][4] = {};
  for (int kt = 0; kt < ktiles; ++kt) {
    cp_async_wait<S - 2>();
    __syncthreads();  // tile kt visible; slot (kt - 1) % S free for tile kt + S - 1
    const int pf = kt + S - 1;
    uint16_t av[4];
    if (pf < ktiles) {
      load_tile(pf);
      if constexpr (LORA) load_a(pf, av);
    }
    cp_async_commit();

    const uint16_t* st = sm + (kt % S) * STAGE;
    // ldmatrix row addresses: lanes 0-15 rows 0-15 of the first 8 columns, lanes 16-31 of the next 8.
    const int k16 = kh * 16, lr = lane & 15, lc = (lane >> 4) * 8;
    uint32_t af[2][4], bf[2][4];
#pragma unroll
    for (int i = 0; i < 2; ++i) ldsm_x4(af[i], st + (wm * 32 + i * 16 + lr) * XLD + k16 + lc);
#pragma unroll
    for (int i = 0; i < 2; ++i) ldsm_x4_trans(bf[i], st + XS + (k16 + lr) * WLD + wn * 32 + i * 16 + lc);
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) mma<T>(acc[i][j], af[i], bf[j >> 1][2 * (j & 1)], bf[j >> 1][2 * (j & 1) + 1]);
    if constexpr (LORA) {
      if (wn * 16 < R) {
        uint32_t tb[4];
        ldsm_x4_trans(tb, st + XS + WS + (k16 + lr) * ALD + wn * 16 + lc);
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int j = 0; j < 2; ++j) mma<T>(tacc[i][j], af[i], tb[2 * j], tb[2 * j + 1]);
      }
      if (pf < ktiles) store_a(pf, av);
    }
  }
  cp_async_wait<0>();
  __syncthreads();

  // Add the two k-halves: fragment (i, j)[q] is row wm*32 + 16i + g + 8*(q/2), column 8j + 2c + q%2.
  float* out = smem;
  float* ts = smem + kTileM * OLD;
#pragma unroll
  for (int pass = 0; pass < 2; ++pass) {
    if (kh != pass) {
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int row = wm * 32 + i * 16 + g + 8 * (q >> 1), cq = 2 * c + (q & 1);
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            float* p = out + row * OLD + wn * 32 + 8 * j + cq;
            *p = pass ? *p + acc[i][j][q] : acc[i][j][q];
          }
          if constexpr (LORA) {
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              float* p = ts + row * kLd + wn * 16 + 8 * j + cq;
              *p = pass ? *p + tacc[i][j][q] : tacc[i][j][q];
            }
          }
        }
    }
    __syncthreads();
  }
  epilogue<T, LORA>(out, 1, 0, OLD, ts, kTileM, kTileN, m0, n0, y, b, M, N, R, scale);
}

// What stageml_gemm_expand adds to a product: t[m] @ table[ids[m]] (f32), t [M, R] in f32,
// table [S, R, N]; a row at or past `rows` (the ids given) takes slot 0. No table: nothing.
// gemm_lora's t is either its rows from `first` on in shared memory, or (chunks > 0) the
// shrink's partial sums [chunks, M, R] in ws, added here, times `scale`.
template <typename T> struct Expand {
  const float* t = nullptr;
  const int64_t* ids = nullptr;
  const T* table = nullptr;
  int R = 0, rows = 0;
  int first = 0, chunks = 0, M = 0;
  float scale = 1.f;
  const int* slots = nullptr;  // or each row's slot from row slot0 on (shared memory)
  int slot0 = 0;
  __device__ __forceinline__ float partial_sum(int m, int r) const {
    float s = 0.f;
    for (int c = 0; c < chunks; ++c) s += __ldcg(t + (static_cast<size_t>(c) * M + m) * R + r);
    return scale * s;
  }
  // v[i] += (t[m] @ table[slot of m])[n + i], i < W.
  template <int W> __device__ __forceinline__ void add(int m, int n, int N, float (&v)[W]) const {
    const T* b = table + static_cast<size_t>(slots ? slots[m - slot0] : m < rows ? ids[m] : 0) * R * N + n;
    const float* tm = t + static_cast<size_t>(m - first) * R;
    if constexpr (W == 4) {
      if ((reinterpret_cast<uintptr_t>(b) & 7) == 0) {  // 4 columns of a rank's row: one 8-byte load
#pragma unroll 8
        for (int r = 0; r < R; ++r) {
          const uint2 q = *reinterpret_cast<const uint2*>(b + static_cast<size_t>(r) * N);
          const uint32_t u[2] = {q.x, q.y};
          const float tr = chunks ? partial_sum(m, r) : tm[r];
          float f[4];
          unpack<T>(u, f);
#pragma unroll
          for (int i = 0; i < 4; ++i) v[i] = fmaf(tr, f[i], v[i]);
        }
        return;
      }
    }
#pragma unroll 4
    for (int r = 0; r < R; ++r) {
      const float tr = chunks ? partial_sum(m, r) : tm[r];
#pragma unroll
      for (int i = 0; i < W; ++i) v[i] = fmaf(tr, to_f32(b[static_cast<size_t>(r) * N + i]), v[i]);
    }
  }
};

// Any alignment, any grid: blocks stride over (row, 256 columns) units.
template <typename T, bool LORA>
__device__ __forceinline__ void scalar_path(const T* x, const T* w, const T* a, const T* b, T* y, int M, int K,
                                            int N, int R, float scale, const Expand<T>& ex, float* smem) {
  const int tid = threadIdx.x, tiles = (N + kThreads - 1) / kThreads;
  const int block = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  for (int u = block; u < M * tiles; u += gridDim.x * gridDim.y * gridDim.z) {
    const int m = u / tiles, n = (u % tiles) * kThreads + tid;
    const T* xm = x + m * K;
    if constexpr (LORA) {  // t[m, :] by 8 k-lanes x 32 ranks
      const int r = tid & 31;
      float p = 0.f;
      if (r < R)
        for (int k = tid >> 5; k < K; k += 8) p = fmaf(to_f32(xm[k]), to_f32(a[k * R + r]), p);
      smem[tid] = p;
      __syncthreads();
      if (tid < kMaxRank) {
        float t = 0.f;
        for (int i = 0; i < 8; ++i) t += smem[i * 32 + tid];
        smem[kThreads + tid] = t;
      }
      __syncthreads();
    }
    if (n < N) {
      float v = 0.f;
      for (int k = 0; k < K; ++k) v = fmaf(to_f32(xm[k]), to_f32(w[w_at(k, n, K)]), v);
      if constexpr (LORA) {
        float l = 0.f;
        for (int r = 0; r < R; ++r) l = fmaf(smem[kThreads + r], to_f32(b[r * N + n]), l);
        v = fmaf(scale, l, v);
      }
      float l[1] = {0.f};
      if (ex.table) ex.add(m, n, N, l);
      y[m * N + n] = from_f32<T>(v + l[0]);
    }
    if constexpr (LORA) __syncthreads();
  }
}

// Shared memory: the larger of the streaming reduction (4 slots [+ t]) and the tiled pipeline.
template <bool LORA> constexpr int kStreamSmem = (LORA ? 5 : 4) * kStreamMaxM * kLd;
template <bool LORA> constexpr int kTileSmem =
    (LORA ? 3 : 4) * (kTileM * (kTileK + 8) + kTileK * (kTileN + 8) + (LORA ? kTileK * (kMaxRank + 8) : 0)) / 2;
template <bool LORA>
constexpr int kSmemFloats = kStreamSmem<LORA> > kTileSmem<LORA> ? kStreamSmem<LORA> : kTileSmem<LORA>;

template <typename T, bool LORA>
__device__ __forceinline__ void run(const T* x, const T* w, const T* a, const T* b, T* y, int M, int K, int N,
                                    int R, float scale) {
  __shared__ __align__(16) float smem[kSmemFloats<LORA>];
  if (M <= 0) return;
  if ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w)) & 15)
    scalar_path<T, LORA>(x, w, a, b, y, M, K, N, R, scale, Expand<T>{}, smem);
  else if (M <= 4 && (!LORA || (R % 8 == 0 && (reinterpret_cast<uintptr_t>(a) & 15) == 0)))
    M == 1 ? gemv_path<T, 1, LORA>(x, w, a, b, y, M, K, N, R, scale, smem)
           : gemv_path<T, 4, LORA>(x, w, a, b, y, M, K, N, R, scale, smem);
  else if (M <= 16)
    stream_path<T, 1, LORA>(x, w, a, b, y, M, K, N, R, scale, smem);
  else if (M <= 32)
    stream_path<T, 2, LORA>(x, w, a, b, y, M, K, N, R, scale, smem);
  else if (M <= kStreamMaxM)
    stream_path<T, 4, LORA>(x, w, a, b, y, M, K, N, R, scale, smem);
  else
    tile_path<T, LORA>(x, w, a, b, y, M, K, N, R, scale, smem);
}

constexpr int kBgmvSplit = 8;       // blocks per cluster (k-chunks)
constexpr int kBgmvTiledFrom = 64;  // more rows than this: kBgmvTile rows per block
constexpr int kBgmvTile = 16;
__device__ __forceinline__ int bgmv_tile_rows(int B) { return B > kBgmvTiledFrom ? kBgmvTile : 1; }

// Two elements as one 32-bit mma operand register, `lo` in the low half.
template <typename T> __device__ __forceinline__ uint32_t pack2(T lo, T hi) {
  return static_cast<uint32_t>(reinterpret_cast<const uint16_t&>(lo)) |
         static_cast<uint32_t>(reinterpret_cast<const uint16_t&>(hi)) << 16;
}

// One row's strip of `width` <= 32 columns over K k-rows, into out[0 .. width) (shared):
// 32 columns x 8 k-lanes, the k-lanes summed in shared memory.
template <typename T>
__device__ __forceinline__ void bgmv_scalar(const T* xb, const T* t, float* out, int K, int N, int width) {
  __shared__ float part[8][32];
  const int col = threadIdx.x & 31, lane_k = threadIdx.x >> 5;
  float acc = 0.f;
  if (col < width) {
#pragma unroll 8
    for (int k = lane_k; k < K; k += 8) acc = fmaf(to_f32(xb[k]), to_f32(t[static_cast<size_t>(k) * N + col]), acc);
  }
  part[lane_k][col] = acc;
  __syncthreads();
  if (lane_k == 0 && col < width) {
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) sum += part[i][col];
    out[col] = sum;
  }
}

// One row's strip of `width` (8 or 16) columns, N % 8 == 0, t 16-byte aligned:
// each thread reads 16-byte vectors (8 columns) of k-rows lane, lane + L, ...
// (L = 256 / (width / 8) k-lanes), four loads in flight, and keeps 8 column sums;
// the k-lanes are summed by shuffles within each warp, then the 8 warps' sums in
// shared memory. (The scalar path keeps 8 k-rows of 2-byte loads in flight per
// block and is latency-bound on such a strip.)
template <typename T>
__device__ __forceinline__ void bgmv_vector(const T* xb, const T* t, float* out, int K, int N, int width) {
  __shared__ float part[kThreads / 32][16];
  const int groups = width / 8, lanes = kThreads / groups;
  const int group = threadIdx.x % groups, lane = threadIdx.x / groups;
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  const T* tg = t + 8 * group;
  int k = lane;
  for (; k + 3 * lanes < K; k += 4 * lanes) {
    uint4 v[4];
    float xv[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      v[u] = __ldg(reinterpret_cast<const uint4*>(tg + static_cast<size_t>(k + u * lanes) * N));
      xv[u] = to_f32(xb[k + u * lanes]);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      float f[8];
      unpack8<T>(v[u], f);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] = fmaf(xv[u], f[j], acc[j]);
    }
  }
  for (; k < K; k += lanes) {
    float f[8];
    unpack8<T>(__ldg(reinterpret_cast<const uint4*>(tg + static_cast<size_t>(k) * N)), f);
    const float xv = to_f32(xb[k]);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] = fmaf(xv, f[j], acc[j]);
  }
  for (int offset = groups; offset < 32; offset *= 2)  // the warp's lanes of this thread's group
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], offset);
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 < groups)
#pragma unroll
    for (int j = 0; j < 8; ++j) part[warp][8 * group + j] = acc[j];
  __syncthreads();
  if (threadIdx.x < width) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) sum += part[w][threadIdx.x];
    out[threadIdx.x] = sum;
  }
}

constexpr int kBgmvMmaSlots = 2;
constexpr int kBgmvLoads = 16;  // 16-byte factor loads a lane has in flight (the streaming path)

// bgmv_tile's tensor-core path for NT column tiles of 8 (width <= 8 NT).
template <typename T, int NT>
__device__ __forceinline__ void bgmv_mma(const T* x0, const T* t0, float (*out)[32], float (*part)[kBgmvTile][kLd],
                                         const int64_t* pass_slot, const uint32_t* pass_rows, int passes, int K,
                                         int N, int width, int kn) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, q = lane & 3, steps = kn / 16, items = passes * steps;
  const T* x_lo = x0 + static_cast<size_t>(g) * K + 2 * q;  // the fragment's rows g and g + 8
  const T* x_hi = x_lo + static_cast<size_t>(8) * K;
  constexpr int kBgmvItems = 8 / NT;  // (slot, k16 step) items a warp loads at once (a prefill tile's 4 at rank 16)
  float d[NT][4] = {};
  for (int i0 = warp; i0 < items; i0 += kBgmvItems * (kThreads / 32)) {  // kBgmvItems items' loads in flight
    uint32_t a[kBgmvItems][4], b[kBgmvItems][NT][2];
#pragma unroll
    for (int u = 0; u < kBgmvItems; ++u) {
      const int i = i0 + u * (kThreads / 32), p = i < items ? i / steps : 0, k = (i - p * steps) * 16;
      const uint32_t mask = i < items ? pass_rows[p] : 0u;
      const bool lo = mask >> g & 1u, hi = mask >> (g + 8) & 1u;
      a[u][0] = lo ? *reinterpret_cast<const uint32_t*>(x_lo + k) : 0u;
      a[u][1] = hi ? *reinterpret_cast<const uint32_t*>(x_hi + k) : 0u;
      a[u][2] = lo ? *reinterpret_cast<const uint32_t*>(x_lo + k + 8) : 0u;
      a[u][3] = hi ? *reinterpret_cast<const uint32_t*>(x_hi + k + 8) : 0u;
      const T* tk = t0 + (static_cast<size_t>(pass_slot[p]) * K + k + 2 * q) * N + g;  // rows k + 2q (+1, +8, +9)
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const bool col = i < items && 8 * j + g < width;
        const T* c = tk + 8 * j;
        b[u][j][0] = col ? pack2(c[0], c[N]) : 0u;
        b[u][j][1] = col ? pack2(c[static_cast<size_t>(8) * N], c[static_cast<size_t>(9) * N]) : 0u;
      }
    }
#pragma unroll
    for (int u = 0; u < kBgmvItems; ++u)
#pragma unroll
      for (int j = 0; j < NT; ++j)
        if (8 * j < width) mma<T>(d[j], a[u], b[u][j][0], b[u][j][1]);
  }
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    part[warp][g][8 * j + 2 * q] = d[j][0];
    part[warp][g][8 * j + 2 * q + 1] = d[j][1];
    part[warp][g + 8][8 * j + 2 * q] = d[j][2];
    part[warp][g + 8][8 * j + 2 * q + 1] = d[j][3];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < kBgmvTile * 8 * NT; e += kThreads) {
    const int r = e / (8 * NT), c = e % (8 * NT);
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) sum += part[w][r][c];
    out[r][c] = sum;
  }
}

// A tile's rows (<= 16, x0 row-major with stride K, every row 4-byte aligned) over one k-chunk
// of kn (a multiple of 16), each row by its own slot's table (t0: table at the chunk's first
// k-row and the strip's first column; slot s at t0 + s*K*N), into out[row][col] (shared, width
// <= 32 columns). Warp 0 finds the rows' distinct slots (match.any). Up to kBgmvMmaSlots of them
// (a prefill's tile, or one at a boundary between prompts): each (slot, k16 step) is one
// mma.m16n8k16 of the 16 rows, those of other slots zeroed, by column tiles of 8, the 8 warps
// taking the items in turn and their partial tiles summed in a fixed order; a slot's table is read
// once for all its rows. More (a decode batch's tile, a slot per row): each warp streams its rows'
// factors in 16-byte vectors (width 8, 16 or 32 and 16-byte rows), else by mma as above.
template <typename T>
__device__ __forceinline__ void bgmv_tile(const T* x0, const int64_t* ids, const T* t0, float (*out)[32], int rows,
                                          int K, int N, int width, int kn) {
  __shared__ float part[kThreads / 32][kBgmvTile][kLd];
  __shared__ int64_t row_slot[kBgmvTile], pass_slot[kBgmvTile];
  __shared__ uint32_t pass_rows[kBgmvTile];
  __shared__ int passes;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (warp == 0) {
    const bool row = lane < rows;
    const unsigned long long slot = row ? static_cast<unsigned long long>(ids[lane]) : ~0ull;
    const uint32_t same = __match_any_sync(0xffffffffu, slot), below = (1u << lane) - 1u;
    const bool first = row && (same & below) == 0u;  // the slot's first row
    const uint32_t firsts = __ballot_sync(0xffffffffu, first);
    if (row) row_slot[lane] = static_cast<int64_t>(slot);
    if (first) {
      pass_slot[__popc(firsts & below)] = static_cast<int64_t>(slot);
      pass_rows[__popc(firsts & below)] = same;
    }
    if (lane == 0) passes = __popc(firsts);
  }
  __syncthreads();
  const int groups = width / 8;
  if (passes > kBgmvMmaSlots && width % 8 == 0 && (groups & (groups - 1)) == 0 && N % 8 == 0 &&
      (reinterpret_cast<uintptr_t>(t0) & 15) == 0) {
    const int lanes = 32 / groups, v = lane % groups;  // lane: 8 columns (v) of k-rows lane / groups + lanes i
    for (int r = warp; r < rows; r += kThreads / 32) {
      const T* t = t0 + static_cast<size_t>(row_slot[r]) * K * N + 8 * v;
      const T* xr = x0 + static_cast<size_t>(r) * K;
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      int k = lane / groups;
      for (; k + (kBgmvLoads - 1) * lanes < kn; k += kBgmvLoads * lanes) {  // kBgmvLoads loads in flight
        uint4 tv[kBgmvLoads];
        float xv[kBgmvLoads];
#pragma unroll
        for (int u = 0; u < kBgmvLoads; ++u) {
          tv[u] = __ldg(reinterpret_cast<const uint4*>(t + static_cast<size_t>(k + u * lanes) * N));
          xv[u] = to_f32(xr[k + u * lanes]);
        }
#pragma unroll
        for (int u = 0; u < kBgmvLoads; ++u) {
          float f[8];
          unpack8<T>(tv[u], f);
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[j] = fmaf(xv[u], f[j], acc[j]);
        }
      }
      for (; k < kn; k += lanes) {
        float f[8];
        unpack8<T>(__ldg(reinterpret_cast<const uint4*>(t + static_cast<size_t>(k) * N)), f);
        const float xv = to_f32(xr[k]);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[j] = fmaf(xv, f[j], acc[j]);
      }
      for (int offset = groups; offset < 32; offset *= 2)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], offset);
      if (lane < groups)
#pragma unroll
        for (int j = 0; j < 8; ++j) out[r][8 * lane + j] = acc[j];
    }
    return;
  }
  if (width <= 16)
    bgmv_mma<T, 2>(x0, t0, out, part, pass_slot, pass_rows, passes, K, N, width, kn);
  else
    bgmv_mma<T, 4>(x0, t0, out, part, pass_slot, pass_rows, passes, K, N, width, kn);
}

// Gathered rows: y[b, n] = sum_k x[b, k] * table[ids[b], k, n] in f32; a cluster of kBgmvSplit
// blocks (column strip, rows), block z of it over the z-th of kBgmvSplit k-chunks, the chunks'
// sums added in a fixed order, block z adding those of rows z, z + kBgmvSplit, ... (a LoRA shrink,
// N = rank and K = in_features, would otherwise stream its whole factor through one SM). Up to
// kBgmvTiledFrom rows a block takes one row; beyond, a tile of kBgmvTile rows (bgmv_tile) where K
// is a multiple of 128 (whole k16 steps in every chunk) and x is 4-byte aligned, else row by row.
// One row: a narrow strip with a long k loop, in whole 16-byte vectors, takes the vector path;
// any other the scalar one.
template <typename T>
__device__ __forceinline__ void bgmv(const T* x, const int64_t* ids, const T* table, float* y, int B, int K,
                                     int N) {
  __shared__ float out[kBgmvTile][32];
  const int tile = bgmv_tile_rows(B), b0 = blockIdx.y * tile, n0 = blockIdx.x * 32, width = min(32, N - n0);
  if (b0 >= B) return;  // the whole cluster: it shares the rows
  const int rows = min(tile, B - b0);
  const uint32_t rank = cluster_rank();
  const int chunk = (K + kBgmvSplit - 1) / kBgmvSplit, k0 = min(K, static_cast<int>(rank) * chunk);
  const int kn = min(K - k0, chunk);
  const T* xb = x + static_cast<size_t>(b0) * K + k0;
  if (tile > 1 && K % (16 * kBgmvSplit) == 0 && (reinterpret_cast<uintptr_t>(x) & 3) == 0) {
    bgmv_tile(xb, ids + b0, table + static_cast<size_t>(k0) * N + n0, out, rows, K, N, width, kn);
  } else {
    const bool vector = width <= 16 && N % 8 == 0 && K >= 512 && (reinterpret_cast<uintptr_t>(table) & 15) == 0;
    for (int r = 0; r < rows; ++r) {
      const T* t = table + (static_cast<size_t>(ids[b0 + r]) * K + k0) * N + n0;
      if (vector)
        bgmv_vector(xb + static_cast<size_t>(r) * K, t, out[r], kn, N, width);
      else
        bgmv_scalar(xb + static_cast<size_t>(r) * K, t, out[r], kn, N, width);
      __syncthreads();  // the row's partial sums are read before the next row's are written
    }
  }
  cluster_sync();  // every chunk's sums are in
  constexpr int kRowsPerBlock = kBgmvTile / kBgmvSplit;
  if (threadIdx.x < kRowsPerBlock * 32) {
    const int r = static_cast<int>(rank) + kBgmvSplit * (threadIdx.x / 32), c = threadIdx.x % 32;
    if (r < rows && c < width) {
      float part[kBgmvSplit];
#pragma unroll
      for (uint32_t z = 0; z < kBgmvSplit; ++z) part[z] = ld_cluster1(&out[r][c], z);
      float sum = 0.f;
#pragma unroll
      for (int z = 0; z < kBgmvSplit; ++z) sum += part[z];
      y[static_cast<size_t>(b0 + r) * N + n0 + c] = sum;
    }
  }
  cluster_arrive_relaxed();  // no block leaves while others read its shared memory
  cluster_wait();
}

// ---- wgmma path (stageml_gemm_wgmma) ------------------------------------------

constexpr int kWgCols = 64;        // columns of w (the wgmma M side) per block
constexpr int kWgPair = 2;         // blocks per cluster (along x)
constexpr int kWgSplitMaxM = 128;  // M at most this: a pair splits K of 64 columns
constexpr int kWgWideMaxM = 256;   // M at most this (beyond kWgSplitMaxM): a pair splits K of 128 columns
                                   // over tiles of 128 rows; else it is 2 column tiles sharing x
// Rows of x per block past kWgSplitMaxM rows: more rows take more blocks along z.
__device__ __forceinline__ int wg_tile_rows(int M) { return M <= kWgWideMaxM ? 128 : 256; }
constexpr int kWgRing = 196608;    // bytes of shared memory for the pipeline stages
constexpr int kWgSmem = kWgRing + 1024;  // and the stages' mbarriers (hopper.mlir: workgroup_local_memory)
constexpr int kWgRedLd = kWgCols + 4;    // f32 row stride of the partial tiles (conflict-free)
constexpr int kWgTileBytes = kTileW * kTileW * 2;  // one 64 x 64 tile of w
constexpr int kWgThreads = kThreads + 32;  // 2 warpgroups that compute and a producer warp
constexpr int kLoraThreads = kWgThreads + 32;  // gemm_lora: and a warp for the shrink

// k per pipeline stage (two tiles of w while x is small, else one) and stages, for blocks of NT
// rows and CB columns: at most 8, or kWgShrinkStages in gemm_lora (SHRINK) up to 64 rows. There the
// shrink's copies wait behind every stage requested before them: with 4 stages in flight instead
// of 8 (6 at 33-64 rows), gemm_lora took 0.3-3.3 µs less at 1-48 rows and 0.1-0.3 less at 49-64
// (measured on an H100, 4096², r = 16, with the shrink warp alone up to 48 rows).
constexpr int kWgShrinkStages = 4;
template <int NT> constexpr int kWgK = NT <= 64 ? 2 * kTileW : kTileW;
template <int NT, int CB> constexpr int kWgStageBytes = kWgK<NT> * (CB + NT) * 2;
template <int NT, bool SHRINK> constexpr int kWgStageCap = SHRINK && NT <= 64 ? kWgShrinkStages : 8;
template <int NT, int CB, bool SHRINK>
constexpr int kWgStages = kWgRing / kWgStageBytes<NT, CB> < kWgStageCap<NT, SHRINK>
                              ? kWgRing / kWgStageBytes<NT, CB> : kWgStageCap<NT, SHRINK>;

// A shared-memory matrix descriptor, no swizzle: 8x8 core matrices (8 rows of 16 bytes,
// contiguous), `sbo` bytes apart along M (w's strips) or N (x's rows), 128 bytes along k.
__device__ __forceinline__ uint64_t wg_desc(const void* p, uint32_t sbo) {
  return static_cast<uint64_t>((smem_addr(p) & 0x3FFFF) >> 4) | static_cast<uint64_t>(128 >> 4) << 16 |
         static_cast<uint64_t>(sbo >> 4) << 32;
}
// The same for a K-major operand in the 128-byte swizzle: rows of 128 bytes (64 elements of k),
// 8-row atoms of 1024 bytes (1024-aligned) in which row r's 16-byte chunk c sits at c ^ (r % 8).
// A k16 step at k-offset 16j within the row starts 32j bytes in.
__device__ __forceinline__ uint64_t wg_desc_sw128(const void* p) {
  return static_cast<uint64_t>((smem_addr(p) & 0x3FFFF) >> 4) | static_cast<uint64_t>(1) << 16 |
         static_cast<uint64_t>(1024 >> 4) << 32 | static_cast<uint64_t>(1) << 62;
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done)
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
}
// One arrival on block `rank`'s mbarrier at the address `bar` has in this block (its own or its
// cluster peer's).
__device__ __forceinline__ void mbar_arrive(uint64_t* bar, uint32_t rank) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(cluster_addr(bar, rank)) : "memory");
}
// TMA bulk copy global -> shared, `bytes` (a multiple of 16) completing on `bar`.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
}
// x's tensor maps: one 128-byte slot per SM in global memory. A wgmma block needs more than half
// of an SM's shared memory (228 KiB on sm_90, 1 KiB of it reserved per block), so at most one
// runs on an SM at a time and owns its SM's slot.
static_assert(2 * (kWgSmem + 1024) > 228 * 1024, "one wgmma block per SM");
constexpr int kMaxSms = 256;
__device__ __align__(128) uint8_t wg_tensor_maps[kMaxSms][128];

// The tensor map of x [M, K] (T, row-major), boxes of 64 k x `rows` rows in the 128-byte
// swizzle, zeros past M, built in `staging` (128 bytes of shared memory, 128-aligned) by the
// calling warp (all of it) and published to this SM's slot; returns the slot. The thread that
// uses it must fence first (tensor_map_acquire).
template <typename T>
__device__ __forceinline__ const void* x_tensor_map(const T* x, int M, int K, int rows, uint8_t* staging) {
  uint32_t sm, sms;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  asm volatile("mov.u32 %0, %%nsmid;" : "=r"(sms));
  if (sms > kMaxSms) __trap();
  uint8_t* slot = wg_tensor_maps[sm];
  const int lane = threadIdx.x & 31;
  reinterpret_cast<uint32_t*>(staging)[lane] = 0u;
  __syncwarp();
  if (lane == 0) {
    const uint32_t t = smem_addr(staging);
    asm volatile("tensormap.replace.tile.global_address.shared::cta.b1024.b64 [%0], %1;" ::"r"(t), "l"(x) : "memory");
    asm volatile("tensormap.replace.tile.rank.shared::cta.b1024.b32 [%0], 1;" ::"r"(t) : "memory");
    asm volatile("tensormap.replace.tile.box_dim.shared::cta.b1024.b32 [%0], 0, 64;" ::"r"(t) : "memory");
    asm volatile("tensormap.replace.tile.box_dim.shared::cta.b1024.b32 [%0], 1, %1;" ::"r"(t), "r"(rows) : "memory");
    asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], 0, %1;" ::"r"(t), "r"(K) : "memory");
    asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], 1, %1;" ::"r"(t), "r"(M) : "memory");
    asm volatile("tensormap.replace.tile.global_stride.shared::cta.b1024.b64 [%0], 0, %1;"
                 ::"r"(t), "l"(static_cast<uint64_t>(K) * 2) : "memory");
    asm volatile("tensormap.replace.tile.element_stride.shared::cta.b1024.b32 [%0], 0, 1;" ::"r"(t) : "memory");
    asm volatile("tensormap.replace.tile.element_stride.shared::cta.b1024.b32 [%0], 1, 1;" ::"r"(t) : "memory");
    if constexpr (IsBf16<T>::value)
      asm volatile("tensormap.replace.tile.elemtype.shared::cta.b1024.b32 [%0], 10;" ::"r"(t) : "memory");
    else
      asm volatile("tensormap.replace.tile.elemtype.shared::cta.b1024.b32 [%0], 6;" ::"r"(t) : "memory");
    asm volatile("tensormap.replace.tile.interleave_layout.shared::cta.b1024.b32 [%0], 0;" ::"r"(t) : "memory");
    asm volatile("tensormap.replace.tile.swizzle_mode.shared::cta.b1024.b32 [%0], 3;" ::"r"(t) : "memory");
    asm volatile("tensormap.replace.tile.fill_mode.shared::cta.b1024.b32 [%0], 0;" ::"r"(t) : "memory");
  }
  __syncwarp();
  asm volatile("tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned"
               " [%0], [%1], 128;"
               ::"l"(slot), "r"(smem_addr(staging)) : "memory");
  return slot;
}
__device__ __forceinline__ void tensor_map_acquire(const void* map) {
  asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" ::"l"(map) : "memory");
}
// TMA: the box of `map` at (c0 = k, c1 = row) into `dst` (1024-aligned), completing on `bar`.
__device__ __forceinline__ void tma_load_2d(void* dst, const void* map, int c0, int c1, uint64_t* bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%2, %3}], [%4];"
               ::"r"(smem_addr(dst)), "l"(map), "r"(c0), "r"(c1), "r"(smem_addr(bar)) : "memory");
}

// tma_load_2d into the same offset of both blocks of the cluster, each completing on its own
// mbarrier at the offset of `bar`.
__device__ __forceinline__ void tma_load_2d_pair(void* dst, const void* map, int c0, int c1, uint64_t* bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
               " [%0], [%1, {%2, %3}], [%4], %5;"
               ::"r"(smem_addr(dst)), "l"(map), "r"(c0), "r"(c1), "r"(smem_addr(bar)), "h"(uint16_t{3}) : "memory");
}

template <int N> __device__ __forceinline__ void wgmma_fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d (64 x NT, f32) += A (64 x 16, M-major: w) * B (16 x NT, K-major: x^T), both from shared memory.
// wgmma's accumulator registers d[i .. i + 4/16/64) as asm in-out operands.
#define STAGEML_D4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define STAGEML_D16(i) STAGEML_D4(i), STAGEML_D4(i + 4), STAGEML_D4(i + 8), STAGEML_D4(i + 12)
#define STAGEML_D64(i) STAGEML_D16(i), STAGEML_D16(i + 16), STAGEML_D16(i + 32), STAGEML_D16(i + 48)
template <int NT> struct Wgmma;
// Wgmma<NT>::run<T>(d, a, b): wgmma.mma_async m64nNTk16, f32 += T * T; `regs` names d's
// NT / 2 registers in the asm text, `pred` the operand after a and b (scale-d: accumulate).
#define STAGEML_WGMMA_TEXT(NT, TY, regs, pred)                                                      \
  "{\n.reg .pred p;\nsetp.ne.b32 p, " pred ", 0;\n"                                                \
  "wgmma.mma_async.sync.aligned.m64n" #NT "k16.f32." TY "." TY " {" regs ", p, 1, 1, 1, 0;\n}"
#define STAGEML_WGMMA_SHAPE(NT, regs, pred, ...)                                                    \
  template <> struct Wgmma<NT> {                                                                    \
    template <typename T> static __device__ __forceinline__ void run(float (&d)[NT / 2], uint64_t a, \
                                                                      uint64_t b) {                 \
      if constexpr (IsBf16<T>::value)                                                               \
        asm volatile(STAGEML_WGMMA_TEXT(NT, "bf16", regs, pred) : __VA_ARGS__ : "l"(a), "l"(b), "r"(1)); \
      else                                                                                          \
        asm volatile(STAGEML_WGMMA_TEXT(NT, "f16", regs, pred) : __VA_ARGS__ : "l"(a), "l"(b), "r"(1));  \
    }                                                                                               \
  };
STAGEML_WGMMA_SHAPE(16, "%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9", "%10", STAGEML_D4(0), STAGEML_D4(4))
STAGEML_WGMMA_SHAPE(32, "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17", "%18", STAGEML_D16(0))
STAGEML_WGMMA_SHAPE(64,
                    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
                    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33",
                    "%34", STAGEML_D16(0), STAGEML_D16(16))
STAGEML_WGMMA_SHAPE(128,
                    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
                    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
                    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
                    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65",
                    "%66", STAGEML_D64(0))
STAGEML_WGMMA_SHAPE(256,
                    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
                    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
                    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
                    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
                    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
                    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
                    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"
                    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129",
                    "%130", STAGEML_D64(0), STAGEML_D64(64))


// One stage's k16 steps by warpgroup wg (< 2) into d, from w's CB/64 strips of KD/64 tiles at ws
// and x's KD/64 swizzled blocks at xs; one wgmma group, committed. CB = 64: the warpgroups share
// the strip, wg taking steps [wg * KS/2, (wg+1) * KS/2); CB = 128: strip wg, every step.
template <typename T, int NT, int KD, int CB>
__device__ __forceinline__ void wgmma_stage(float (&d)[NT / 2], const uint8_t* ws, const uint8_t* xs, int wg) {
  constexpr int KS = KD / 16, STEPS = CB == kWgCols ? KS / 2 : KS;
  wgmma_fence_operands(d);
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
  for (int i = 0; i < STEPS; ++i) {
    const int j = CB == kWgCols ? wg * STEPS + i : i;  // k16 step: tile j / 4 of w, k-groups 2 (j % 4) and on
    const uint8_t* strip = CB == kWgCols ? ws : ws + wg * (KD / 64) * kWgTileBytes;
    Wgmma<NT>::template run<T>(d, wg_desc(strip + j / 4 * kWgTileBytes + j % 4 * 256, 1024),
                               wg_desc_sw128(xs + j / 4 * NT * 128 + j % 4 * 32));
  }
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

// ---- gemm_lora's shrink ---------------------------------------------------------

constexpr int kShrinkBytes = 16384;  // a shrink unit's buffer: its rows of a (at most kShrinkA bytes), then of x
constexpr int kShrinkA = 14336;
constexpr int kShrinkSideMaxM = 48;  // M at most this: the shrink warp alone, beside the main loop
constexpr int kSyncSlots = 256;
constexpr int kLoraSmem = kWgSmem + 2 * kShrinkBytes + 256;  // and the shrink's two buffers (hopper.mlir)
static_assert(kLoraSmem <= 232448, "an sm_90 block's shared memory");
// Per site slot: {next unit to claim, units done, blocks finished}; zero while no call runs.
__device__ unsigned int g_lora_sync[kSyncSlots][4];

__device__ __forceinline__ unsigned int ld_acquire(const unsigned int* p) {
  unsigned int v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// k-rows of a shrink unit for rank R <= 32: a multiple of 32, at most 1024, 2 R bytes each.
__device__ __forceinline__ int shrink_rows(int R) { return min(1024, kShrinkA / (2 * R) / 32 * 32); }

// v[i] (i < H) = the lane's half of v[0 .. 2H) (its upper half where lane & H) plus its partner's.
template <int H> __device__ __forceinline__ void halve(float (&v)[kMaxRank], int lane) {
  const bool upper = lane & H;
#pragma unroll
  for (int i = 0; i < H; ++i) {
    const float keep = upper ? v[i + H] : v[i], send = upper ? v[i] : v[i + H];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, H);
  }
}

// t = scale * x @ a[slot(m)] (f32), by one warp of each block into partial sums ws [chunks, M, R].
template <typename T> struct Shrink {
  const T* x;
  const int64_t* ids;
  const T* a;  // [S, K, R]
  float* ws;
  unsigned int* sync;
  int M, K, R, rows;
  float scale;

  __device__ __forceinline__ int chunks() const { return (K + shrink_rows(R) - 1) / shrink_rows(R); }
  __device__ __forceinline__ unsigned int units() const { return static_cast<unsigned int>(chunks() * M); }
  // Unit u: chunk c = u / M of row m = u % M, k-rows [k0, k0 + kn), its factor rows a[slot(m), k0 ..].
  __device__ __forceinline__ void locate(unsigned int u, int& c, int& m, int& k0, int& kn, const T*& ar) const {
    c = static_cast<int>(u) / M, m = static_cast<int>(u) % M;
    k0 = c * shrink_rows(R), kn = min(shrink_rows(R), K - k0);
    ar = a + (static_cast<size_t>(m < rows ? ids[m] : 0) * K + k0) * R;
  }

  // Unit u from its factor rows `ar` and x's `xr` (shared or global memory): lane l sums k-rows
  // l, l + 32, ... of the chunk, then lane r holds the warp's sum of rank r.
  __device__ __forceinline__ void unit(unsigned int u, const T* ar, const T* xr, int lane) const {
    int c, m, k0, kn;
    const T* unused;
    locate(u, c, m, k0, kn, unused);
    float acc[kMaxRank];
#pragma unroll
    for (int r = 0; r < kMaxRank; ++r) acc[r] = 0.f;
    if (R % 8 == 0 && (reinterpret_cast<uintptr_t>(ar) & 15) == 0) {
      switch (R / 8) {
        case 1: unit_rows<1>(xr, ar, kn, lane, acc); break;
        case 2: unit_rows<2>(xr, ar, kn, lane, acc); break;
        case 3: unit_rows<3>(xr, ar, kn, lane, acc); break;
        default: unit_rows<4>(xr, ar, kn, lane, acc); break;
      }
    } else {
      for (int k = lane; k < kn; k += 32) {
        const float xv = to_f32(xr[k]);
#pragma unroll
        for (int r = 0; r < kMaxRank; ++r)
          if (r < R) acc[r] = fmaf(xv, to_f32(ar[static_cast<size_t>(k) * R + r]), acc[r]);
      }
    }
    // Halve the values a lane holds 5 times, sending the half its partner keeps: lane l ends
    // with the sum of value l over the warp.
    halve<16>(acc, lane), halve<8>(acc, lane), halve<4>(acc, lane), halve<2>(acc, lane), halve<1>(acc, lane);
    if (lane < R) ws[(static_cast<size_t>(c) * M + m) * R + lane] = acc[0];
  }

  // R = 8 G (rows 16-byte aligned): rounds of 16 / G k-rows a lane, every load of a round issued
  // before its sums.
  template <int G>
  __device__ __forceinline__ void unit_rows(const T* xr, const T* ar, int kn, int lane, float (&acc)[kMaxRank]) const {
    constexpr int kRows = 16 / G;
    for (int k1 = 0; k1 < kn; k1 += 32 * kRows) {
      uint4 q[kRows][G];
      float xv[kRows];
#pragma unroll
      for (int j = 0; j < kRows; ++j) {
        const int k = k1 + lane + 32 * j;
        const bool in = k < kn;
        xv[j] = in ? to_f32(xr[k]) : 0.f;
#pragma unroll
        for (int g = 0; g < G; ++g)
          q[j][g] = in ? *reinterpret_cast<const uint4*>(ar + static_cast<size_t>(k) * R + 8 * g) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int j = 0; j < kRows; ++j)
#pragma unroll
        for (int g = 0; g < G; ++g) {
          float f[8];
          unpack8<T>(q[j][g], f);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[8 * g + i] = fmaf(xv[j], f[i], acc[8 * g + i]);
        }
    }
  }

  // The calling warp's next unit (lane 0 claims it), units() once none is left.
  __device__ __forceinline__ unsigned int claim(int lane) const {
    const unsigned int total = units();
    unsigned int u = total;
    if (lane == 0 && *reinterpret_cast<volatile unsigned int*>(&sync[0]) < total) u = atomicAdd(&sync[0], 1u);
    return min(__shfl_sync(0xffffffffu, u, 0), total);
  }
  // Whether the shrink warp takes every unit, beside the main loop (few rows), or every warp
  // takes units before it (the shrink warp alone would take longer than the main loop).
  __device__ __forceinline__ bool beside() const { return M <= kShrinkSideMaxM; }

  // A warp's units, claimed one at a time until none is left. With `buf` (the shrink warp) where
  // a and x are 16-byte aligned, each unit's rows of a and x come by TMA bulk copies into `buf`
  // (2 x kShrinkBytes of shared memory, then 2 mbarriers), the next unit's in flight while this
  // one is summed; else from global memory. The warp counts its units done once, after the last.
  __device__ __forceinline__ void run(uint8_t* buf) const {
    const int lane = threadIdx.x & 31;
    const unsigned int total = units();
    const bool tma = buf && ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(x)) & 15) == 0;
    uint64_t* bars = reinterpret_cast<uint64_t*>(buf + 2 * kShrinkBytes);
    if (tma && lane == 0) {
      mbar_init(&bars[0], 1), mbar_init(&bars[1], 1);
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncwarp();
    const auto fetch = [&](unsigned int u, int slot) {  // by lane 0
      int c, m, k0, kn;
      const T* src;
      locate(u, c, m, k0, kn, src);
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // after the buffer's earlier reads
      mbar_expect_tx(&bars[slot], kn * (R + 1) * 2);
      bulk_copy(buf + slot * kShrinkBytes, src, kn * R * 2, &bars[slot]);
      bulk_copy(buf + slot * kShrinkBytes + kShrinkA, x + static_cast<size_t>(m) * K + k0, kn * 2, &bars[slot]);
    };
    unsigned int u = claim(lane), done = 0;
    if (tma && u < total && lane == 0) fetch(u, 0);
    for (int i = 0; u < total; ++i, ++done) {
      const unsigned int next = claim(lane);
      if (tma && next < total && lane == 0) fetch(next, (i + 1) & 1);
      const T *ar, *xr;
      if (tma) {
        mbar_wait(&bars[i & 1], (i >> 1) & 1);
        ar = reinterpret_cast<const T*>(buf + (i & 1) * kShrinkBytes);
        xr = reinterpret_cast<const T*>(buf + (i & 1) * kShrinkBytes + kShrinkA);
      } else {
        int c, m, k0, kn;
        locate(u, c, m, k0, kn, ar);
        xr = x + static_cast<size_t>(m) * K + k0;
      }
      unit(u, ar, xr, lane);
      __syncwarp();
      u = next;
    }
    if (done && lane == 0) {  // the units' sums are stored
      __threadfence();
      atomicAdd(&sync[1], done);
    }
  }

  // Every thread of the block: past it, every unit's sums are visible.
  __device__ __forceinline__ void wait() const {
    if (threadIdx.x == 0) {
      while (ld_acquire(&sync[1]) < units()) __nanosleep(64);
      __threadfence();
    }
    __syncthreads();
  }

  // ts[i, r] = t[first + i, r] for i < n (the chunks added in order), 4 ranks a thread where
  // R % 4 == 0 (ws 16-byte aligned), else one.
  __device__ __forceinline__ void gather(float* ts, int first, int n) const {
    const int C = chunks();
    if (R % 4 == 0 && (reinterpret_cast<uintptr_t>(ws) & 15) == 0) {
      for (int e = threadIdx.x; e < n * R / 4; e += blockDim.x) {
        const size_t at = static_cast<size_t>(first) * R + 4 * e, stride = static_cast<size_t>(M) * R;
        float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
        for (int c = 0; c < C; ++c) {
          const float4 v = __ldcg(reinterpret_cast<const float4*>(ws + c * stride + at));
          sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
        }
        reinterpret_cast<float4*>(ts)[e] = make_float4(scale * sum.x, scale * sum.y, scale * sum.z, scale * sum.w);
      }
    } else {
      for (int e = threadIdx.x; e < n * R; e += blockDim.x) {
        float sum = 0.f;
#pragma unroll 8
        for (int c = 0; c < C; ++c) sum += __ldcg(ws + (static_cast<size_t>(c) * M + first) * R + e);
        ts[e] = scale * sum;
      }
    }
  }

  // Thread 0 as its block's last act: the grid's last block zeroes the counters for the next call.
  __device__ __forceinline__ void finish() const {
    if (threadIdx.x != 0) return;
    const unsigned int blocks = gridDim.x * gridDim.y * gridDim.z;
    if (atomicAdd(&sync[2], 1u) == blocks - 1) {
      atomicExch(&sync[0], 0u);
      atomicExch(&sync[1], 0u);
      atomicExch(&sync[2], 0u);
    }
  }
};

// A wgmma block's place: its pair (cluster) of blocks along the columns, and its tile of rows. The
// grid is (2 x pairs, 1, tiles of rows). Where it has more blocks than the GPU has SMs (a wgmma block
// takes an SM), its clusters, launched in order, are dealt out with the tiles of rows fastest, so
// the tiles of rows that read one column tile's w run side by side and w comes from HBM once; in
// launch order a layer whose w outgrows the L2 was read once per tile of rows (as measured on an
// H100, 4096 x 14336 at 129-256 rows: 73-82 µs against 96-102). A grid that fits at once keeps the
// launch order (dealt out, 0.7-10 µs slower at 512 rows there).
struct WgTile {
  int pair, rows;
};
__device__ __forceinline__ WgTile wg_tile() {
  uint32_t sms;
  asm("mov.u32 %0, %%nsmid;" : "=r"(sms));
  if (gridDim.x * gridDim.z <= sms) return {static_cast<int>(blockIdx.x / kWgPair), static_cast<int>(blockIdx.z)};
  const int pair = static_cast<int>(blockIdx.z * (gridDim.x / kWgPair) + blockIdx.x / kWgPair);
  return {pair / static_cast<int>(gridDim.z), pair % static_cast<int>(gridDim.z)};
}

// One block: y^T[n0 .. n0+CB, m0 .. m0+NT]. Warpgroups 0 and 1 (threads 0-255) compute: with CB =
// 64 columns, warpgroup g takes the k16 steps [g * KS/2, (g+1) * KS/2) of every stage; with CB =
// 128 (wide: 128 < M <= 256, tiles of NT = 128 rows), columns n0 + 64g.. over every step. Warp 8
// (threads 256-287) is the producer where x comes by TMA. The two blocks of a cluster (rank =
// blockIdx.x % 2) are either (split; always where wide) the two halves of K of one column tile,
// their partial tiles summed through distributed shared memory, or (shared) two neighbouring column
// tiles over all of K that share x: stage kt's rows are copied by the block of rank kt % 2 and
// multicast to both, and a slot is refilled only once both blocks are done with it. A block past
// N's columns (odd N/64) still copies its share (wide: its second strip is past N and not copied).
// With `sh` (gemm_lora), the compute warps first take their share of the shrink, and the epilogue
// expands each row's t from shared memory.
template <typename T, int NT, bool SHRINK, int CB = kWgCols>
__device__ __forceinline__ void wgmma_path(const T* x, const T* w, T* y, int M, int K, int N, Expand<T> ex,
                                           uint8_t* smem, const Shrink<T>* sh) {
  constexpr bool wide = CB != kWgCols;
  constexpr int S = kWgStages<NT, CB, SHRINK>, KD = kWgK<NT>;
  constexpr int W_BYTES = CB * KD * 2, X_BYTES = NT * KD * 2, STRIP_BYTES = kWgCols * KD * 2;
  // Past the main loop the ring holds the partial tiles, then t's rows (gemm_lora), then the rows' slots.
  constexpr int T_AT = 2 * NT * kWgRedLd * 4, SLOTS_AT = T_AT + NT * kMaxRank * 4;
  static_assert((!wide || (CB == 2 * kWgCols && NT == 128)) && S >= 3 && S <= 16 && S * (W_BYTES + X_BYTES) <= kWgRing &&
                    SLOTS_AT + NT * 4 <= kWgRing && kWgRing + 384 <= kWgSmem,
                "shared memory: the ring, then full barriers, x's tensor map, empty barriers");
  uint8_t* wst = smem;
  uint8_t* xst = smem + S * W_BYTES;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kWgRing);
  uint64_t* empty = reinterpret_cast<uint64_t*>(smem + kWgRing + 256);
  const int tid = threadIdx.x, wg = tid >> 7;
  const uint32_t rank = cluster_rank();
  const bool split = wide || M <= kWgSplitMaxM;
  const WgTile at = wg_tile();
  const int n0 = (wide || split ? at.pair : at.pair * kWgPair + static_cast<int>(blockIdx.x % kWgPair)) * CB;
  const int m0 = wide ? at.rows * NT : split ? 0 : at.rows * wg_tile_rows(M), rows = min(NT, M - m0);
  const int k_begin = split ? static_cast<int>(rank) * (K / kWgPair) : 0, KT = (split ? K / kWgPair : K) / KD;
  const bool has_w = n0 < N, multicast = !split && NT >= 64;
  const bool second = wide && n0 + kWgCols < N;  // wide: the block's second strip of 64 columns is in N
  // Stage kt: k-block kt, or with tiles of 256 rows (kt + pair) % KT (the pairs start at different
  // k); w's KD/64 tiles (contiguous: one bulk copy) and x's rows as KD/64 blocks [NT][128 bytes]
  // of 64 k in the 128-byte swizzle. (Measured, 4096²: every pair from k = 0 is 0.4-1.6 µs faster
  // at 64-256 rows, the staggered start 0.8 µs faster at 512.)
  const int stagger = NT == 256 ? at.pair : 0;
  const auto k_of = [&](int kt) { return k_begin + (wide ? kt : (kt + stagger) % KT) * KD; };
  if (tid == 0) {
    for (int s = 0; s < S; ++s) mbar_init(&full[s], 1), mbar_init(&empty[s], multicast ? 2 * kWgPair : 2);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  // Both blocks' barriers are set before either multicasts; meanwhile, where x comes by TMA
  // (NT >= 64), the producer warp builds x's tensor map.
  cluster_arrive_relaxed();
  const bool producer = tid >= kThreads && tid < kWgThreads;
  const void* map = NT >= 64 && producer ? x_tensor_map(x, M, K, rows, smem + kWgRing + 128) : nullptr;
  cluster_wait();

  float d[NT / 2];
#pragma unroll
  for (int i = 0; i < NT / 2; ++i) d[i] = 0.f;
  if constexpr (NT >= 64) {
    // x by TMA, a box per 64 k holding only the block's rows (TMA's fill of rows past M is slow):
    // the rest of the NT rows keep stale bytes, which reach only the products of rows that are
    // never stored. The producer fills slot kt % S once its previous stage is released: one
    // arrival per warpgroup (of both blocks, where they share x) after the wgmma that read it.
    if (sh && tid >= kWgThreads) {
      sh->run(sh->beside() ? smem + kWgSmem : nullptr);
    } else if (tid >= kThreads) {
      if (tid == kThreads) {
        tensor_map_acquire(map);
        for (int kt = 0; kt < KT; ++kt) {
          const int slot = kt % S, k0 = k_of(kt);
          if (kt >= S) mbar_wait(&empty[slot], (kt / S - 1) & 1);
          if constexpr (wide) {  // a strip a copy, their count known at compile time (measured: a loop over
            // the strips and a modulo in k_of here cost 2 µs of 25 at 129-256 rows)
            mbar_expect_tx(&full[slot], (second ? W_BYTES : STRIP_BYTES) + rows * KD * 2);
            bulk_copy(wst + slot * W_BYTES, w + w_at(k0, n0, K), STRIP_BYTES, &full[slot]);
            if (second)
              bulk_copy(wst + slot * W_BYTES + STRIP_BYTES, w + w_at(k0, n0 + kWgCols, K), STRIP_BYTES, &full[slot]);
          } else {
            mbar_expect_tx(&full[slot], (has_w ? W_BYTES : 0) + rows * KD * 2);
            if (has_w) bulk_copy(wst + slot * W_BYTES, w + w_at(k0, n0, K), W_BYTES, &full[slot]);
          }
          if (!multicast || kt % kWgPair == static_cast<int>(rank))
            for (int h = 0; h < KD / 64; ++h) {
              uint8_t* dst = xst + slot * X_BYTES + h * NT * 128;
              if (multicast) tma_load_2d_pair(dst, map, k0 + h * 64, m0, &full[slot]);
              else tma_load_2d(dst, map, k0 + h * 64, m0, &full[slot]);
            }
        }
      }
    } else {
      if (sh && !sh->beside()) sh->run(nullptr);
      for (int kt = 0; kt < KT; ++kt) {
        const int slot = kt % S;
        mbar_wait(&full[slot], (kt / S) & 1);
        wgmma_stage<T, NT, KD, CB>(d, wst + slot * W_BYTES, xst + slot * X_BYTES, wg);
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");  // stage kt - 1 done
        wgmma_fence_operands(d);
        if (kt > 0 && (tid & 127) == 0) {
          mbar_arrive(&empty[(kt - 1) % S], rank);
          if (multicast) mbar_arrive(&empty[(kt - 1) % S], rank ^ 1);
        }
      }
      asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
      wgmma_fence_operands(d);
    }
  } else {
    // Few rows: the 256 threads that compute cp.async 16-byte chunks of x (zeros past the rows),
    // the copies of stage kt issued once both warpgroups are done with stage kt - 2 (a barrier of
    // the 256 a stage): there the build of a tensor map (~1 µs) costs more than TMA saves.
    const auto load = [&](int kt) {  // one cp.async group a thread; w by thread 0
      const int slot = kt % S, k0 = k_of(kt);
      if (kt < KT) {
        if (tid == 0) {
          mbar_expect_tx(&full[slot], has_w ? W_BYTES : 0);
          if (has_w) bulk_copy(wst + slot * W_BYTES, w + w_at(k0, n0, K), W_BYTES, &full[slot]);
        }
        for (int q = tid; q < NT * KD / 8; q += kThreads) {  // zeros past the rows
          const int h = q / (NT * 8), row = q / 8 % NT, c = q & 7;
          cp_async16(xst + slot * X_BYTES + h * NT * 128 + row * 128 + ((c ^ (row & 7)) << 4),
                     row < rows ? x + static_cast<size_t>(m0 + row) * K + k0 + h * 64 + c * 8 : x, row < rows);
        }
      }
      cp_async_commit();
    };
    if (tid < kThreads) {
      for (int kt = 0; kt < S - 2; ++kt) load(kt);
      for (int kt = 0; kt < KT; ++kt) {
        const int slot = kt % S;
        cp_async_wait<S - 3>();  // this thread's rows of x for stage kt
        mbar_wait(&full[slot], (kt / S) & 1);  // w for stage kt
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // seen by wgmma
        asm volatile("bar.sync 1, %0;" ::"n"(kThreads) : "memory");  // stage kt is in; kt - 2 is done
        load(kt + S - 2);  // into stage kt - 2's slot
        wgmma_stage<T, NT, KD, CB>(d, wst + slot * W_BYTES, xst + slot * X_BYTES, wg);
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");  // stage kt - 1 done
        wgmma_fence_operands(d);
      }
      asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
      wgmma_fence_operands(d);
      cp_async_wait<0>();
    } else if (sh && tid >= kWgThreads) {
      sh->run(sh->beside() ? smem + kWgSmem : nullptr);
    }
  }
  __syncthreads();  // the stages are free (every copy into them, the peer's multicasts included, landed)
  // Split: block `rank` sums tokens [rank * NT/2, (rank + 1) * NT/2) of the four partial tiles
  // (its own two, then its peer's), else all NT of its own two.
  const int tokens = split ? NT / kWgPair : NT, first = split ? static_cast<int>(rank) * tokens : 0;
  if (ex.table) {  // each row's slot, read once (the expand's items would each wait on it),
                   // past t's rows, its loads in flight while the shrink is waited for
    int* slots = reinterpret_cast<int*>(smem + SLOTS_AT);
    for (int i = tid; i < tokens && m0 + first + i < M; i += blockDim.x) {
      const int m = m0 + first + i;
      slots[i] = m < ex.rows ? static_cast<int>(ex.ids[m]) : 0;
    }
    ex.slots = slots, ex.slot0 = m0 + first;
  }
  if (sh) {  // t of those rows, past the partial tiles
    float* ts = reinterpret_cast<float*>(smem + T_AT);
    sh->wait();
    sh->gather(ts, m0 + first, max(0, min(tokens, M - m0 - first)));
    ex.t = ts, ex.first = m0 + first;
  }

  // The warpgroups' partial tiles, red[g][token][column] in f32. Accumulator d[4j + 2h + e] is
  // column 16 * warp + lane / 4 + 8h, token 8j + 2 * (lane % 4) + e.
  float* red = reinterpret_cast<float*>(smem);
  const int lane = tid & 31, col = ((tid >> 5) & 3) * 16 + (lane >> 2);
  if (wg < 2) {
    float* mine = red + wg * NT * kWgRedLd;
#pragma unroll
    for (int j = 0; j < NT / 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 2; ++e) mine[(8 * j + 2 * (lane & 3) + e) * kWgRedLd + col + 8 * h] = d[4 * j + 2 * h + e];
  }
  cluster_sync();  // every partial tile of the cluster (and t) is written
  // The sums in a fixed order, 4 columns a thread: with CB = 64 both warpgroups' tiles of each block
  // (of the pair where split), with CB = 128 warpgroup c4 / 64's of each block of the pair.
  constexpr int kQuads = CB / 4;
  for (int e = tid; e < tokens * kQuads; e += blockDim.x) {
    const int tok = first + e / kQuads, c4 = (e % kQuads) * 4;
    const int m = m0 + tok;
    if (m >= M || (wide ? n0 + c4 >= N : !has_w)) continue;
    float l[4] = {0.f, 0.f, 0.f, 0.f};
    if (ex.table) ex.add(m, n0 + c4, N, l);
    float4 s = make_float4(l[0], l[1], l[2], l[3]);
    if constexpr (wide) {
      for (int src = 0; src < kWgPair; ++src) {
        const float4 v = ld_cluster(red + (c4 / kWgCols * NT + tok) * kWgRedLd + c4 % kWgCols, rank ^ src);
        s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
      }
    } else {
      for (int src = 0; src < (split ? 2 * kWgPair : 2); ++src) {
        const float4 v = ld_cluster(red + ((src & 1) * NT + tok) * kWgRedLd + c4, rank ^ (src >> 1));
        s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
      }
    }
    T* out = y + static_cast<size_t>(m) * N + n0 + c4;
    out[0] = from_f32<T>(s.x), out[1] = from_f32<T>(s.y), out[2] = from_f32<T>(s.z), out[3] = from_f32<T>(s.w);
  }
  cluster_arrive_relaxed();  // no block leaves while another reads its shared memory
  cluster_wait();
}

// gemm_wgmma, gemm_expand (sh null) and gemm_lora (SHRINK, sh not null).
template <typename T, bool SHRINK = false>
__device__ __forceinline__ void gemm_wgmma(const T* x, const T* w, T* y, int M, int K, int N, const Expand<T>& ex,
                                           const Shrink<T>* sh = nullptr) {
  extern __shared__ __align__(128) uint8_t wg_smem[];
  if (M <= 0) return;
  if ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w)) & 15) {
    Expand<T> scalar = ex;
    if (sh) {  // t from the partial sums (slow, as the whole path is)
      if (threadIdx.x >= kWgThreads) sh->run(wg_smem + kWgSmem);
      sh->wait();
      scalar.t = sh->ws, scalar.chunks = sh->chunks(), scalar.M = M, scalar.scale = sh->scale;
    }
    if (threadIdx.x < kThreads)
      scalar_path<T, false>(x, w, nullptr, nullptr, y, M, K, N, 0, 0.f, scalar, reinterpret_cast<float*>(wg_smem));
  } else {
    const int tile = M <= kWgSplitMaxM ? M : wg_tile_rows(M);
    const int rows = min(tile, M - wg_tile().rows * tile);
    if (M > kWgSplitMaxM && M <= kWgWideMaxM)  // every tile of rows: the grid is laid out for 128 columns a block
      wgmma_path<T, 128, SHRINK, 2 * kWgCols>(x, w, y, M, K, N, ex, wg_smem, sh);
    else if (rows <= 16) wgmma_path<T, 16, SHRINK>(x, w, y, M, K, N, ex, wg_smem, sh);
    else if (rows <= 32) wgmma_path<T, 32, SHRINK>(x, w, y, M, K, N, ex, wg_smem, sh);
    else if (rows <= 64) wgmma_path<T, 64, SHRINK>(x, w, y, M, K, N, ex, wg_smem, sh);
    else if (rows <= 128) wgmma_path<T, 128, SHRINK>(x, w, y, M, K, N, ex, wg_smem, sh);
    else wgmma_path<T, 256, SHRINK>(x, w, y, M, K, N, ex, wg_smem, sh);
  }
  if (sh) {
    __syncthreads();
    sh->finish();
  }
}

}  // namespace

#define STAGEML_KERNELS(SUFFIX, T)                                                                              \
  extern "C" __global__ void __launch_bounds__(kThreads)                                                        \
      stageml_gemm_##SUFFIX(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, int M, int K,  \
                            int N) {                                                                            \
    run<T, false>(x, w, nullptr, nullptr, y, M, K, N, 0, 0.f);                                                  \
  }                                                                                                             \
  extern "C" __global__ void __launch_bounds__(kThreads)                                                        \
      stageml_lora_##SUFFIX(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ a,          \
                            const T* __restrict__ b, T* __restrict__ y, int M, int K, int N, int R,             \
                            uint32_t scale_bits) {                                                              \
    run<T, true>(x, w, a, b, y, M, K, N, R, __uint_as_float(scale_bits));                                       \
  }                                                                                                             \
  extern "C" __global__ void __cluster_dims__(kWgPair, 1, 1) __launch_bounds__(kWgThreads, 1)                   \
      stageml_gemm_wgmma_##SUFFIX(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, int M,   \
                                  int K, int N) {                                                               \
    gemm_wgmma<T>(x, w, y, M, K, N, Expand<T>{});                                                               \
  }                                                                                                             \
  extern "C" __global__ void __cluster_dims__(kWgPair, 1, 1) __launch_bounds__(kWgThreads, 1)                   \
      stageml_gemm_expand_##SUFFIX(const T* __restrict__ x, const T* __restrict__ w, const float* __restrict__ t, \
                                   const int64_t* __restrict__ ids, const T* __restrict__ table,              \
                                   T* __restrict__ y, int M, int K, int N, int R, int rows) {                   \
    gemm_wgmma<T>(x, w, y, M, K, N, Expand<T>{t, ids, table, R, rows});                                         \
  }                                                                                                             \
  extern "C" __global__ void __cluster_dims__(kWgPair, 1, 1) __launch_bounds__(kLoraThreads, 1)                 \
      stageml_gemm_lora_##SUFFIX(const T* __restrict__ x, const T* __restrict__ w,                              \
                                 const int64_t* __restrict__ ids, const T* __restrict__ a,                      \
                                 const T* __restrict__ b, T* __restrict__ y, float* __restrict__ ws, int M,     \
                                 int K, int N, int R, int rows, uint32_t scale_bits, int site) {                \
    const float scale = __uint_as_float(scale_bits);                                                            \
    const Shrink<T> sh{x, ids, a, ws, g_lora_sync[static_cast<unsigned int>(site) % kSyncSlots], M, K, R, rows, \
                       scale};                                                                                  \
    gemm_wgmma<T, true>(x, w, y, M, K, N, Expand<T>{nullptr, ids, b, R, rows}, &sh);                            \
  }                                                                                                             \
  extern "C" __global__ void __cluster_dims__(1, 1, kBgmvSplit) __launch_bounds__(kThreads, 3)                \
      stageml_bgmv_##SUFFIX(const T* __restrict__ x, const int64_t* __restrict__ ids,                           \
                            const T* __restrict__ table, float* __restrict__ y, int B, int K, int N) {          \
    bgmv<T>(x, ids, table, y, B, K, N);                                                                         \
  }

STAGEML_KERNELS(f16, __half)
STAGEML_KERNELS(bf16, __nv_bfloat16)
