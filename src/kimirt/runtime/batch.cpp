#include "kimirt/runtime/batch.h"

#include "kimirt/base/error.h"

namespace kimirt::runtime {

StepSequence& StepBatch::add(std::span<const int32_t> ids, int64_t start_position, int kda_slot,
                             std::vector<int32_t> blocks, LogitRows logits) {
  KIMIRT_CHECK(!ids.empty(), "step batch: sequence {} has no tokens", sequences.size());
  StepSequence s;
  s.first_token = num_tokens();
  s.num_tokens = static_cast<int64_t>(ids.size());
  s.start_position = start_position;
  s.kda_slot = kda_slot;
  s.blocks = std::move(blocks);
  s.logits = logits;
  s.first_logit_row = logit_rows;
  tokens.insert(tokens.end(), ids.begin(), ids.end());
  logit_rows += s.num_logit_rows();
  sequences.push_back(std::move(s));
  return sequences.back();
}

std::vector<int64_t> StepBatch::logit_token_rows() const {
  std::vector<int64_t> rows;
  rows.reserve(static_cast<size_t>(logit_rows));
  for (const auto& s : sequences) {
    if (s.logits == LogitRows::kLast) rows.push_back(s.first_token + s.num_tokens - 1);
    if (s.logits == LogitRows::kAll) {
      for (int64_t t = 0; t < s.num_tokens; ++t) rows.push_back(s.first_token + t);
    }
  }
  return rows;
}

}  // namespace kimirt::runtime
