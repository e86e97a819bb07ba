// MoE router selection on the device (§3.7), fp32: s = σ(logits), selection by s + correction bias (the
// bias only selects), top-k with ties to the lowest expert id (the CPU rule), weights = raw s of the
// chosen experts, renormalized (w / (Σw + 1e-20), when top_k > 1) and scaled. Grouped selection
// (num_expert_group > 1) is not implemented: neither released model uses it (the runtime rejects it).
//
// The logits themselves come from Linear/GemmLt with an fp32 output (gate.weight [E, H] BF16: bf16
// products are exact in fp32, so the GEMM is the fp32 reference up to summation order).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kimirt::cuda {

inline constexpr int kRouterMaxExperts = 1024;
inline constexpr int kRouterMaxTopK = 32;

struct RouterParams {
  int num_experts = 0;      // ≤ 1024
  int top_k = 0;            // ≤ 32 and ≤ num_experts
  bool renormalize = true;  // moe_renormalize (applied only when top_k > 1)
  float scale = 1.0f;       // routed_scaling_factor
};

// logits [tokens, num_experts] fp32 (row stride ld), bias [num_experts] fp32 or null.
// ids [tokens, top_k] int32 and weights [tokens, top_k] fp32, ordered by decreasing biased score.
void router_topk(cudaStream_t stream, const float* logits, int64_t ld, const float* bias, int64_t tokens,
                 const RouterParams& p, int32_t* ids, float* weights);

}  // namespace kimirt::cuda
