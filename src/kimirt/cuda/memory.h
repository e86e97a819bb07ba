// Device memory: one allocation at start-up, carved by bump allocation. No cudaMalloc happens inside a
// step (it synchronizes the device and fragments memory over a long-running server).
//
//   [ persistent region: weights, KV/state caches, cuBLASLt workspace | step region: activations ]
//
// The persistent region only grows (until reset_persistent()); the step region is a stack that the
// forward rewinds to a mark (or resets) every step. The arena is used by one engine thread; it is not
// thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "kimirt/cuda/device.h"

namespace kimirt::cuda {

inline constexpr uint64_t kArenaAlignment = 256;  // cuBLASLt and TMA are happy with 256-byte starts
// x rounded up to a multiple of a: what an arena allocation of x bytes at alignment a can take (sizing a
// region that several allocations share).
inline constexpr uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// Owning cudaMalloc'ed memory for set-up time, tests and benchmarks (never inside a step).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(uint64_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept : data_(other.data_), size_(other.size_) {
    other.data_ = nullptr;
    other.size_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  uint64_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  uint64_t size_ = 0;
};

// How much of the device kimirt may take. The usable size is the smallest of: free memory minus
// reserve_bytes, fraction × total memory, and max_bytes (when non-zero).
struct MemoryBudget {
  double fraction = 0.90;
  uint64_t max_bytes = 0;
  uint64_t reserve_bytes = 1ull << 30;     // CUDA context, cuBLASLt handles, NCCL buffers, graphs
  uint64_t step_bytes = 4ull << 30;        // activations of the largest step
  uint64_t workspace_bytes = 64ull << 20;  // cuBLASLt (64 MiB is what the FP8 block-scale GEMM wants)
};

// Parses a budget flag: "90%" (fraction of total memory) or a size "120GiB", "120G", "512MiB", "4294967296"
// (bytes). A size must be at least 1 MiB and below 2^64 bytes. Throws kimirt::Error naming the text.
MemoryBudget parse_memory_budget(std::string_view text, MemoryBudget base = {});

struct MemoryPlan {
  DeviceInfo device;
  MemoryBudget budget;
  uint64_t arena_bytes = 0;       // the one allocation
  uint64_t persistent_bytes = 0;  // weights + caches + workspace
  uint64_t step_bytes = 0;
  uint64_t workspace_bytes = 0;  // part of persistent
};

// Throws kimirt::Error when the budget leaves no room for the step region and the workspace.
MemoryPlan plan_memory(const DeviceInfo& device, const MemoryBudget& budget);

// The plan as text for `kimirt inspect --device` (before anything is allocated).
std::string memory_plan_text(const MemoryPlan& plan);

class DeviceArena {
 public:
  // Allocates plan.arena_bytes on plan.device. The current device is left as it was, unless it has no active
  // context in this process: then plan.device stays current (see DeviceGuard).
  explicit DeviceArena(const MemoryPlan& plan);
  // A plain arena of the given sizes on the current device (tests, benchmarks).
  DeviceArena(uint64_t persistent_bytes, uint64_t step_bytes);
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // Long-lived memory (weights, caches). `label` names the owner in errors and in plan_text().
  void* allocate_persistent(uint64_t bytes, std::string_view label, uint64_t alignment = kArenaAlignment);
  template <typename T>
  T* persistent(uint64_t count, std::string_view label) {
    return static_cast<T*>(allocate_persistent(array_bytes(count, sizeof(T), label), label));
  }
  void reset_persistent();
  // Persistent allocations made after persistent_mark() are dropped by rewind_persistent(mark): an
  // abandoned weight load leaves the caches allocated before it in place.
  uint64_t persistent_mark() const { return items_.size(); }
  void rewind_persistent(uint64_t mark);

  // Step memory: a stack. mark()/rewind() bracket a scope; reset_step() empties it at the start of a step.
  void* allocate_step(uint64_t bytes, std::string_view label, uint64_t alignment = kArenaAlignment);
  template <typename T>
  T* step(uint64_t count, std::string_view label) {
    return static_cast<T*>(allocate_step(array_bytes(count, sizeof(T), label), label));
  }
  uint64_t mark() const { return step_used_; }
  void rewind(uint64_t mark);
  void reset_step() { step_used_ = 0; }

  int device() const { return device_; }  // the ordinal the memory is on
  uint64_t persistent_capacity() const { return persistent_capacity_; }
  uint64_t persistent_used() const { return persistent_used_; }
  uint64_t step_capacity() const { return step_capacity_; }
  uint64_t step_used() const { return step_used_; }
  uint64_t step_high_water() const { return step_high_water_; }

  // The arena's current contents: persistent allocations by label, free space, step capacity and
  // high-water mark.
  std::string plan_text() const;

 private:
  struct Item {
    std::string label;
    uint64_t offset;
    uint64_t bytes;
  };
  void init(uint64_t persistent_bytes, uint64_t step_bytes);
  // count * element_bytes. A negative count (converted to uint64_t) or a huge one would wrap to a small
  // size, and the caller would overrun the buffer it got; no arena holds 2^63 bytes, so larger is refused.
  static uint64_t array_bytes(uint64_t count, uint64_t element_bytes, std::string_view label) {
    if (count > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / element_bytes) {
      fail_count(count, element_bytes, label);
    }
    return count * element_bytes;
  }
  [[noreturn]] static void fail_count(uint64_t count, uint64_t element_bytes, std::string_view label);

  int device_ = 0;
  uint8_t* base_ = nullptr;
  uint64_t persistent_capacity_ = 0;
  uint64_t persistent_used_ = 0;
  uint64_t step_capacity_ = 0;
  uint64_t step_used_ = 0;
  uint64_t step_high_water_ = 0;
  std::vector<Item> items_;
};

// A scope of step memory: what is taken from `arena`'s step region while it lives is given back when it
// ends, however it ends (an exception in a layer step leaves no scratch taken).
class StepScope {
 public:
  explicit StepScope(DeviceArena& arena) : arena_(arena), mark_(arena.mark()) {}
  // Only down: if the step region was reset inside the scope (below the mark), there is nothing to give back,
  // and a destructor must not throw.
  ~StepScope() {
    if (mark_ <= arena_.step_used()) arena_.rewind(mark_);
  }
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;

 private:
  DeviceArena& arena_;
  uint64_t mark_;
};

}  // namespace kimirt::cuda
