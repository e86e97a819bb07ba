// Which device runs the model, and the backend of one rank for it. The rank and communicator set-up
// (rank_group.h) and the engine do not depend on the device; only this factory does.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "kimirt/comm/comm.h"
#include "kimirt/model/config.h"
#include "kimirt/model/parallel.h"
#include "kimirt/model/param_store.h"
#include "kimirt/runtime/backend.h"
#include "kimirt/runtime/cache_manager.h"
#include "kimirt/runtime/parallel_config.h"

namespace kimirt::runtime {

enum class Device : uint8_t { kCpu, kCuda };

std::string_view device_name(Device device);  // "cpu", "cuda"
// Throws an Error naming --device for any other name.
Device parse_device(std::string_view name);

// Throws an Error saying why when this build cannot run the whole model on `device` (today: CUDA, whose
// whole-model forward does not exist yet). Call it before starting ranks.
void require_device(Device device);

// The backend of one rank of the group `comm` (size tp, this rank mapping.tp_rank). The weights are copied
// out of `params`, which may be dropped afterwards.
std::unique_ptr<Backend> make_backend(Device device, const model::ModelConfig& config, const model::ParamStore& params,
                                      Comm& comm, const model::ParallelMapping& mapping, const CacheConfig& cache,
                                      MoeComm moe_comm);

}  // namespace kimirt::runtime
