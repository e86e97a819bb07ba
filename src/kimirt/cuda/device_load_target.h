// The loader's device upload target (model/load_target.h): the read engine stages checkpoint bytes in pinned
// host buffers from this target's allocator (cudaHostAlloc), every StagedWrite becomes an asynchronous
// host-to-device copy into the destination's device buffer (carved from the arena's persistent region when
// the load begins), and a staging buffer is handed back for reuse only after the copies that read it have
// completed (one event per staging buffer). finish() waits for every copy and commits the device tensors;
// abandon() waits, then returns the arena memory, so that a failed load leaves nothing behind.
//
// Only bytes move here: the destinations hold each parameter's stored components exactly as the host
// ParamStore would (same dtype, shape and bytes); converting them to kernel layouts is the backend's job.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kimirt/cuda/memory.h"
#include "kimirt/cuda/stream.h"
#include "kimirt/model/load_target.h"
#include "kimirt/tensor/tensor.h"

namespace kimirt::cuda {

// Pinned, page-aligned host memory: staging buffers the GPU's copy engines can read directly. allocate()
// runs on the loader's I/O threads and makes `device` current there first (as DeviceLoadTarget::write does),
// so that pinning does not open a context on device 0.
class PinnedStagingAllocator final : public io::StagingAllocator {
 public:
  explicit PinnedStagingAllocator(int device) : device_(device) {}
  void* allocate(uint64_t bytes) override;
  void deallocate(void* data, uint64_t bytes) noexcept override;

 private:
  int device_;
};

// One stored component of a parameter, on the device.
struct DeviceComponent {
  int component_id = 0;  // index into quant::format_components(format)
  DType dtype = DType::kU8;
  Shape shape;
  void* data = nullptr;  // null when bytes == 0
  uint64_t bytes = 0;
};

struct DeviceParam {
  const model::ParamSpec* spec = nullptr;
  quant::WeightFormat format = quant::WeightFormat::kFloat;
  Shape shape;  // this rank's logical shape
  std::vector<DeviceComponent> components;

  const DeviceComponent* component(int component_id) const;
};

// The device counterpart of model::ParamStore.
class DeviceParamStore {
 public:
  void put(std::string name, DeviceParam param);
  const DeviceParam* find(std::string_view name) const;
  const DeviceParam& at(std::string_view name) const;  // throws naming the parameter when absent
  size_t size() const { return params_.size(); }
  uint64_t total_bytes() const;
  const std::map<std::string, DeviceParam, std::less<>>& params() const { return params_; }

 private:
  std::map<std::string, DeviceParam, std::less<>> params_;
};

class DeviceLoadTarget final : public model::LoadTarget {
 public:
  // Destinations are allocated from `arena`'s persistent region; `copy_streams` streams carry the copies
  // (staging buffers are spread over them). Every CUDA call runs on the arena's device, whichever device the
  // calling thread has current.
  explicit DeviceLoadTarget(DeviceArena& arena, int copy_streams = 2);
  ~DeviceLoadTarget() override;
  DeviceLoadTarget(const DeviceLoadTarget&) = delete;
  DeviceLoadTarget& operator=(const DeviceLoadTarget&) = delete;

  io::StagingAllocator* staging_allocator() override { return &pinned_; }
  bool writes_async() const override { return true; }

  // Refuses to start while a finished load was not take()n: its memory is committed and the arena may hold
  // later allocations above it, so the target cannot give it back.
  void begin(const model::LoadPlan& plan) override;
  // Thread-safe: the read engine calls it from several I/O threads at once.
  void write(const model::StagedWrite& w) override;
  void fence(int staging_slot) override;
  void finish() override;
  void abandon() noexcept override;

  // The parameters of the finished load (empty before finish()); the memory stays in the arena.
  DeviceParamStore take();

 private:
  struct State;
  DeviceArena& arena_;
  int device_ = 0;
  PinnedStagingAllocator pinned_{device_};
  std::vector<Stream> streams_;
  std::unique_ptr<State> state_;
  DeviceParamStore store_;
};

}  // namespace kimirt::cuda
