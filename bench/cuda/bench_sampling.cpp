// Sampling over the full 163840-token vocabulary: greedy and top-k/top-p/min-p at batch 1, 8, 64, 256.
#include <fmt/format.h>

#include <vector>

#include "cuda_bench.h"
#include "kimirt/cuda/check.h"
#include "kimirt/cuda/memory.h"
#include "kimirt/cuda/random_fill.h"
#include "kimirt/cuda/sampling.h"

namespace kimirt::bench::cuda {
namespace {

using namespace kimirt::cuda;

void sampling_suite(Context& ctx) {
  const int64_t vocab = 163840;
  for (int64_t rows : {1, 8, 64, 256}) {
    DeviceBuffer logits0(rows * vocab * 4), params(rows * sizeof(SamplingParams)), ids(rows * 4),
        ws(sampling_workspace_bytes(rows));
    init_sampling_workspace(ws.data(), ws.size(), ctx.stream);
    fill_uniform(logits0.as<float>(), rows * vocab, -10, 10, 3, ctx.stream);
    // The logits rotated over copies, so that the figure is DRAM's (in a decode step they come straight from
    // the LM head's GEMM, partly from L2: the step may do better than this row).
    const int copies = l2_rotation(rows * vocab * 4.0).copies;
    const std::vector<DeviceBuffer> logits = copies_of(logits0, copies, ctx.stream);
    for (int mode = 0; mode < 2; ++mode) {
      std::vector<SamplingParams> p(rows);
      for (int64_t i = 0; i < rows; ++i) {
        p[i].seed = 1;
        p[i].step = i;
        if (mode == 0) {
          p[i].temperature = 0.0f;
        } else {
          p[i].temperature = 0.7f, p[i].top_k = 50, p[i].top_p = 0.9f, p[i].min_p = 0.05f;
        }
      }
      KIMIRT_CUDA_CHECK(cudaMemcpy(params.data(), p.data(), rows * sizeof(SamplingParams), cudaMemcpyHostToDevice));
      const double us = time_rotated(
          ctx, copies,
          [&](int c) {
            sample(ctx.stream, logits[c].as<float>(), vocab, rows, vocab, 0, params.as<SamplingParams>(),
                   ids.as<int32_t>(), nullptr, ws.data(), ws.size());
          },
          3);
      ctx.add({"sampling", fmt::format("{} B={} vocab={}", mode ? "top-k50/top-p0.9/min-p" : "greedy", rows, vocab), us,
               rows * vocab * 4.0, 0, mode ? "radix selection, rows split over blocks below 132 rows" : "one pass"});
    }
  }
}

const Registrar kRegister("sampling", sampling_suite);

}  // namespace
}  // namespace kimirt::bench::cuda
