#include "kimirt/runtime/cache_manager.h"

#include <algorithm>

#include "kimirt/base/error.h"

namespace kimirt::runtime {

CacheManager::CacheManager(const CacheConfig& config) : config_(config) {
  KIMIRT_CHECK(config.max_sequences >= 1, "cache: max_sequences must be >= 1, got {}", config.max_sequences);
  KIMIRT_CHECK(config.block_size >= 1, "cache: block_size must be >= 1, got {}", config.block_size);
  KIMIRT_CHECK(config.num_blocks >= 0, "cache: num_blocks must be >= 0, got {}", config.num_blocks);
  // Hand out low indices first (pop from the back).
  for (int i = config.num_blocks; i-- > 0;) free_blocks_.push_back(i);
  for (int i = config.max_sequences; i-- > 0;) free_slots_.push_back(i);
}

SequenceCache& CacheManager::open(int64_t seq_id) {
  KIMIRT_CHECK(!contains(seq_id), "cache: sequence {} is already open", seq_id);
  KIMIRT_CHECK(!free_slots_.empty(), "cache: all {} sequence slots are in use", config_.max_sequences);
  SequenceCache& seq = sequences_[seq_id];
  seq.kda_slot = free_slots_.back();
  free_slots_.pop_back();
  return seq;
}

int64_t CacheManager::blocks_needed(int64_t seq_id, int64_t total_tokens) const {
  const SequenceCache& seq = at(seq_id);
  // Rounded up without tokens + block_size - 1, which overflows near INT64_MAX.
  const int64_t tokens = std::max<int64_t>(total_tokens, 0);
  const int64_t needed = tokens / config_.block_size + (tokens % config_.block_size != 0);
  const int64_t have = static_cast<int64_t>(seq.blocks.size());
  return needed > have ? needed - have : 0;
}

bool CacheManager::reserve(int64_t seq_id, int64_t total_tokens) {
  const int64_t extra = blocks_needed(seq_id, total_tokens);
  if (extra > static_cast<int64_t>(free_blocks_.size())) return false;
  SequenceCache& seq = at(seq_id);
  for (int64_t i = 0; i < extra; ++i) {
    seq.blocks.push_back(free_blocks_.back());
    free_blocks_.pop_back();
  }
  return true;
}

void CacheManager::release(int64_t seq_id) {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return;
  for (int32_t b : it->second.blocks) free_blocks_.push_back(b);
  free_slots_.push_back(it->second.kda_slot);
  sequences_.erase(it);
}

SequenceCache& CacheManager::at(int64_t seq_id) {
  auto it = sequences_.find(seq_id);
  KIMIRT_CHECK(it != sequences_.end(), "cache: sequence {} is not open", seq_id);
  return it->second;
}

const SequenceCache& CacheManager::at(int64_t seq_id) const {
  auto it = sequences_.find(seq_id);
  KIMIRT_CHECK(it != sequences_.end(), "cache: sequence {} is not open", seq_id);
  return it->second;
}

}  // namespace kimirt::runtime
