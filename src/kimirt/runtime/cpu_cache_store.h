// The CPU backend's cache memory, in the geometry of a CacheConfig: for every KDA layer one state (recurrent
// state + conv windows, fp32) per sequence slot, and for every MLA layer a paged latent cache
// [num_blocks, block_size, latent_width] fp32. Which sequence owns which slot and blocks is the
// CacheManager's business; this class only stores.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kimirt/cpu/kda.h"
#include "kimirt/cpu/mla.h"
#include "kimirt/model/config.h"
#include "kimirt/runtime/cache_manager.h"

namespace kimirt::runtime {

class CpuCacheStore {
 public:
  // kda and mla are this rank's op dimensions (local heads). Throws OutOfMemory, before allocating, when the
  // store needs more than the machine's available memory.
  CpuCacheStore(const model::ModelConfig& config, const cpu::KdaDims& kda, const cpu::MlaDims& mla,
                const CacheConfig& cache);
  // The bytes such a store holds (all bits set when they pass uint64). Throws for dimensions the ops refuse.
  static uint64_t bytes_for(const model::ModelConfig& config, const cpu::KdaDims& kda, const cpu::MlaDims& mla,
                            const CacheConfig& cache);

  cpu::KdaState& kda_state(int layer, int slot);
  // Zeroes a slot's state in one layer: a sequence starting at position 0.
  void reset_kda(int layer, int slot);

  // The first n latent rows of a sequence, contiguous: out [n, latent_width].
  void gather_latent(int layer, std::span<const int32_t> blocks, int64_t n, float* out) const;
  // Stores rows [n, latent_width] at the sequence's positions first .. first + n - 1.
  void write_latent(int layer, std::span<const int32_t> blocks, int64_t first, int64_t n, const float* rows);

  int64_t latent_width() const { return latent_width_; }
  uint64_t bytes() const;

 private:
  // Index of a position's latent row in its layer's store.
  size_t offset(std::span<const int32_t> blocks, int64_t position) const;

  CacheConfig cache_;
  cpu::KdaDims kda_dims_;
  int64_t latent_width_ = 0;
  std::vector<int> index_;                       // model layer → its KDA or MLA store index
  std::vector<std::vector<cpu::KdaState>> kda_;  // [KDA layer][slot]
  std::vector<std::vector<float>> mla_;          // [MLA layer][block][row][latent_width]
};

}  // namespace kimirt::runtime
