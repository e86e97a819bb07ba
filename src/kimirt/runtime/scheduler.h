// How one step's token budget is shared among the running sequences (continuous batching): every sequence
// that is decoding gets its one token first, so running requests never stall behind a long prompt; the
// rest of the budget goes to prompts in admission order, each in chunks of at most prefill_chunk tokens.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace kimirt::runtime {

struct SchedulerConfig {
  int64_t max_batch_tokens = 512;  // tokens per step; at least the number of sequences that can decode at once
  int64_t prefill_chunk = 256;     // longest piece of one prompt per step

  // Throws an Error naming the field.
  void validate(int max_sequences) const;
};

// A running sequence as the scheduler sees it, in admission order.
struct SequenceWork {
  int64_t prompt_remaining = 0;  // prompt tokens not in the cache yet
  bool decoding = false;         // prompt done: feeds its last sampled token
};

struct ScheduledChunk {
  size_t sequence = 0;     // index into the running list
  int64_t num_tokens = 0;  // 1 for a decode
  bool prefill = false;
};

// The work of one step, decodes first, then prefill chunks; empty when nothing can run.
std::vector<ScheduledChunk> schedule_step(std::span<const SequenceWork> running, const SchedulerConfig& config);

}  // namespace kimirt::runtime
