#include "kimirt/cli/sequence_cache.h"

#include <climits>
#include <new>
#include <stdexcept>

#include "kimirt/base/error.h"

namespace kimirt::cli {

namespace {
constexpr int kBlockSize = 64;
}

runtime::CacheConfig one_sequence_cache(int64_t positions, const model::ModelConfig& config, const std::string& flag) {
  KIMIRT_CHECK(positions >= 1, "{}: needs {} cache positions", flag, positions);
  if (config.max_position_embeddings) {
    KIMIRT_CHECK(positions <= *config.max_position_embeddings,
                 "{}: {} positions, more than the model's {} (max_position_embeddings)", flag, positions,
                 *config.max_position_embeddings);
  }
  // Block numbers are int32 in the caches and block tables.
  KIMIRT_CHECK(positions <= int64_t{INT_MAX} * kBlockSize, "{}: {} positions, more than a cache can number ({})", flag,
               positions, int64_t{INT_MAX} * kBlockSize);
  runtime::CacheConfig cache;
  cache.max_sequences = 1;
  cache.block_size = kBlockSize;
  cache.num_blocks = static_cast<int>((positions + kBlockSize - 1) / kBlockSize);
  return cache;
}

std::unique_ptr<runtime::Backend> make_backend_for(const runtime::CacheConfig& cache, const std::string& flag,
                                                   const std::function<std::unique_ptr<runtime::Backend>()>& make) {
  try {
    return make();
  } catch (const OutOfMemory& e) {  // found before allocating, with the sizes
    fail("{}: {}", flag, e.what());
  } catch (const std::bad_alloc&) {
  } catch (const std::length_error&) {  // a vector asked for more than it can hold
  }
  fail("{}: the model's weights and a cache of {} positions do not fit in memory", flag,
       cache.max_tokens_per_sequence());
}

}  // namespace kimirt::cli
