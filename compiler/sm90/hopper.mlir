// The Hopper (SM90) target StageML owns, and the declarations of its kernels.
//
// IREE 3.13 knows no sm_90 target (`--iree-cuda-target=sm_90` fails), so the
// sm90 pipeline attaches this description to the residual module itself:
//   arch / features  sm_90, PTX ISA 8.0 (CUDA 12): what IREE's own codegen emits;
//   wgp              one H100/H200 SM: the element types it computes, warp-level
//                    matrix instructions IREE may use (mma.sync / wmma; IREE 3.13
//                    has no wgmma intrinsics), warps of 32 threads, at most 1024
//                    threads and 227 KiB (232448 B) of shared memory per block;
//   chip             132 SMs (the H100 SXM and the H200).
//
// `@stageml_sm90` declares the hand-written kernels of kernels.cu, compiled
// to PTX by build.py; use-custom-kernels clones it into a residual that uses
// one. Each export follows IREE's CUDA ABI: the kernel's parameters are its
// bindings (inputs, then the outputs) and then its constants, all i32. Every
// kernel runs 256 threads per block (the wgmma GEMM and the GEMM with a fused
// expand: 288, two warpgroups and a producer warp; the multi-tenant LoRA
// kernel: 320, and a warp for the shrink); its grid comes from the
// workload (M, N), by the formula kernels.cu documents: for GEMM and LoRA, one
// block per 32 columns when M <= 64 (the memory-bound regimes), else one per
// 64x64 tile; for the wgmma GEMM and the GEMM with a fused expand, clusters of
// 2 blocks along x (the cluster shape is compiled into the kernel): where
// M <= 128, (2 ceil(N/64), 1, 1), a cluster the two halves of K of 64 columns;
// else (2 ceil(N/128), 1, ceil(M/rows)): up to 256 rows, tiles of 128 rows, a
// cluster the two halves of K of 128 columns; past 256, tiles of 256 rows, a
// cluster two column tiles of 64 that share x (the multi-tenant LoRA kernel:
// the same). Each block has 197632 bytes (the LoRA kernel: 230656) of
// dynamic shared memory, which IREE's CUDA runtime sets and launches with
// (`workgroup_local_memory`); for BGMV, clusters of 8 along z (the k-chunks), one
// per 32 columns of each row, or of each 16 rows past 64 rows.
#sm90 = #hal.executable.target<"cuda", "cuda-nvptx-fb", {
  iree_codegen.target_info = #iree_gpu.target<arch = "sm_90", features = "+ptx80",
    wgp = <compute = fp64|fp32|fp16|int64|int32|int16|int8, storage = b64|b32|b16|b8,
           subgroup = shuffle|arithmetic, dot = dp4xi8toi32,
           mma = [<NV_MMA_SYNC_F32_16x8x16_F16>, <NV_MMA_SYNC_F16_16x8x16_F16>,
                  <NV_MMA_SYNC_F32_16x8x16_BF16>, <NV_WMMA_F32_16x16x16_F16>, <NV_WMMA_F16_16x16x16_F16>],
           subgroup_size_choices = [32], max_workgroup_sizes = [1024, 1024, 1024],
           max_thread_count_per_workgroup = 1024, max_workgroup_memory_bytes = 232448,
           max_workgroup_counts = [2147483647, 65535, 65535]>,
    chip = <wgp_count = 132>>
}>

// x[M,K] @ w[K,N] → y[M,N] (w in tiles, [N/64, K/64, 8, 64, 8]); constants M, K, N.
#gemm = #hal.pipeline.layout<constants = 3, bindings = [
  #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>,
  #hal.pipeline.binding<storage_buffer>]>
// x[M,K] @ w[K,N] + s·(x @ a[K,R]) @ b[R,N] → y[M,N]; constants M, K, N, R, bits of s (f32).
#lora = #hal.pipeline.layout<constants = 5, bindings = [
  #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>,
  #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>,
  #hal.pipeline.binding<storage_buffer>]>
// x[B,K] (rows of one token), ids[B], table[S,K,N] → y[B,N] (f32), row b by
// table[ids[b]]; constants B, K, N.
#bgmv = #hal.pipeline.layout<constants = 3, bindings = [
  #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>,
  #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer>]>
// x[M,K] @ w[K,N] + t[M,R] (f32) @ table[slot(m)] → y[M,N], table [S,R,N], slot(m) = ids[m]
// for m < rows, else 0; constants M, K, N, R, rows.
#expand = #hal.pipeline.layout<constants = 5, bindings = [
  #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>,
  #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>,
  #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer>]>

// A multi-tenant LoRA site in one kernel: x[M,K] @ w[K,N] + (s·x @ a[slot(m)]) @ b[slot(m)] → y[M,N],
// a [S,K,R], b [S,R,N], slot(m) = ids[m] for m < rows, else 0; ws [C,M,R] (f32) the shrink's scratch;
// constants M, K, N, R, rows, bits of s (f32), the site's number.
#lora_tenants = #hal.pipeline.layout<constants = 7, bindings = [
  #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>,
  #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer, ReadOnly>,
  #hal.pipeline.binding<storage_buffer, ReadOnly>, #hal.pipeline.binding<storage_buffer>,
  #hal.pipeline.binding<storage_buffer>]>

module attributes {hal.device.targets = [#hal.device.target<"cuda", [#sm90]> : !hal.device]} {
  hal.executable.source private @stageml_sm90 <objects = #hal.executable.objects<{
      #sm90 = [#hal.executable.object<{path = "stageml_sm90.ptx"}>]}>> {
    hal.executable.export public @stageml_gemm_f16 ordinal(0) layout(#gemm)
        count(%device: !hal.device, %m: index, %n: index) -> (index, index, index) {
      %c1 = arith.constant 1 : index
      %stream_max_m = arith.constant 64 : index
      %stream_cols = arith.constant 32 : index
      %tile = arith.constant 64 : index
      %stream = arith.cmpi ule, %m, %stream_max_m : index
      %cols = arith.select %stream, %stream_cols, %tile : index
      %x = arith.ceildivui %n, %cols : index
      %rows = arith.ceildivui %m, %tile : index
      %y = arith.select %stream, %c1, %rows : index
      hal.return %x, %y, %c1 : index, index, index
    } <workgroup_size = [256 : index, 1 : index, 1 : index]>

    hal.executable.export public @stageml_gemm_bf16 ordinal(1) layout(#gemm)
        count(%device: !hal.device, %m: index, %n: index) -> (index, index, index) {
      %c1 = arith.constant 1 : index
      %stream_max_m = arith.constant 64 : index
      %stream_cols = arith.constant 32 : index
      %tile = arith.constant 64 : index
      %stream = arith.cmpi ule, %m, %stream_max_m : index
      %cols = arith.select %stream, %stream_cols, %tile : index
      %x = arith.ceildivui %n, %cols : index
      %rows = arith.ceildivui %m, %tile : index
      %y = arith.select %stream, %c1, %rows : index
      hal.return %x, %y, %c1 : index, index, index
    } <workgroup_size = [256 : index, 1 : index, 1 : index]>

    hal.executable.export public @stageml_lora_f16 ordinal(2) layout(#lora)
        count(%device: !hal.device, %m: index, %n: index) -> (index, index, index) {
      %c1 = arith.constant 1 : index
      %stream_max_m = arith.constant 64 : index
      %stream_cols = arith.constant 32 : index
      %tile = arith.constant 64 : index
      %stream = arith.cmpi ule, %m, %stream_max_m : index
      %cols = arith.select %stream, %stream_cols, %tile : index
      %x = arith.ceildivui %n, %cols : index
      %rows = arith.ceildivui %m, %tile : index
      %y = arith.select %stream, %c1, %rows : index
      hal.return %x, %y, %c1 : index, index, index
    } <workgroup_size = [256 : index, 1 : index, 1 : index]>

    hal.executable.export public @stageml_lora_bf16 ordinal(3) layout(#lora)
        count(%device: !hal.device, %m: index, %n: index) -> (index, index, index) {
      %c1 = arith.constant 1 : index
      %stream_max_m = arith.constant 64 : index
      %stream_cols = arith.constant 32 : index
      %tile = arith.constant 64 : index
      %stream = arith.cmpi ule, %m, %stream_max_m : index
      %cols = arith.select %stream, %stream_cols, %tile : index
      %x = arith.ceildivui %n, %cols : index
      %rows = arith.ceildivui %m, %tile : index
      %y = arith.select %stream, %c1, %rows : index
      hal.return %x, %y, %c1 : index, index, index
    } <workgroup_size = [256 : index, 1 : index, 1 : index]>

    hal.executable.export public @stageml_bgmv_f16 ordinal(4) layout(#bgmv)
        count(%device: !hal.device, %b: index, %n: index) -> (index, index, index) {
      %c1 = arith.constant 1 : index
      %cols = arith.constant 32 : index
      %split = arith.constant 8 : index
      %tiled_from = arith.constant 64 : index
      %tile = arith.constant 16 : index
      %x = arith.ceildivui %n, %cols : index
      %one_each = arith.maxui %b, %c1 : index
      %tiles = arith.ceildivui %b, %tile : index
      %tiled = arith.cmpi ugt, %b, %tiled_from : index
      %y = arith.select %tiled, %tiles, %one_each : index
      hal.return %x, %y, %split : index, index, index
    } <workgroup_size = [256 : index, 1 : index, 1 : index]>

    hal.executable.export public @stageml_bgmv_bf16 ordinal(5) layout(#bgmv)
        count(%device: !hal.device, %b: index, %n: index) -> (index, index, index) {
      %c1 = arith.constant 1 : index
      %cols = arith.constant 32 : index
      %split = arith.constant 8 : index
      %tiled_from = arith.constant 64 : index
      %tile = arith.constant 16 : index
      %x = arith.ceildivui %n, %cols : index
      %one_each = arith.maxui %b, %c1 : index
      %tiles = arith.ceildivui %b, %tile : index
      %tiled = arith.cmpi ugt, %b, %tiled_from : index
      %y = arith.select %tiled, %tiles, %one_each : index
      hal.return %x, %y, %split : index, index, index
    } <workgroup_size = [256 : index, 1 : index, 1 : index]>

    hal.executable.export public @stageml_gemm_wgmma_f16 ordinal(6) layout(#gemm)
        count(%device: !hal.device, %m: index, %n: index) -> (index, index, index) {
      %c1 = arith.constant 1 : index
      %pair = arith.constant 2 : index
      %cols = arith.constant 64 : index
      %pair_cols = arith.constant 128 : index
      %tile = arith.constant 128 : index
      %large_tile = arith.constant 256 : index
      %split = arith.cmpi ule, %m, %tile : index
      %col_tiles = arith.ceildivui %n, %cols : index
      %pairs = arith.ceildivui %n, %pair_cols : index
      %halves = arith.muli %col_tiles, %pair : index
      %paired = arith.muli %pairs, %pair : index
      %x = arith.select %split, %halves, %paired : index
      %large = arith.cmpi ugt, %m, %large_tile : index
      %rows = arith.select %large, %large_tile, %tile : index
      %row_tiles = arith.ceildivui %m, %rows : index
      %z = arith.select %split, %c1, %row_tiles : index
      hal.return %x, %c1, %z : index, index, index
    } <workgroup_size = [288 : index, 1 : index, 1 : index], workgroup_local_memory = 197632>

    hal.executable.export public @stageml_gemm_wgmma_bf16 ordinal(7) layout(#gemm)
        count(%device: !hal.device, %m: index, %n: index) -> (index, index, index) {
      %c1 = arith.constant 1 : index
      %pair = arith.constant 2 : index
      %cols = arith.constant 64 : index
      %pair_cols = arith.constant 128 : index
      %tile = arith.constant 128 : index
      %large_tile = arith.constant 256 : index
      %split = arith.cmpi ule, %m, %tile : index
      %col_tiles = arith.ceildivui %n, %cols : index
      %pairs = arith.ceildivui %n, %pair_cols : index
      %halves = arith.muli %col_tiles, %pair : index
      %paired = arith.muli %pairs, %pair : index
      %x = arith.select %split, %halves, %paired : index
      %large = arith.cmpi ugt, %m, %large_tile : index
      %rows = arith.select %large, %large_tile, %tile : index
      %row_tiles = arith.ceildivui %m, %rows : index
      %z = arith.select %split, %c1, %row_tiles : index
      hal.return %x, %c1, %z : index, index, index
    } <workgroup_size = [288 : index, 1 : index, 1 : index], workgroup_local_memory = 197632>

    hal.executable.export public @stageml_gemm_expand_f16 ordinal(8) layout(#expand)
        count(%device: !hal.device, %m: index, %n: index) -> (index, index, index) {
      %c1 = arith.constant 1 : index
      %pair = arith.constant 2 : index
      %cols = arith.constant 64 : index
      %pair_cols = arith.constant 128 : index
      %tile = arith.constant 128 : index
      %large_tile = arith.constant 256 : index
      %split = arith.cmpi ule, %m, %tile : index
      %col_tiles = arith.ceildivui %n, %cols : index
      %pairs = arith.ceildivui %n, %pair_cols : index
      %halves = arith.muli %col_tiles, %pair : index
      %paired = arith.muli %pairs, %pair : index
      %x = arith.select %split, %halves, %paired : index
      %large = arith.cmpi ugt, %m, %large_tile : index
      %rows = arith.select %large, %large_tile, %tile : index
      %row_tiles = arith.ceildivui %m, %rows : index
      %z = arith.select %split, %c1, %row_tiles : index
      hal.return %x, %c1, %z : index, index, index
    } <workgroup_size = [288 : index, 1 : index, 1 : index], workgroup_local_memory = 197632>

    hal.executable.export public @stageml_gemm_expand_bf16 ordinal(9) layout(#expand)
        count(%device: !hal.device, %m: index, %n: index) -> (index, index, index) {
      %c1 = arith.constant 1 : index
      %pair = arith.constant 2 : index
      %cols = arith.constant 64 : index
      %pair_cols = arith.constant 128 : index
      %tile = arith.constant 128 : index
      %large_tile = arith.constant 256 : index
      %split = arith.cmpi ule, %m, %tile : index
      %col_tiles = arith.ceildivui %n, %cols : index
      %pairs = arith.ceildivui %n, %pair_cols : index
      %halves = arith.muli %col_tiles, %pair : index
      %paired = arith.muli %pairs, %pair : index
      %x = arith.select %split, %halves, %paired : index
      %large = arith.cmpi ugt, %m, %large_tile : index
      %rows = arith.select %large, %large_tile, %tile : index
      %row_tiles = arith.ceildivui %m, %rows : index
      %z = arith.select %split, %c1, %row_tiles : index
      hal.return %x, %c1, %z : index, index, index
    } <workgroup_size = [288 : index, 1 : index, 1 : index], workgroup_local_memory = 197632>

    hal.executable.export public @stageml_gemm_lora_f16 ordinal(10) layout(#lora_tenants)
        count(%device: !hal.device, %m: index, %n: index) -> (index, index, index) {
      %c1 = arith.constant 1 : index
      %pair = arith.constant 2 : index
      %cols = arith.constant 64 : index
      %pair_cols = arith.constant 128 : index
      %tile = arith.constant 128 : index
      %large_tile = arith.constant 256 : index
      %split = arith.cmpi ule, %m, %tile : index
      %col_tiles = arith.ceildivui %n, %cols : index
      %pairs = arith.ceildivui %n, %pair_cols : index
      %halves = arith.muli %col_tiles, %pair : index
      %paired = arith.muli %pairs, %pair : index
      %x = arith.select %split, %halves, %paired : index
      %large = arith.cmpi ugt, %m, %large_tile : index
      %rows = arith.select %large, %large_tile, %tile : index
      %row_tiles = arith.ceildivui %m, %rows : index
      %z = arith.select %split, %c1, %row_tiles : index
      hal.return %x, %c1, %z : index, index, index
    } <workgroup_size = [320 : index, 1 : index, 1 : index], workgroup_local_memory = 230656>

    hal.executable.export public @stageml_gemm_lora_bf16 ordinal(11) layout(#lora_tenants)
        count(%device: !hal.device, %m: index, %n: index) -> (index, index, index) {
      %c1 = arith.constant 1 : index
      %pair = arith.constant 2 : index
      %cols = arith.constant 64 : index
      %pair_cols = arith.constant 128 : index
      %tile = arith.constant 128 : index
      %large_tile = arith.constant 256 : index
      %split = arith.cmpi ule, %m, %tile : index
      %col_tiles = arith.ceildivui %n, %cols : index
      %pairs = arith.ceildivui %n, %pair_cols : index
      %halves = arith.muli %col_tiles, %pair : index
      %paired = arith.muli %pairs, %pair : index
      %x = arith.select %split, %halves, %paired : index
      %large = arith.cmpi ugt, %m, %large_tile : index
      %rows = arith.select %large, %large_tile, %tile : index
      %row_tiles = arith.ceildivui %m, %rows : index
      %z = arith.select %split, %c1, %row_tiles : index
      hal.return %x, %c1, %z : index, index, index
    } <workgroup_size = [320 : index, 1 : index, 1 : index], workgroup_local_memory = 230656>
  }
}
