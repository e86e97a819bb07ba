#include "kimirt/runtime/cpu_cache_store.h"

#include <algorithm>
#include <mutex>

#include "kimirt/base/error.h"
#include "kimirt/base/memory_info.h"

namespace kimirt::runtime {

namespace {
// The ranks of an in-process group build their stores side by side. Checked and filled one at a time, each
// store's check sees the memory the stores before it took (their zeros are written here, so their pages count
// against MemAvailable) rather than every rank seeing the same free memory at once. Only the stores: the ranks'
// weight copies are made side by side, outside this lock, and a check cannot see those still to come.
std::mutex& construction_mutex() {
  static std::mutex m;
  return m;
}
}  // namespace

CpuCacheStore::CpuCacheStore(const model::ModelConfig& config, const cpu::KdaDims& kda, const cpu::MlaDims& mla,
                             const CacheConfig& cache)
    : cache_(cache), kda_dims_(kda), latent_width_(mla.latent_width()) {
  const std::lock_guard<std::mutex> one_at_a_time(construction_mutex());
  const uint64_t need = bytes_for(config, kda, mla, cache);
  if (const auto available = available_memory_bytes(); available && need > *available) {
    throw OutOfMemory(fmt::format(
        "a cache of {} positions ({} sequences) needs {:.2f} GiB, more than the {:.2f} GiB of memory available",
        cache.max_tokens_per_sequence(), cache.max_sequences, static_cast<double>(need) / (1 << 30),
        static_cast<double>(*available) / (1 << 30)));
  }
  const auto slots = static_cast<size_t>(cache.max_sequences);
  const auto rows = static_cast<size_t>(cache.num_blocks) * static_cast<size_t>(cache.block_size);
  for (int64_t l = 0; l < config.num_layers; ++l) {
    if (config.is_kda_layer(l)) {
      index_.push_back(static_cast<int>(kda_.size()));
      kda_.emplace_back(slots, cpu::KdaState::zeros(kda));
    } else {
      index_.push_back(static_cast<int>(mla_.size()));
      mla_.emplace_back(rows * static_cast<size_t>(latent_width_), 0.0f);
    }
  }
}

cpu::KdaState& CpuCacheStore::kda_state(int layer, int slot) {
  KIMIRT_ASSERT(slot >= 0 && slot < cache_.max_sequences);
  return kda_[static_cast<size_t>(index_[static_cast<size_t>(layer)])][static_cast<size_t>(slot)];
}

void CpuCacheStore::reset_kda(int layer, int slot) {
  cpu::KdaState& s = kda_state(layer, slot);
  for (auto* v : {&s.conv_q, &s.conv_k, &s.conv_v, &s.recurrent}) std::fill(v->begin(), v->end(), 0.0f);
}

size_t CpuCacheStore::offset(std::span<const int32_t> blocks, int64_t position) const {
  const int64_t b = position / cache_.block_size, r = position % cache_.block_size;
  KIMIRT_ASSERT(b < static_cast<int64_t>(blocks.size()));
  const int32_t block = blocks[static_cast<size_t>(b)];
  KIMIRT_ASSERT(block >= 0 && block < cache_.num_blocks);
  return static_cast<size_t>((static_cast<int64_t>(block) * cache_.block_size + r) * latent_width_);
}

void CpuCacheStore::gather_latent(int layer, std::span<const int32_t> blocks, int64_t n, float* out) const {
  // Whole blocks at a time: rows of one block are contiguous.
  const auto& store = mla_[static_cast<size_t>(index_[static_cast<size_t>(layer)])];
  for (int64_t p = 0; p < n; p += cache_.block_size) {
    const int64_t count = std::min<int64_t>(cache_.block_size, n - p);
    const float* src = store.data() + offset(blocks, p);
    std::copy(src, src + count * latent_width_, out + p * latent_width_);
  }
}

void CpuCacheStore::write_latent(int layer, std::span<const int32_t> blocks, int64_t first, int64_t n,
                                 const float* rows) {
  auto& store = mla_[static_cast<size_t>(index_[static_cast<size_t>(layer)])];
  for (int64_t i = 0; i < n; ++i) {
    std::copy(rows + i * latent_width_, rows + (i + 1) * latent_width_, store.data() + offset(blocks, first + i));
  }
}

uint64_t CpuCacheStore::bytes_for(const model::ModelConfig& config, const cpu::KdaDims& kda, const cpu::MlaDims& mla,
                                  const CacheConfig& cache) {
  // One slot's state as the store makes it (zeros() checks the dims first); sizes past uint64 saturate, so
  // that they are refused as too large rather than wrapping to a small number.
  const cpu::KdaState one = cpu::KdaState::zeros(kda);
  const uint64_t kda_floats = one.conv_q.size() + one.conv_k.size() + one.conv_v.size() + one.recurrent.size();
  constexpr uint64_t kSaturated = ~uint64_t{0};
  uint64_t rows = 0, kda_layer = 0, mla_layer = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(cache.num_blocks), static_cast<uint64_t>(cache.block_size), &rows) ||
      __builtin_mul_overflow(rows, static_cast<uint64_t>(mla.latent_width()) * sizeof(float), &mla_layer) ||
      __builtin_mul_overflow(static_cast<uint64_t>(cache.max_sequences), kda_floats * sizeof(float), &kda_layer)) {
    return kSaturated;
  }
  uint64_t total = 0;
  for (int64_t l = 0; l < config.num_layers; ++l) {
    if (__builtin_add_overflow(total, config.is_kda_layer(l) ? kda_layer : mla_layer, &total)) return kSaturated;
  }
  return total;
}

uint64_t CpuCacheStore::bytes() const {
  uint64_t total = 0;
  for (const auto& layer : kda_) {
    for (const auto& s : layer) {
      total += (s.conv_q.size() + s.conv_k.size() + s.conv_v.size() + s.recurrent.size()) * sizeof(float);
    }
  }
  for (const auto& m : mla_) total += m.size() * sizeof(float);
  return total;
}

}  // namespace kimirt::runtime
