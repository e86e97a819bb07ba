// Points inside a backend's ops that a test can watch, to check the order of computation against the
// collectives around it (a Comm wrapper records those): e.g. that the routed latent reaches the latent
// RMSNorm only after its full reduction. Without a tracer a point costs one pointer test.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace kimirt::runtime {

enum class TracePoint : uint8_t {
  kMoeBegin,    // a MoE block starts; data: its input [tokens, hidden]
  kLatentNorm,  // the latent RMSNorm is about to run; data: the routed latent it normalizes [rows, latent width]
  kMoeEnd,      // a MoE block is done; data: its output [tokens, hidden]
};

std::string_view trace_point_name(TracePoint point);

class OpTracer {
 public:
  virtual ~OpTracer() = default;
  // data [rows, cols] is valid during the call.
  virtual void on_point(TracePoint point, int layer, std::span<const float> data, int64_t rows, int64_t cols) = 0;
};

}  // namespace kimirt::runtime
