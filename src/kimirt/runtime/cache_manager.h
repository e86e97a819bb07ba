// Which cache storage each running sequence owns: a KDA state slot (recurrent state + conv window, one
// per sequence whatever its length) and a list of fixed-size blocks of the paged MLA latent cache. The
// storage itself belongs to the backend (fp32 host memory on the CPU, BF16 device memory on the GPU); this
// class only hands out indices, so the scheduler can admit, grow and free sequences the same way on both.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace kimirt::runtime {

struct CacheConfig {
  int max_sequences = 8;  // KDA state slots
  int block_size = 64;    // tokens per MLA cache block
  int num_blocks = 256;   // MLA cache blocks shared by all sequences
  int64_t max_tokens_per_sequence() const { return static_cast<int64_t>(block_size) * num_blocks; }
};

struct SequenceCache {
  int kda_slot = -1;
  std::vector<int32_t> blocks;  // block table: token t lives in blocks[t / block_size], row t % block_size
  int64_t num_tokens = 0;       // tokens whose KV/state the cache holds
};

class CacheManager {
 public:
  explicit CacheManager(const CacheConfig& config);

  const CacheConfig& config() const { return config_; }

  // Assigns a KDA slot to a new sequence; throws kimirt::Error when the id is taken or no slot is free.
  SequenceCache& open(int64_t seq_id);
  bool has_free_slot() const { return !free_slots_.empty(); }
  // Grows the sequence's block table to hold total_tokens; returns false (changing nothing) when there
  // are not enough free blocks.
  bool reserve(int64_t seq_id, int64_t total_tokens);
  // Blocks needed beyond what the sequence holds to reach total_tokens.
  int64_t blocks_needed(int64_t seq_id, int64_t total_tokens) const;
  void release(int64_t seq_id);

  SequenceCache& at(int64_t seq_id);
  const SequenceCache& at(int64_t seq_id) const;
  bool contains(int64_t seq_id) const { return sequences_.count(seq_id) != 0; }
  int free_blocks() const { return static_cast<int>(free_blocks_.size()); }
  int free_slots() const { return static_cast<int>(free_slots_.size()); }
  int num_sequences() const { return static_cast<int>(sequences_.size()); }

 private:
  CacheConfig config_;
  std::vector<int32_t> free_blocks_;
  std::vector<int> free_slots_;
  std::unordered_map<int64_t, SequenceCache> sequences_;
};

}  // namespace kimirt::runtime
