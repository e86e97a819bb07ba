// Block Attention Residuals (§2, §3.3): a softmax mix over depth, per token, of block snapshots and the
// running prefix, plus the bookkeeping of when snapshots are taken.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

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

// The residual stream of one forward over `tokens` tokens (§2):
//   begin(embedding)        P ← embedding, bank B ← []
//   per layer ℓ:
//     mixer_input(ℓ, w, h)  h ← P if B is empty, else AttnRes(B, P); then, when ℓ mod block == 0,
//                           B.append(P) and P ← ∅ (the snapshot is taken AFTER the pre-mixer mix)
//     add_mixer_output(a)   P ← a if P is ∅, else P + a
//     ffn_input(w, h)       h ← AttnRes(B, P)
//     add_ffn_output(f)     P ← P + f
//   final_output(w, h)      h ← AttnRes(B, P)
// The caller applies input_layernorm / post_attention_layernorm / norm to h.
class AttnResStream {
 public:
  AttnResStream(int64_t tokens, int64_t hidden, int64_t block_size, float eps);

  void begin(const float* embedding);
  void mixer_input(int64_t layer, const AttnResWeights& w, float* h);
  void add_mixer_output(const float* a);
  void ffn_input(const AttnResWeights& w, float* h);
  void add_ffn_output(const float* f);
  void final_output(const AttnResWeights& w, float* h);

  int64_t num_snapshots() const { return static_cast<int64_t>(bank_.size()); }
  const std::vector<float>& prefix() const { return prefix_; }  // empty while P is ∅

 private:
  void mix(const AttnResWeights& w, float* h) const;

  int64_t tokens_;
  int64_t hidden_;
  int64_t block_size_;
  float eps_;
  std::vector<std::vector<float>> bank_;
  std::vector<float> prefix_;
  int64_t next_layer_ = -1;  // guards the call order; -1 before begin()
};

}  // namespace kimirt::cpu
