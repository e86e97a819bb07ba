// Read-streaming ceiling kernels (see stream_kernels.h). One producer warp issues the copies into the
// ring; one consumer warp waits for each tile, reads a word of it and releases the stage, so the time is
// the copy engine's and the memory system's alone.
#include "kimirt/cuda/async_pipeline.cuh"
#include "kimirt/cuda/check.h"
#include "kimirt/cuda/device_utils.cuh"
#include "kimirt/cuda/kernel_attr.h"
#include "kimirt/cuda/tensor_map.h"
#include "stream_kernels.h"

namespace kimirt::bench::cuda {
namespace {

using namespace kimirt::cuda;

constexpr int kTileBytes = kStreamRowBytes * kStreamTileRows;  // 36864
constexpr int kPaddedRow = kStreamRowBytes + 16;
// Room for either form, in whole 1024-byte units: the 128-byte swizzle of the tile map repeats every 1024 bytes,
// and kMma16's stages (36864 bytes) start on that boundary too.
constexpr int kStageBytes = (kPaddedRow * kStreamTileRows + 1023) / 1024 * 1024;
constexpr int kMaxStages = 6;
static_assert(1024 + kMaxStages * kStageBytes + 16 * kMaxStages <= 227 * 1024, "shared memory of one block");

template <StreamCopy kCopy>
__global__ void __launch_bounds__(64) stream_tiles_kernel(const __grid_constant__ CUtensorMap map, const uint8_t* src,
                                                          int tiles_per_block, int stages, float* sink) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = detail::smem_aligned_1024(smem_raw);
  const uint32_t ring = detail::smem_addr(smem);
  const uint32_t full0 = ring + stages * kStageBytes, empty0 = full0 + 8 * kMaxStages;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int tile0 = blockIdx.x * tiles_per_block;
  // Under overlap_previous the next call may launch at once and take each SM as this grid leaves it, as the
  // decode attention's calls do; its consumers wait for this grid before they write the sink.
  detail::pdl_launch_dependents();
  if (threadIdx.x == 0) {
    for (int st = 0; st < stages; ++st) {
      detail::mbar_init(full0 + 8 * st, 1);
      detail::mbar_init(empty0 + 8 * st, 1);
    }
    detail::mbar_init_fence();
  }
  __syncthreads();
  if (warp == 0) {
    for (int t = 0; t < tiles_per_block; ++t) {
      const int st = t % stages;
      const uint32_t dst = ring + st * kStageBytes, bar = full0 + 8 * st;
      const int64_t row = static_cast<int64_t>(tile0 + t) * kStreamTileRows;
      if (lane == 0) {
        if (t >= stages) detail::mbar_wait(empty0 + 8 * st, ((t / stages) - 1) & 1);
        detail::mbar_expect_tx(bar, kTileBytes);
        if constexpr (kCopy == StreamCopy::kTileMap) detail::tma_load_3d(dst, &map, 0, static_cast<int>(row), 0, bar);
        if constexpr (kCopy == StreamCopy::kBulkTile)
          detail::bulk_load(dst, src + row * kStreamRowBytes, kTileBytes, bar);
      }
      __syncwarp();
      if constexpr (kCopy == StreamCopy::kBulkRows) {
        detail::bulk_load(dst + lane * kPaddedRow, src + (row + lane) * kStreamRowBytes, kStreamRowBytes, bar);
      }
    }
    return;
  }
  float acc = 0.0f;
  for (int t = 0; t < tiles_per_block; ++t) {
    const int st = t % stages;
    detail::mbar_wait(full0 + 8 * st, (t / stages) & 1);
    acc += reinterpret_cast<const float*>(smem + st * kStageBytes)[lane];
    __syncwarp();
    if (lane == 0) detail::mbar_arrive(empty0 + 8 * st);
  }
  acc = detail::warp_sum(acc);
  detail::pdl_wait();
  if (lane == 0) sink[blockIdx.x] = acc;
}

__global__ void __launch_bounds__(512) stream_loads_kernel(const uint4* src, int64_t n, float* sink) {
  uint32_t x = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint4 v = detail::ldcs16(src + i);
    x ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (x == 0x7f7f7f7fu) sink[blockIdx.x] = 1.0f;  // almost never: only keeps the loads
}

template <StreamCopy kCopy>
void launch(cudaStream_t s, const CUtensorMap& map, const void* src, int blocks, int tiles_per_block, int stages,
            bool overlap_previous, float* sink) {
  // Shared memory for `stages` only: with few stages two blocks can share an SM.
  const int smem = 1024 + stages * kStageBytes + 16 * kMaxStages;
  KIMIRT_CUDA_CHECK(
      cudaFuncSetAttribute(stream_tiles_kernel<kCopy>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  LaunchConfig l(dim3(blocks), 64, smem, s);
  KIMIRT_CUDA_CHECK(cudaLaunchKernelEx(l.overlap_previous(overlap_previous).get(), stream_tiles_kernel<kCopy>, map,
                                       static_cast<const uint8_t*>(src), tiles_per_block, stages, sink));
}

}  // namespace

void stream_tiles(cudaStream_t s, StreamCopy copy, const void* src, int64_t rows, const CUtensorMap& map, int blocks,
                  int tiles_per_block, int stages, bool overlap_previous, float* sink) {
  if (stages < 2 || stages > kMaxStages) throw_invalid_argument(cat("stream_tiles: stages ", stages, " not in 2..6"));
  if (blocks < 1 || tiles_per_block < 1 || int64_t{blocks} * tiles_per_block * kStreamTileRows > rows) {
    throw_invalid_argument(cat("stream_tiles: ", blocks, " blocks x ", tiles_per_block, " tiles of ", kStreamTileRows,
                               " rows exceed the region's ", rows, " rows"));
  }
  switch (copy) {
    case StreamCopy::kTileMap:
      return launch<StreamCopy::kTileMap>(s, map, src, blocks, tiles_per_block, stages, overlap_previous, sink);
    case StreamCopy::kBulkRows:
      return launch<StreamCopy::kBulkRows>(s, map, src, blocks, tiles_per_block, stages, overlap_previous, sink);
    case StreamCopy::kBulkTile:
      return launch<StreamCopy::kBulkTile>(s, map, src, blocks, tiles_per_block, stages, overlap_previous, sink);
  }
}

CUtensorMap stream_tile_map(const void* src, int64_t rows) {
  const uint64_t dims[3] = {64, static_cast<uint64_t>(rows), kStreamRowBytes / 128};
  const uint64_t strides[2] = {kStreamRowBytes, 128};
  const uint32_t box[3] = {64, kStreamTileRows, kStreamRowBytes / 128};
  return make_tensor_map(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, src, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B,
                         "stream ceiling tile map");
}

void stream_loads(cudaStream_t s, const void* src, int64_t bytes, int blocks, float* sink) {
  stream_loads_kernel<<<blocks, 512, 0, s>>>(static_cast<const uint4*>(src), bytes / 16, sink);
  KIMIRT_CUDA_CHECK_LAUNCH();
}

}  // namespace kimirt::bench::cuda
