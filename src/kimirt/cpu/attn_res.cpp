#include "kimirt/cpu/attn_res.h"

#include <algorithm>
#include <cmath>

#include "kimirt/base/error.h"

namespace kimirt::cpu {

void attn_res_mix(std::span<const float* const> candidates, int64_t tokens, int64_t hidden, const AttnResWeights& w,
                  float eps, float* out) {
  KIMIRT_CHECK(!candidates.empty(), "AttnRes: no candidates to mix");
  KIMIRT_CHECK(w.norm && w.proj, "AttnRes: res_norm.weight and res_proj.weight are required");
  const auto n = candidates.size();
  std::vector<float> u(static_cast<size_t>(hidden));
  for (int64_t i = 0; i < hidden; ++i) u[i] = w.norm[i] * w.proj[i];
  std::vector<float> alpha(n);
  std::vector<float> mixed(static_cast<size_t>(hidden));
  for (int64_t t = 0; t < tokens; ++t) {
    for (size_t c = 0; c < n; ++c) {
      const float* v = candidates[c] + t * hidden;
      double sq = 0.0, dot = 0.0;
      for (int64_t i = 0; i < hidden; ++i) {
        sq += static_cast<double>(v[i]) * v[i];
        dot += static_cast<double>(v[i]) * u[i];
      }
      // ⟨v · r, u⟩ = r · ⟨v, u⟩ with r = (mean(v²) + eps)^-½.
      alpha[c] = static_cast<float>(dot / std::sqrt(sq / static_cast<double>(hidden) + eps));
    }
    const float mx = *std::max_element(alpha.begin(), alpha.end());
    float sum = 0.0f;
    for (float& a : alpha) {
      a = std::exp(a - mx);
      sum += a;
    }
    std::fill(mixed.begin(), mixed.end(), 0.0f);
    for (size_t c = 0; c < n; ++c) {
      const float a = alpha[c] / sum;
      const float* v = candidates[c] + t * hidden;
      for (int64_t i = 0; i < hidden; ++i) mixed[i] += a * v[i];
    }
    std::copy(mixed.begin(), mixed.end(), out + t * hidden);
  }
}

AttnResStream::AttnResStream(int64_t tokens, int64_t hidden, int64_t block_size, float eps)
    : tokens_(tokens), hidden_(hidden), block_size_(block_size), eps_(eps) {
  KIMIRT_CHECK(tokens >= 0 && hidden > 0, "AttnRes: bad shape ({} tokens, hidden {})", tokens, hidden);
  KIMIRT_CHECK(block_size > 0, "attn_res_block_size must be positive, got {}", block_size);
}

void AttnResStream::begin(const float* embedding) {
  bank_.clear();
  prefix_.assign(embedding, embedding + tokens_ * hidden_);
  next_layer_ = 0;
}

void AttnResStream::mix(const AttnResWeights& w, float* h) const {
  std::vector<const float*> candidates;
  for (const auto& b : bank_) candidates.push_back(b.data());
  candidates.push_back(prefix_.data());
  attn_res_mix(candidates, tokens_, hidden_, w, eps_, h);
}

void AttnResStream::mixer_input(int64_t layer, const AttnResWeights& w, float* h) {
  KIMIRT_ASSERT(next_layer_ == layer && !prefix_.empty());
  if (bank_.empty()) {
    std::copy(prefix_.begin(), prefix_.end(), h);
  } else {
    mix(w, h);
  }
  if (layer % block_size_ == 0) {
    bank_.push_back(std::move(prefix_));
    prefix_.clear();
  }
}

void AttnResStream::add_mixer_output(const float* a) {
  KIMIRT_ASSERT(next_layer_ >= 0);
  if (prefix_.empty()) {
    prefix_.assign(a, a + tokens_ * hidden_);
  } else {
    for (size_t i = 0; i < prefix_.size(); ++i) prefix_[i] += a[i];
  }
}

void AttnResStream::ffn_input(const AttnResWeights& w, float* h) {
  KIMIRT_ASSERT(!bank_.empty() && !prefix_.empty());
  mix(w, h);
}

void AttnResStream::add_ffn_output(const float* f) {
  KIMIRT_ASSERT(!prefix_.empty());
  for (size_t i = 0; i < prefix_.size(); ++i) prefix_[i] += f[i];
  ++next_layer_;
}

void AttnResStream::final_output(const AttnResWeights& w, float* h) {
  KIMIRT_ASSERT(next_layer_ > 0 && !prefix_.empty());
  mix(w, h);
}

}  // namespace kimirt::cpu
