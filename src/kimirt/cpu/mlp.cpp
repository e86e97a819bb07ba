#include "kimirt/cpu/mlp.h"

#include <vector>

#include "kimirt/base/error.h"
#include "kimirt/cpu/matmul.h"

namespace kimirt::cpu {

void gated_mlp(const GatedMlpDims& dims, const GatedMlpWeights& w, const GluActivation& act, const float* x,
               int64_t rows, float* out) {
  KIMIRT_CHECK(dims.in > 0 && dims.intermediate > 0, "gated MLP: widths must be positive (in={}, intermediate={})",
               dims.in, dims.intermediate);
  KIMIRT_CHECK(w.gate_proj && w.up_proj && w.down_proj, "gated MLP: gate_proj, up_proj and down_proj are required");
  if (rows == 0) return;
  std::vector<float> gate(static_cast<size_t>(rows * dims.intermediate));
  std::vector<float> up(gate.size());
  matmul(x, w.gate_proj, gate.data(), rows, dims.intermediate, dims.in);
  matmul(x, w.up_proj, up.data(), rows, dims.intermediate, dims.in);
  glu(act, gate.data(), up.data(), gate.data(), rows * dims.intermediate);
  matmul(gate.data(), w.down_proj, out, rows, dims.in, dims.intermediate);
}

}  // namespace kimirt::cpu
