// How fast an sm_90 kernel can stream a weight from HBM, against StageML's GEMM and cuBLAS under
// the same timer (benchmarks/gpu/stream_floor.py). Built with kernels.cu in one translation unit,
// so the probes use its TMA and mbarrier helpers and the module carries its GEMM too:
//
//   nvcc -cubin -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -o stream_floor.cubin stream_floor.cu
//
// Every probe reads each 32-bit word of its buffer once and adds it (mod 2^32) into *sum, which
// the script checks against the buffer's sum: a probe that skipped bytes fails.
//
//   probe_empty             a block that does nothing (the timer's and the launch's own cost)
//   probe_empty_pair        the same as a cluster of 2 with the GEMM's block and shared memory
//   probe_ldg<U>            16-byte loads from every thread, U in flight, grid-stride
//   probe_bulk[_pair]       each block a contiguous chunk, by TMA bulk copies into a ring of
//                           `stages` x `stage_bytes` of shared memory (the GEMM's w stream), one
//                           producer thread; 256 consumer threads add each stage and release it

#include "../../compiler/sm90/kernels.cu"

namespace {

__device__ __forceinline__ uint32_t add4(uint32_t acc, uint4 v) { return acc + v.x + v.y + v.z + v.w; }

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

__device__ __forceinline__ void block_sum(uint32_t acc, uint32_t* sum) {
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) atomicAdd(sum, acc);
}

template <int U> __device__ __forceinline__ void ldg(const uint4* p, size_t n16, uint32_t* sum) {
  uint32_t acc = 0;
  const size_t step = static_cast<size_t>(gridDim.x) * blockDim.x * U;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x * U + threadIdx.x; i < n16; i += step) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = i + u * blockDim.x < n16 ? ld_stream(p + i + u * blockDim.x) : uint4{0, 0, 0, 0};
#pragma unroll
    for (int u = 0; u < U; ++u) acc = add4(acc, v[u]);
  }
  block_sum(acc, sum);
}

// Block b streams bytes [b * chunk, min((b + 1) * chunk, total)) through the ring; threads
// 0..255 consume, thread 256 produces.
__device__ __forceinline__ void bulk(const uint8_t* src, uint32_t chunk, uint64_t total, uint32_t stage_bytes,
                                     int stages, uint32_t* sum) {
  extern __shared__ __align__(128) uint8_t ring[];
  uint64_t* full = reinterpret_cast<uint64_t*>(ring + stages * stage_bytes);
  uint64_t* empty = full + stages;
  const uint64_t begin = static_cast<uint64_t>(blockIdx.x) * chunk;
  const uint32_t mine = begin >= total ? 0u : static_cast<uint32_t>(total - begin < chunk ? total - begin : chunk);
  const int n = static_cast<int>((mine + stage_bytes - 1) / stage_bytes);
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) mbar_init(&full[s], 1), mbar_init(&empty[s], kThreads / 32);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == kThreads) {
    for (int i = 0; i < n; ++i) {
      const int s = i % stages;
      if (i >= stages) mbar_wait(&empty[s], (i / stages - 1) & 1);
      const uint32_t bytes = min(stage_bytes, mine - i * stage_bytes);
      mbar_expect_tx(&full[s], bytes);
      bulk_copy(ring + s * stage_bytes, src + begin + static_cast<uint64_t>(i) * stage_bytes, bytes, &full[s]);
    }
  } else if (threadIdx.x < kThreads) {
    uint32_t acc = 0;
    for (int i = 0; i < n; ++i) {
      const int s = i % stages;
      mbar_wait(&full[s], (i / stages) & 1);
      const uint32_t bytes = min(stage_bytes, mine - i * stage_bytes);
      const uint4* words = reinterpret_cast<const uint4*>(ring + s * stage_bytes);
      for (uint32_t q = threadIdx.x; q < bytes / 16; q += kThreads) acc = add4(acc, words[q]);
      __syncwarp();
      if ((threadIdx.x & 31) == 0) mbar_arrive(&empty[s], cluster_rank());
    }
    block_sum(acc, sum);
  }
}

}  // namespace

extern "C" __global__ void probe_empty() {}

extern "C" __global__ void __cluster_dims__(kWgPair, 1, 1) __launch_bounds__(kWgThreads, 1) probe_empty_pair() {
  cluster_arrive_relaxed();
  cluster_wait();
  cluster_arrive_relaxed();
  cluster_wait();
}

extern "C" __global__ void __launch_bounds__(512) probe_ldg4(const uint4* p, uint64_t n16, uint32_t* sum) {
  ldg<4>(p, n16, sum);
}
extern "C" __global__ void __launch_bounds__(512) probe_ldg8(const uint4* p, uint64_t n16, uint32_t* sum) {
  ldg<8>(p, n16, sum);
}

extern "C" __global__ void __launch_bounds__(kThreads + 32, 1)
    probe_bulk(const uint8_t* src, uint32_t chunk, uint64_t total, uint32_t stage_bytes, int stages, uint32_t* sum) {
  bulk(src, chunk, total, stage_bytes, stages, sum);
}
extern "C" __global__ void __cluster_dims__(kWgPair, 1, 1) __launch_bounds__(kThreads + 32, 1)
    probe_bulk_pair(const uint8_t* src, uint32_t chunk, uint64_t total, uint32_t stage_bytes, int stages,
                    uint32_t* sum) {
  bulk(src, chunk, total, stage_bytes, stages, sum);
}
