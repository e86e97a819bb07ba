// Block Attention Residuals (§2, §3.3): the softmax mix over depth, per token, of block snapshots and the
// running prefix. When snapshots are taken (the bank and prefix bookkeeping) is the forward's business:
// runtime/forward.cpp, tested in tests/runtime/forward_test.cpp.
#pragma once

#include <cstdint>
#include <span>

namespace kimirt::cpu {

// One mixing point's parameters: *_res_norm.weight [H] and *_res_proj.weight [1, H].
struct AttnResWeights {
  const float* norm = nullptr;
  const float* proj = nullptr;
};

// out = Σ_i α_i v_i over the candidates v_i (each [tokens, hidden], snapshots first, running prefix last),
// with k_i = v_i · (mean(v_i²) + eps)^-½ (no weight), u = norm ⊙ proj and α = softmax_i ⟨k_i, u⟩, per
// token. out may equal any candidate.
void attn_res_mix(std::span<const float* const> candidates, int64_t tokens, int64_t hidden, const AttnResWeights& w,
                  float eps, float* out);

}  // namespace kimirt::cpu
