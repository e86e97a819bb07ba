// The MoE FFN of one tensor/expert-parallel rank on the CPU (spec §3.7 with DESIGN.md's direct MoE-TP rule):
// the replicated router picks experts for every token; this rank runs its experts (an EP range, each possibly
// an intermediate slice under MoE-TP) and its slice of the shared experts; the two partial results are
// reduced across the group with ONE all-reduce of [shared | routed] and only then is the routed latent
// normalized and projected up. At tp = 1 this is exactly cpu::moe_forward.
#pragma once

#include <cstdint>

#include "kimirt/comm/comm.h"
#include "kimirt/runtime/backend.h"
#include "kimirt/runtime/cpu_weights.h"

namespace kimirt::runtime {

// out[tokens, H] = MoE(x[tokens, H]), summed over the group's ranks. out must not overlap x. trace, when
// given, receives the router's choice (the same on every rank).
void cpu_moe_block(const CpuLocalDims& dims, const model::ModelConfig& config, const CpuLayerWeights& w, const float* x,
                   int64_t tokens, Comm& comm, float* out, RouteTrace* trace);

// y[tokens, width] = Σ over the (token, slot) choices whose expert is one of this rank's experts
// (first_expert .. first_expert + experts.size() - 1) of weight · expert(z[token]). Experts run in id order,
// each over all of its tokens at once, and are added in fp32 (the order cpu::routed_experts uses).
void local_routed_experts(const CpuLocalDims& dims, const CpuLayerWeights& w, const float* z, int64_t tokens,
                          const int32_t* expert_ids, const float* weights, float* y);

}  // namespace kimirt::runtime
