// Read-streaming ceilings: the decode attention's bytes (32k and 64k rows of the latent cache) pulled into
// shared memory by 64 to 256 blocks (kMma16 runs 128) through a ring of 32-row tiles, for each copy form, and
// by plain loads.
// What the MLA decode kernels reach is judged against these rather than against the copy bandwidth alone:
// the difference is what the kernel's own work costs.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cuda_bench.h"
#include "kimirt/cuda/check.h"
#include "kimirt/cuda/memory.h"
#include "kimirt/cuda/mla_decode.h"
#include "kimirt/cuda/random_fill.h"
#include "stream_kernels.h"

namespace kimirt::bench::cuda {
namespace {

using namespace kimirt::cuda;

static_assert(kStreamRowBytes == kMlaRow * 2, "a stream row is one latent cache row");

const char* copy_name(StreamCopy c) {
  switch (c) {
    case StreamCopy::kTileMap:
      return "tile map";
    case StreamCopy::kBulkRows:
      return "bulk rows";
    case StreamCopy::kBulkTile:
      return "bulk tile";
  }
  return "?";
}

void stream_suite(Context& ctx) {
  for (const int64_t rows : {int64_t{32768}, int64_t{65536}}) {
    const int64_t bytes = rows * kStreamRowBytes;
    const auto [copies, calls] = l2_rotation(static_cast<double>(bytes));
    std::vector<DeviceBuffer> regions;
    std::vector<CUtensorMap> maps;
    for (int c = 0; c < copies; ++c) {
      regions.emplace_back(bytes);
      fill_uniform(regions.back().as<__nv_bfloat16>(), bytes / 2, -1, 1, 31 + c, ctx.stream);
      maps.push_back(stream_tile_map(regions.back().data(), rows));
    }
    DeviceBuffer sink(4 * 4096);
    const int tiles = static_cast<int>(rows / kStreamTileRows);
    struct Case {
      StreamCopy copy;
      int blocks, stages;
      bool pdl = false;
    };
    const Case cases[] = {
        {StreamCopy::kTileMap, 128, 4},       {StreamCopy::kTileMap, 128, 6},      {StreamCopy::kBulkRows, 128, 4},
        {StreamCopy::kBulkRows, 128, 6},      {StreamCopy::kBulkTile, 128, 4},     {StreamCopy::kBulkTile, 128, 6},
        {StreamCopy::kTileMap, 256, 2},       {StreamCopy::kBulkRows, 256, 2},     {StreamCopy::kTileMap, 64, 6},
        {StreamCopy::kTileMap, 128, 4, true}, {StreamCopy::kTileMap, 256, 2, true}};
    for (const Case& c : cases) {
      const std::string name = fmt::format("stream {} rows={} blocks={} stages={}{}", copy_name(c.copy), rows, c.blocks,
                                           c.stages, c.pdl ? " PDL" : "");
      if (!ctx.wants(name)) continue;
      const double us = graph_time_us(ctx, calls, [&](int r) {
        stream_tiles(ctx.stream, c.copy, regions[r % copies].data(), rows, maps[r % copies], c.blocks, tiles / c.blocks,
                     c.stages, c.pdl, sink.as<float>());
      });
      ctx.add({"stream", name, us, static_cast<double>(bytes), 0,
               fmt::format("{} tiles per block, {:.0f} KB in flight per block", tiles / c.blocks,
                           c.stages * kStreamTileRows * kStreamRowBytes / 1024.0)});
    }
    for (const int per_sm : {4, 8}) {
      const int blocks = per_sm * ctx.device.sm_count;
      const std::string name = fmt::format("stream loads rows={} blocks={}", rows, blocks);
      if (!ctx.wants(name)) continue;
      const double us = graph_time_us(ctx, calls, [&](int r) {
        stream_loads(ctx.stream, regions[r % copies].data(), bytes, blocks, sink.as<float>());
      });
      ctx.add({"stream", name, us, static_cast<double>(bytes), 0, "16-byte streaming loads, 512 threads per block"});
    }
  }
}

const Registrar kRegister("stream", stream_suite);

}  // namespace
}  // namespace kimirt::bench::cuda
