// The cache of the one sequence `run` and `chat` hold, sized from a flag (-n with the prompt, --context) and
// checked before anything is allocated: a position count the model does not have, or one whose block count
// overflows, is an Error naming the flag, and so is a backend whose cache needs more than the machine's
// available memory (checked before allocating: under Linux's overcommit the allocation could succeed and the
// kernel end the process while the cache is zero-filled) or whose allocation fails (std::bad_alloc).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "kimirt/model/config.h"
#include "kimirt/runtime/backend.h"
#include "kimirt/runtime/cache_manager.h"

namespace kimirt::cli {

// One sequence of `positions` tokens in blocks of 64. `flag` says where the count came from ("-n 100 with a
// 7-token prompt"); errors start with it.
runtime::CacheConfig one_sequence_cache(int64_t positions, const model::ModelConfig& config, const std::string& flag);

// make() (a backend over that cache), with running out of memory reported as an Error naming `flag`.
std::unique_ptr<runtime::Backend> make_backend_for(const runtime::CacheConfig& cache, const std::string& flag,
                                                   const std::function<std::unique_ptr<runtime::Backend>()>& make);

}  // namespace kimirt::cli
