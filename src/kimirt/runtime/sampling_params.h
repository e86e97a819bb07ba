// What a request asks of token selection and stopping. Shared by the CPU sampler, the GPU sampler and
// the HTTP API (which maps OpenAI fields onto it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kimirt::runtime {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax, ties to the lowest id)
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off; keeps tokens with p >= min_p * p_max
  // Each request has its own generator, so its draws do not depend on batching. The logits it draws from may
  // differ in their last bits with the batch's make-up (the CPU backend's GEMV serves up to 4 rows, its GEMM
  // more), so a near tie can still turn another way in another batch.
  uint64_t seed = 0;
  // Hugging Face semantics: over prompt and generated tokens, logit / p if positive, logit * p if not.
  float repetition_penalty = 1.0f;
  // OpenAI semantics: over generated tokens; presence once per token, frequency per occurrence.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int max_tokens = 128;
  std::vector<int32_t> stop_ids;  // besides the model's EOS ids
  bool ignore_eos = false;
  std::vector<std::string> stop_strings;  // matched on the detokenized text (text::StopMatcher)

  // Throws kimirt::Error naming the field when a value is out of range.
  void validate() const;
  bool greedy() const { return temperature <= 0.0f; }
};

}  // namespace kimirt::runtime
