// Read-streaming ceilings for the decode attention's access pattern: how fast a grid of about one block per SM
// can pull a cache region into shared memory through a ring of 32-row tiles when nothing else runs, by each of
// the copy forms a decode kernel could use. The decode kernels' own figures are judged against these.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kimirt::bench::cuda {

enum class StreamCopy {
  kTileMap,   // one 3-D tensor copy per tile, atom-major with 128-byte swizzle (kMma16's and kSeesaw's form)
  kBulkRows,  // 32 one-row bulk copies per tile (one per lane), rows padded by 16 bytes in shared memory
  kBulkTile,  // one contiguous bulk copy per tile
};

inline constexpr int kStreamRowBytes = 1152;  // one latent cache row: 576 bf16
inline constexpr int kStreamTileRows = 32;

// Block i streams tiles [i * tiles_per_block, (i + 1) * tiles_per_block) of `src` (`rows` rows of 1152 bytes,
// contiguous; the tiles must fit) through `stages` stages (2..6); one warp releases each landed tile after
// reading one word of it, summed into sink[block] so that nothing is optimized away. `map` is used by kTileMap
// only (from stream_tile_map). overlap_previous: launched as a programmatic dependent of the previous kernel,
// so that its blocks start copying while that grid ends; that kernel must not write `src`.
void stream_tiles(cudaStream_t s, StreamCopy copy, const void* src, int64_t rows, const CUtensorMap& map, int blocks,
                  int tiles_per_block, int stages, bool overlap_previous, float* sink);
CUtensorMap stream_tile_map(const void* src, int64_t rows);

// The same bytes read by every thread with 16-byte streaming loads (ld.global.cs, evict-first; a grid-stride
// loop over `blocks` blocks of 512 threads), for comparison with the copy engine.
void stream_loads(cudaStream_t s, const void* src, int64_t bytes, int blocks, float* sink);

}  // namespace kimirt::bench::cuda
