#include "kimirt/runtime/scheduler.h"

#include <algorithm>

#include "kimirt/base/error.h"

namespace kimirt::runtime {

void SchedulerConfig::validate(int max_sequences) const {
  KIMIRT_CHECK(max_batch_tokens >= max_sequences,
               "max_batch_tokens ({}) must be at least the number of sequences that decode together ({})",
               max_batch_tokens, max_sequences);
  KIMIRT_CHECK(prefill_chunk >= 1, "prefill_chunk must be at least 1, got {}", prefill_chunk);
}

std::vector<ScheduledChunk> schedule_step(std::span<const SequenceWork> running, const SchedulerConfig& config) {
  std::vector<ScheduledChunk> out;
  int64_t budget = config.max_batch_tokens;
  for (size_t i = 0; i < running.size() && budget > 0; ++i) {
    if (running[i].decoding) {
      out.push_back({i, 1, false});
      --budget;
    }
  }
  for (size_t i = 0; i < running.size() && budget > 0; ++i) {
    const SequenceWork& s = running[i];
    if (s.decoding || s.prompt_remaining <= 0) continue;
    const int64_t n = std::min({s.prompt_remaining, config.prefill_chunk, budget});
    out.push_back({i, n, true});
    budget -= n;
  }
  return out;
}

}  // namespace kimirt::runtime
