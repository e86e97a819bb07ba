// What a caller of the engine sends (a generation request) and receives (one event per generated token,
// the last one saying why the request ended).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kimirt/runtime/sampling_params.h"

namespace kimirt::runtime {

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  bool prompt_logits = false;  // deliver the logits of every prompt position (Engine prompt-logits callback)
  bool step_logits = false;    // attach to each token event the logits row that chose the token
};

enum class FinishReason : uint8_t {
  kNone,       // not finished
  kEos,        // the model's EOS id (not with ignore_eos)
  kStop,       // one of the request's stop ids or stop strings
  kLength,     // max_tokens reached
  kCancelled,  // cancelled by the caller
  kError,      // the step that ran it failed, or its logits held no number; TokenEvent::error says why
};

std::string_view finish_reason_name(FinishReason reason);  // "eos", "stop", "length", ...

struct TokenEvent {
  int64_t request_id = 0;
  int32_t token = -1;  // -1 when the request ends without a new token (cancelled, error, max_tokens 0)
  int64_t index = 0;   // position among the request's generated tokens
  bool finished = false;
  FinishReason reason = FinishReason::kNone;
  std::string text;               // the text this token completes (with a tokenizer; stop strings cut off)
  std::string error;              // reason kError
  std::span<const float> logits;  // the raw logits row that chose `token` (step_logits); valid during the call
};

}  // namespace kimirt::runtime
