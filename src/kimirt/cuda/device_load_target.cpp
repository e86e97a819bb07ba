// The device upload target of the loader.
#include "kimirt/cuda/device_load_target.h"

#include <fmt/format.h>

#include <mutex>
#include <utility>

#include "kimirt/base/error.h"
#include "kimirt/cuda/check.h"
#include "kimirt/cuda/device.h"
#include "kimirt/model/load_plan.h"
#include "kimirt/quant/weight_format.h"

namespace kimirt::cuda {

void* PinnedStagingAllocator::allocate(uint64_t bytes) {
  set_current_device(device_);
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

namespace {

// The read engine decides how many staging buffers there are (staging bytes / buffer size), so the target
// cannot know at begin(); this many slots get their event up front, later ones on first use.
constexpr size_t kPreparedSlots = 64;

}  // namespace

struct DeviceLoadTarget::State {
  struct Slot {
    Event event{false};
    bool recorded = false;
  };

  const model::LoadPlan* plan = nullptr;
  uint64_t arena_mark = 0;
  std::vector<uint8_t*> dest;  // device base of each destination (null when empty)
  std::mutex mutex;            // guards the slot table
  std::vector<Slot> slots;     // events are created with the target's device current

  void prepare_slots(size_t n) {
    while (slots.size() < n) slots.emplace_back();
  }
};

DeviceLoadTarget::DeviceLoadTarget(DeviceArena& arena, int copy_streams) : arena_(arena), device_(arena.device()) {
  KIMIRT_CHECK(copy_streams >= 1 && copy_streams <= 16, "device load target: {} copy streams (1..16)", copy_streams);
  const DeviceGuard on_device(device_);
  // Declared after the guard, so that if a later stream fails the earlier ones are destroyed on their device.
  std::vector<Stream> streams;
  streams.reserve(static_cast<size_t>(copy_streams));
  for (int i = 0; i < copy_streams; ++i) streams.emplace_back();
  streams_ = std::move(streams);
}

DeviceLoadTarget::~DeviceLoadTarget() {
  // Members are destroyed after this body: release the streams and events here, under the guard.
  const DeviceGuard on_device(device_, std::nothrow);
  if (state_) abandon();
  streams_.clear();
}

void DeviceLoadTarget::begin(const model::LoadPlan& plan) {
  const DeviceGuard on_device(device_);
  if (state_) abandon();
  KIMIRT_CHECK(store_.size() == 0,
               "device load target: begin() while the {} parameters ({} bytes) of the previous load were never "
               "take()n",
               store_.size(), store_.total_bytes());
  auto st = std::make_unique<State>();
  st->plan = &plan;
  st->arena_mark = arena_.persistent_mark();
  st->prepare_slots(kPreparedSlots);
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
  KIMIRT_CHECK(state_, "device load target: write() without begin()");
  State& st = *state_;
  KIMIRT_ASSERT(w.dest < st.dest.size());
  const model::PlannedDest& dest = st.plan->dests()[w.dest];
  if (w.rows == 0 || w.width == 0) return;
  KIMIRT_ASSERT(w.dst_offset + (w.rows - 1) * w.dst_pitch + w.width <= dest.bytes);
  uint8_t* dst = st.dest[w.dest] + w.dst_offset;
  const int slot = w.staging_slot;
  cudaStream_t stream = streams_[slot >= 0 ? static_cast<size_t>(slot) % streams_.size() : 0];
  // The I/O threads call this with device 0 current; the streams and events belong to device_. Not a
  // restoring guard: switching these threads back would open a context on device 0 (see DeviceGuard).
  set_current_device(device_);
  try {
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
    // concurrently; the lock only protects growing the table.
    std::lock_guard<std::mutex> lock(st.mutex);
    const auto s = static_cast<size_t>(slot);
    st.prepare_slots(s + 1);
    st.slots[s].event.record(stream);
    st.slots[s].recorded = true;
  } catch (...) {
    // A copy issued here (or by an earlier write from this buffer) may still read `w.src`, and without a
    // recorded event fence() would not wait for it: the engine could then reuse or free the buffer under it.
    (void)cudaStreamSynchronize(stream);
    throw;
  }
}

void DeviceLoadTarget::fence(int staging_slot) {
  if (!state_ || staging_slot < 0) return;
  cudaEvent_t e = nullptr;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    const auto s = static_cast<size_t>(staging_slot);
    if (s < state_->slots.size() && state_->slots[s].recorded) e = state_->slots[s].event.get();
  }
  // No device switch: cudaEventSynchronize accepts an event of any device, and fence() also runs on the
  // loader's own thread (the engine's final fences), whose current device is the caller's to keep.
  if (e) KIMIRT_CUDA_CHECK(cudaEventSynchronize(e));
}

void DeviceLoadTarget::finish() {
  KIMIRT_CHECK(state_, "device load target: finish() without begin()");
  const DeviceGuard on_device(device_);
  for (const Stream& s : streams_) s.synchronize();
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
  // Without a load in progress there is nothing of "this load" to drop; a finished, un-taken store stays.
  if (!state_) return;
  const DeviceGuard on_device(device_, std::nothrow);
  // Copies still in flight read staging memory and write the arena: let them land before either goes.
  for (const Stream& s : streams_) (void)cudaStreamSynchronize(s);
  (void)cudaGetLastError();
  try {
    arena_.rewind_persistent(state_->arena_mark);
  } catch (...) {  // only if someone reset the arena under the load; nothing is left to return then
  }
  state_.reset();
  store_ = DeviceParamStore();
}

DeviceParamStore DeviceLoadTarget::take() {
  // Explicitly emptied: begin() reads an empty store as "taken", and a moved-from map need not be empty.
  DeviceParamStore out = std::move(store_);
  store_ = DeviceParamStore();
  return out;
}

}  // namespace kimirt::cuda
