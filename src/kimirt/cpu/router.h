// MoE router (§3.7 "Router"): fp32 logits, sigmoid scores, the FP32 correction bias used for selection
// only, optional grouped top-k, weights from the raw sigmoid, renormalization and scaling.
// Softmax scoring is not part of either released model and is deliberately absent.
#pragma once

#include <cstdint>
#include <span>

namespace kimirt::cpu {

struct RouterConfig {
  int64_t num_experts = 0;
  int64_t top_k = 0;             // num_experts_per_token
  int64_t num_expert_group = 1;  // grouping applies only when > 1 and > topk_group
  int64_t topk_group = 1;
  bool renormalize = true;  // moe_renormalize; applied only when top_k > 1, as the K3 reference does
  float routed_scaling_factor = 1.0f;
};

// Throws an Error naming the offending config field.
void validate(const RouterConfig& cfg);

struct RouterWeights {
  const float* gate = nullptr;             // [num_experts, hidden] (gate.weight)
  const float* correction_bias = nullptr;  // [num_experts] (gate.e_score_correction_bias); null = zeros
};

// Selection for one token from its sigmoid scores [num_experts]. Writes top_k expert ids and weights,
// ordered by decreasing biased score; equal biased scores go to the lower expert id (and equal group
// scores to the lower group id).
void select_experts(const RouterConfig& cfg, const float* scores, const float* correction_bias, int32_t* expert_ids,
                    float* weights);

// Whole router for x [tokens, hidden]: expert_ids and weights [tokens, top_k].
void route(const RouterConfig& cfg, const RouterWeights& w, const float* x, int64_t tokens, int64_t hidden,
           int32_t* expert_ids, float* weights);

}  // namespace kimirt::cpu
