// The device upload target of the loader.
#include "kimirt/cuda/device_load_target.h"

#include <fmt/format.h>

#include <mutex>

#include "kimirt/base/error.h"
#include "kimirt/cuda/check.h"
#include "kimirt/model/load_plan.h"
#include "kimirt/quant/weight_format.h"

namespace kimirt::cuda {

void* PinnedStagingAllocator::allocate(uint64_t bytes) {
  void* p = nullptr;
  const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    fail("pinned staging memory: cudaHostAlloc of {} bytes failed ({})", bytes, cudaGetErrorString(err));
  }
  return p;
}

void PinnedStagingAllocator::deallocate(void* data, uint64_t) noexcept {
  if (data) (void)cudaFreeHost(data);
}

const DeviceComponent* DeviceParam::component(int component_id) const {
  for (const DeviceComponent& c : components) {
    if (c.component_id == component_id) return &c;
  }
  return nullptr;
}

void DeviceParamStore::put(std::string name, DeviceParam param) {
  const auto [it, inserted] = params_.emplace(std::move(name), std::move(param));
  KIMIRT_CHECK(inserted, "device parameters: {} is loaded twice", it->first);
}

const DeviceParam* DeviceParamStore::find(std::string_view name) const {
  const auto it = params_.find(name);
  return it == params_.end() ? nullptr : &it->second;
}

const DeviceParam& DeviceParamStore::at(std::string_view name) const {
  const DeviceParam* p = find(name);
  KIMIRT_CHECK(p, "device parameters: no parameter {}", name);
  return *p;
}

uint64_t DeviceParamStore::total_bytes() const {
  uint64_t total = 0;
  for (const auto& [name, p] : params_) {
    for (const DeviceComponent& c : p.components) total += c.bytes;
  }
  return total;
}

struct DeviceLoadTarget::State {
  const model::LoadPlan* plan = nullptr;
  uint64_t arena_mark = 0;
  std::vector<uint8_t*> dest;  // device base of each destination (null when empty)
  std::mutex mutex;            // guards the slot events
  std::vector<cudaEvent_t> slot_event;
  std::vector<char> slot_recorded;

  ~State() {
    for (cudaEvent_t e : slot_event) {
      if (e) (void)cudaEventDestroy(e);
    }
  }
};

DeviceLoadTarget::DeviceLoadTarget(DeviceArena& arena, int copy_streams) : arena_(arena) {
  KIMIRT_CHECK(copy_streams >= 1 && copy_streams <= 16, "device load target: {} copy streams (1..16)", copy_streams);
  for (int i = 0; i < copy_streams; ++i) {
    cudaStream_t s = nullptr;
    KIMIRT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    streams_.push_back(s);
  }
}

DeviceLoadTarget::~DeviceLoadTarget() {
  if (state_) abandon();
  for (cudaStream_t s : streams_) (void)cudaStreamDestroy(s);
}

void DeviceLoadTarget::begin(const model::LoadPlan& plan) {
  if (state_) abandon();
  store_ = DeviceParamStore();
  auto st = std::make_unique<State>();
  st->plan = &plan;
  st->arena_mark = arena_.persistent_mark();
  state_ = std::move(st);
  // All destinations up front, so that the I/O threads only look pointers up. A checkpoint that does not
  // fit fails here, naming the parameter, before any byte is read (the loader then abandons).
  state_->dest.assign(plan.dests().size(), nullptr);
  for (size_t d = 0; d < plan.dests().size(); ++d) {
    const model::PlannedDest& dest = plan.dests()[d];
    if (dest.bytes == 0) continue;
    const model::PlannedParam& p = plan.params()[dest.param];
    const auto& comp = quant::format_components(p.format)[static_cast<size_t>(dest.component)];
    state_->dest[d] =
        static_cast<uint8_t*>(arena_.allocate_persistent(dest.bytes, fmt::format("{}{}", p.spec->name, comp.suffix)));
  }
}

void DeviceLoadTarget::write(const model::StagedWrite& w) {
  State& st = *state_;
  KIMIRT_ASSERT(w.dest < st.dest.size());
  const model::PlannedDest& dest = st.plan->dests()[w.dest];
  if (w.rows == 0 || w.width == 0) return;
  KIMIRT_ASSERT(w.dst_offset + (w.rows - 1) * w.dst_pitch + w.width <= dest.bytes);
  uint8_t* dst = st.dest[w.dest] + w.dst_offset;
  const int slot = w.staging_slot;
  cudaStream_t stream = streams_[slot >= 0 ? static_cast<size_t>(slot) % streams_.size() : 0];
  if (w.rows == 1 || (w.src_pitch == w.width && w.dst_pitch == w.width)) {
    KIMIRT_CUDA_CHECK(cudaMemcpyAsync(dst, w.src, w.width * w.rows, cudaMemcpyHostToDevice, stream));
  } else {
    KIMIRT_CUDA_CHECK(
        cudaMemcpy2DAsync(dst, w.dst_pitch, w.src, w.src_pitch, w.width, w.rows, cudaMemcpyHostToDevice, stream));
  }
  if (slot < 0) {
    // The source is only valid during this call.
    KIMIRT_CUDA_CHECK(cudaStreamSynchronize(stream));
    return;
  }
  // Writes from one staging buffer come from the one thread that filled it, so its event is not recorded
  // concurrently; the lock only protects growing the tables.
  std::lock_guard<std::mutex> lock(st.mutex);
  const auto s = static_cast<size_t>(slot);
  if (s >= st.slot_event.size()) {
    st.slot_event.resize(s + 1, nullptr);
    st.slot_recorded.resize(s + 1, 0);
  }
  if (!st.slot_event[s]) KIMIRT_CUDA_CHECK(cudaEventCreateWithFlags(&st.slot_event[s], cudaEventDisableTiming));
  KIMIRT_CUDA_CHECK(cudaEventRecord(st.slot_event[s], stream));
  st.slot_recorded[s] = 1;
}

void DeviceLoadTarget::fence(int staging_slot) {
  if (!state_ || staging_slot < 0) return;
  cudaEvent_t e = nullptr;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    const auto s = static_cast<size_t>(staging_slot);
    if (s < state_->slot_event.size() && state_->slot_recorded[s]) e = state_->slot_event[s];
  }
  if (e) KIMIRT_CUDA_CHECK(cudaEventSynchronize(e));
}

void DeviceLoadTarget::finish() {
  KIMIRT_CHECK(state_, "device load target: finish() without begin()");
  for (cudaStream_t s : streams_) KIMIRT_CUDA_CHECK(cudaStreamSynchronize(s));
  const model::LoadPlan& plan = *state_->plan;
  DeviceParamStore store;
  for (const model::PlannedParam& p : plan.params()) {
    DeviceParam dp;
    dp.spec = p.spec;
    dp.format = p.format;
    dp.shape = p.slice.local_shape;
    for (uint32_t d : p.dests) {
      const model::PlannedDest& dest = plan.dests()[d];
      dp.components.push_back(DeviceComponent{dest.component, dest.dtype, dest.shape, state_->dest[d], dest.bytes});
    }
    store.put(p.spec->name, std::move(dp));
  }
  store_ = std::move(store);
  state_.reset();
}

void DeviceLoadTarget::abandon() noexcept {
  if (!state_) {
    store_ = DeviceParamStore();
    return;
  }
  // Copies still in flight read staging memory and write the arena: let them land before either goes.
  for (cudaStream_t s : streams_) (void)cudaStreamSynchronize(s);
  (void)cudaGetLastError();
  try {
    arena_.rewind_persistent(state_->arena_mark);
  } catch (...) {  // only if someone reset the arena under the load; nothing is left to return then
  }
  state_.reset();
  store_ = DeviceParamStore();
}

DeviceParamStore DeviceLoadTarget::take() { return std::move(store_); }

}  // namespace kimirt::cuda
