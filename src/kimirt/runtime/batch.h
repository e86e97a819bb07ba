// One step's work as the forward sees it: the tokens of several sequences packed one after another, and
// for each sequence where its cache lives (KDA state slot, MLA block table), how many of its tokens the
// cache already holds, and which logits rows it wants. Both backends take exactly this.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace kimirt::runtime {

// Which logits a sequence of the step asks for.
enum class LogitRows : uint8_t {
  kNone,  // a prefill chunk that does not end the prompt
  kLast,  // the row of its last token (a decode token, the end of a prompt)
  kAll,   // one row per token (prompt logits)
};

struct StepSequence {
  int64_t first_token = 0;     // offset of its tokens in StepBatch::tokens
  int64_t num_tokens = 0;      // > 0
  int64_t start_position = 0;  // tokens the cache already holds; 0 = the sequence starts (KDA state zeroed)
  int kda_slot = -1;
  std::vector<int32_t> blocks;  // MLA block table; must cover start_position + num_tokens tokens
  LogitRows logits = LogitRows::kLast;
  int64_t first_logit_row = 0;  // offset of its rows in the step's logits (set by StepBatch::add)

  int64_t num_logit_rows() const {
    return logits == LogitRows::kNone ? 0 : logits == LogitRows::kLast ? 1 : num_tokens;
  }
};

struct StepBatch {
  std::vector<int32_t> tokens;
  std::vector<StepSequence> sequences;
  int64_t logit_rows = 0;

  // Appends a sequence's tokens; fills first_token and first_logit_row.
  StepSequence& add(std::span<const int32_t> ids, int64_t start_position, int kda_slot, std::vector<int32_t> blocks,
                    LogitRows logits);

  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  // Packed token index of every logits row, in row order.
  std::vector<int64_t> logit_token_rows() const;
};

}  // namespace kimirt::runtime
