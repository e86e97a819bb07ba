// Mixture-of-experts FFN (§3.7): router, routed experts, optional latent projection around them (K3), and
// shared experts. Routed experts run token-grouped: the rows routed to one expert are gathered and go
// through that expert as one matrix, then are added back with their routing weight in fp32.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "kimirt/cpu/activation.h"
#include "kimirt/cpu/mlp.h"
#include "kimirt/cpu/router.h"

namespace kimirt::cpu {

struct MoeDims {
  int64_t hidden = 0;               // model width H
  int64_t latent = 0;               // routed_expert_hidden_size L (K3); 0 = experts in model space
  int64_t expert_intermediate = 0;  // moe_intermediate_size
  int64_t shared_intermediate = 0;  // moe_intermediate_size × num_shared_experts; 0 = no shared experts
  float latent_norm_eps = 1e-5f;    // rms_norm_eps of routed_expert_norm
};

struct MoeWeights {
  RouterWeights router;
  // One entry per expert (num_experts of them), in the expert width (latent if latent > 0, else hidden).
  std::span<const GatedMlpWeights> experts;
  GatedMlpWeights shared;              // shared_experts.{gate,up,down}_proj, in model width
  const float* latent_down = nullptr;  // routed_expert_down_proj [L, H]
  const float* latent_norm = nullptr;  // routed_expert_norm [L] (latent_moe_use_norm); null = no norm
  const float* latent_up = nullptr;    // routed_expert_up_proj [H, L]
};

// The routed experts one rank holds: ids first .. first + weights.size() − 1 of the model's `total` (all of
// them, first 0, without expert parallelism).
struct ExpertShard {
  std::span<const GatedMlpWeights> weights;
  int32_t first = 0;
  int64_t total = 0;
};

// Row i goes through expert ids[i] when the shard holds it (other rows are another rank's and skipped):
// emit(i, result[width]) with the result of input(i)[width]. The rows of one expert go through it as one
// matrix; experts run in id order, each one's rows in row order, and emit sees them in that order. Returns
// the number of rows run.
int64_t run_expert_rows(const ExpertShard& shard, const GatedMlpDims& dims, const GluActivation& act,
                        const int32_t* ids, int64_t rows, const std::function<const float*(int64_t row)>& input,
                        const std::function<void(int64_t row, const float* result)>& emit);

// Routed experts only: y[t] = Σ_j weights[t, j] · expert_{ids[t, j]}(z[t]) over the choices whose expert the
// shard holds (all of them without expert parallelism; the other ranks add the rest), z and y [tokens, width],
// ids/weights [tokens, top_k]. Summed in fp32, expert by expert in id order, so that a sum over ranks in rank
// order equals the unsharded one. An id outside [0, shard.total) is an error. y must not overlap z.
void routed_experts(const ExpertShard& shard, int64_t width, int64_t intermediate, const GluActivation& act,
                    const float* z, int64_t tokens, const int32_t* expert_ids, const float* weights, int64_t top_k,
                    float* y);

// Optional per-call outputs of moe_forward, for inspection and tests.
struct MoeRoutes {
  int32_t* expert_ids = nullptr;  // [tokens, top_k] or null
  float* weights = nullptr;       // [tokens, top_k] or null
};

// out[tokens, H] = routed(x) + shared(x) for the normed FFN input x [tokens, H]. With a latent width,
// routed(x) = up( RMSNorm( Σ_j w_j · expert_j(x · downᵀ) ) ). out must not overlap x.
void moe_forward(const MoeDims& dims, const RouterConfig& router, const MoeWeights& w, const GluActivation& act,
                 const float* x, int64_t tokens, float* out, MoeRoutes routes = {});

}  // namespace kimirt::cpu
