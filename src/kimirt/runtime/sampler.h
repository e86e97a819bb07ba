// Token selection on the host from one row of fp32 logits: penalties, temperature, top-k, top-p,
// min-p, then a draw from the request's own seeded generator. The reference for the GPU sampler.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

#include "kimirt/runtime/sampling_params.h"

namespace kimirt::runtime {

class Sampler {
 public:
  Sampler(const SamplingParams& params, std::span<const int32_t> prompt_ids);

  // Picks the next token from logits (modified in place by penalties and temperature) and records it.
  int32_t sample(std::span<float> logits);
  // Records a token chosen elsewhere (e.g. by the GPU sampler) so that penalties stay right.
  void record(int32_t token);

 private:
  void apply_penalties(std::span<float> logits) const;
  void mark_seen(int32_t token);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::unordered_map<int32_t, int> generated_counts_;
  std::vector<int32_t> seen_;  // prompt + generated, distinct, for the repetition penalty
  std::vector<uint8_t> seen_mask_;
};

}  // namespace kimirt::runtime
