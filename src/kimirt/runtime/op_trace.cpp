#include "kimirt/runtime/op_trace.h"

namespace kimirt::runtime {

std::string_view trace_point_name(TracePoint point) {
  switch (point) {
    case TracePoint::kMoeBegin:
      return "moe_begin";
    case TracePoint::kLatentNorm:
      return "latent_norm";
    case TracePoint::kMoeEnd:
      return "moe_end";
  }
  return "?";
}

}  // namespace kimirt::runtime
