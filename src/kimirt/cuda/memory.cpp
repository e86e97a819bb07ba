// Device arena and memory plan.
#include "kimirt/cuda/memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <map>
#include <utility>

#include "kimirt/base/error.h"
#include "kimirt/cuda/check.h"

namespace kimirt::cuda {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = 1024.0 * kMiB;

std::string human(uint64_t bytes) {
  if (bytes >= (1ull << 30)) return fmt::format("{:.2f} GiB", bytes / kGiB);
  if (bytes >= (1ull << 20)) return fmt::format("{:.1f} MiB", bytes / kMiB);
  return fmt::format("{} B", bytes);
}

bool valid_alignment(uint64_t a) { return a != 0 && (a & (a - 1)) == 0; }

// The offset past `used` in a region starting at `region` whose address is a multiple of `alignment`: the
// regions themselves are only 256-byte aligned (cudaMalloc's base, capacities rounded to 256), so aligning the
// offset alone would not align the address for larger alignments.
uint64_t aligned_offset(const uint8_t* region, uint64_t used, uint64_t alignment) {
  const uint64_t start = reinterpret_cast<uintptr_t>(region);
  return align_up(start + used, std::max(alignment, uint64_t{16})) - start;
}

}  // namespace

DeviceBuffer::DeviceBuffer(uint64_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  KIMIRT_CUDA_CHECK(cudaMalloc(&data_, bytes));
}

DeviceBuffer::~DeviceBuffer() {
  if (data_) (void)cudaFree(data_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  std::swap(data_, other.data_);
  std::swap(size_, other.size_);
  return *this;
}

MemoryBudget parse_memory_budget(std::string_view text, MemoryBudget base) {
  // Spaces around the text and between the number and its unit ("512 MiB"), nowhere else: "1 28GiB" is not 128 GiB.
  const auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  std::string_view t = text;
  while (!t.empty() && space(t.front())) t.remove_prefix(1);
  while (!t.empty() && space(t.back())) t.remove_suffix(1);
  KIMIRT_CHECK(!t.empty(), "GPU memory budget: empty value (expected e.g. \"90%\" or \"120GiB\")");
  double value = 0.0;
  const char* first = t.data();
  const char* last = t.data() + t.size();
  const auto [ptr, ec] = std::from_chars(first, last, value);
  KIMIRT_CHECK(ec == std::errc() && ptr != first && std::isfinite(value) && value > 0.0,
               "GPU memory budget \"{}\": expected a positive number followed by % or a size unit", text);
  const char* unit_start = ptr;
  while (unit_start != last && space(*unit_start)) ++unit_start;
  std::string unit(unit_start, last);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (unit == "%") {
    KIMIRT_CHECK(value <= 100.0, "GPU memory budget \"{}\": a percentage must be at most 100", text);
    base.fraction = value / 100.0;
    base.max_bytes = 0;
    return base;
  }
  double scale = 0.0;
  if (unit.empty() || unit == "b") {
    scale = 1.0;
  } else if (unit == "k" || unit == "kib" || unit == "kb") {
    scale = 1024.0;
  } else if (unit == "m" || unit == "mib" || unit == "mb") {
    scale = kMiB;
  } else if (unit == "g" || unit == "gib" || unit == "gb") {
    scale = kGiB;
  } else if (unit == "t" || unit == "tib" || unit == "tb") {
    scale = kGiB * 1024.0;
  } else {
    fail("GPU memory budget \"{}\": unknown unit \"{}\" (use %, B, KiB, MiB, GiB or TiB)", text, unit);
  }
  const double bytes = value * scale;
  // Converting a double at or beyond 2^64 to uint64_t is undefined.
  KIMIRT_CHECK(bytes < 18446744073709551616.0, "GPU memory budget \"{}\": {:g} bytes is not below 2^64", text, bytes);
  // Below one byte the size would truncate to 0, which means "no limit": "0.9" (a fraction written without %)
  // would hand out the whole GPU. No budget under 1 MiB can hold anything, so a size that small is a typo.
  KIMIRT_CHECK(bytes >= kMiB,
               "GPU memory budget \"{}\": {:g} bytes is less than 1 MiB (for a fraction of the GPU write a "
               "percentage, e.g. \"90%\")",
               text, bytes);
  base.max_bytes = static_cast<uint64_t>(bytes);
  base.fraction = 1.0;
  return base;
}

MemoryPlan plan_memory(const DeviceInfo& device, const MemoryBudget& budget) {
  KIMIRT_CHECK(budget.fraction > 0.0 && budget.fraction <= 1.0, "GPU memory budget: fraction {} is not in (0, 1]",
               budget.fraction);
  MemoryPlan plan;
  plan.device = device;
  plan.budget = budget;
  const uint64_t free_after_reserve =
      device.free_memory > budget.reserve_bytes ? device.free_memory - budget.reserve_bytes : 0;
  uint64_t usable = std::min<uint64_t>(
      free_after_reserve, static_cast<uint64_t>(budget.fraction * static_cast<double>(device.total_memory)));
  if (budget.max_bytes) usable = std::min(usable, budget.max_bytes);
  usable = usable / kArenaAlignment * kArenaAlignment;
  const uint64_t step = align_up(budget.step_bytes, kArenaAlignment);
  const uint64_t workspace = align_up(budget.workspace_bytes, kArenaAlignment);
  KIMIRT_CHECK(usable >= step + workspace,
               "GPU memory budget: {} usable on {} ({} free, reserve {}) does not hold the step region ({}) and "
               "the cuBLASLt workspace ({})",
               human(usable), device.name, human(device.free_memory), human(budget.reserve_bytes), human(step),
               human(workspace));
  plan.arena_bytes = usable;
  plan.step_bytes = step;
  plan.workspace_bytes = workspace;
  plan.persistent_bytes = usable - step;
  return plan;
}

std::string memory_plan_text(const MemoryPlan& plan) {
  std::string limit = fmt::format("{:.0f}% of total", plan.budget.fraction * 100.0);
  if (plan.budget.max_bytes) limit = fmt::format("at most {}", human(plan.budget.max_bytes));
  return fmt::format(
      "GPU memory plan for device {}, {} ({} total, {} free at start)\n"
      "  budget: {}, keeping {} free for the CUDA context, cuBLASLt and NCCL\n"
      "  arena: {} in one allocation\n"
      "    persistent (weights, caches, workspace): {}\n"
      "      cuBLASLt workspace: {}\n"
      "      weights and caches: {}\n"
      "    step (activations, reset every step): {}\n",
      plan.device.ordinal, plan.device.name, human(plan.device.total_memory), human(plan.device.free_memory), limit,
      human(plan.budget.reserve_bytes), human(plan.arena_bytes), human(plan.persistent_bytes),
      human(plan.workspace_bytes), human(plan.persistent_bytes - plan.workspace_bytes), human(plan.step_bytes));
}

DeviceArena::DeviceArena(const MemoryPlan& plan) : device_(plan.device.ordinal) {
  // The plan was sized from this device's free memory; the caller's current device may be another one.
  const DeviceGuard on_device(device_);
  init(plan.persistent_bytes, plan.step_bytes);
}

DeviceArena::DeviceArena(uint64_t persistent_bytes, uint64_t step_bytes) : device_(current_device()) {
  init(persistent_bytes, step_bytes);
}

void DeviceArena::init(uint64_t persistent_bytes, uint64_t step_bytes) {
  // Rounded and summed without wrapping: a wrapped total would allocate less than the regions describe.
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max() - kArenaAlignment;
  KIMIRT_CHECK(persistent_bytes <= kMax && step_bytes <= kMax, "device arena: region sizes {} and {} are too large",
               persistent_bytes, step_bytes);
  persistent_capacity_ = align_up(persistent_bytes, kArenaAlignment);
  step_capacity_ = align_up(step_bytes, kArenaAlignment);
  KIMIRT_CHECK(persistent_capacity_ <= kMax - step_capacity_, "device arena: region sizes {} and {} are too large",
               persistent_bytes, step_bytes);
  const uint64_t total = persistent_capacity_ + step_capacity_;
  KIMIRT_CHECK(total > 0, "device arena: both regions are empty");
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, total);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    (void)cudaMemGetInfo(&free_bytes, &total_bytes);
    fail("device arena: cudaMalloc of {} failed ({}); {} of {} free", human(total), cudaGetErrorString(err),
         human(free_bytes), human(total_bytes));
  }
  base_ = static_cast<uint8_t*>(p);
}

DeviceArena::~DeviceArena() {
  if (!base_) return;
  const DeviceGuard on_device(device_, std::nothrow);
  (void)cudaFree(base_);
}

void DeviceArena::fail_count(uint64_t count, uint64_t element_bytes, std::string_view label) {
  // A count with the top bit set is far more likely a negative int64 than a real request: show it as such.
  if (count > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    fail("device arena: \"{}\" asks for {} elements of {} bytes (a negative count)", label, static_cast<int64_t>(count),
         element_bytes);
  }
  fail("device arena: \"{}\" asks for {} elements of {} bytes, more than 2^63 bytes", label, count, element_bytes);
}

void* DeviceArena::allocate_persistent(uint64_t bytes, std::string_view label, uint64_t alignment) {
  KIMIRT_CHECK(valid_alignment(alignment), "device arena: alignment {} for \"{}\" is not a power of two", alignment,
               label);
  const uint64_t offset = aligned_offset(base_, persistent_used_, alignment);
  KIMIRT_CHECK(offset <= persistent_capacity_ && bytes <= persistent_capacity_ - offset,
               "device arena: \"{}\" needs {} but the persistent region has {} of {} left (raise the GPU memory "
               "budget or lower the cache size)",
               label, human(bytes), human(persistent_capacity_ - std::min(offset, persistent_capacity_)),
               human(persistent_capacity_));
  persistent_used_ = offset + bytes;
  items_.push_back({std::string(label), offset, bytes});
  return base_ + offset;
}

void DeviceArena::reset_persistent() {
  persistent_used_ = 0;
  items_.clear();
}

void DeviceArena::rewind_persistent(uint64_t mark) {
  KIMIRT_ASSERT(mark <= items_.size());
  if (mark == items_.size()) return;
  persistent_used_ = mark > 0 ? items_[mark - 1].offset + items_[mark - 1].bytes : 0;
  items_.resize(mark);
}

void* DeviceArena::allocate_step(uint64_t bytes, std::string_view label, uint64_t alignment) {
  KIMIRT_CHECK(valid_alignment(alignment), "device arena: alignment {} for \"{}\" is not a power of two", alignment,
               label);
  const uint64_t offset = aligned_offset(base_ + persistent_capacity_, step_used_, alignment);
  KIMIRT_CHECK(offset <= step_capacity_ && bytes <= step_capacity_ - offset,
               "device arena: step buffer \"{}\" needs {} but the step region has {} of {} left (the batch is "
               "larger than the step region was sized for)",
               label, human(bytes), human(step_capacity_ - std::min(offset, step_capacity_)), human(step_capacity_));
  step_used_ = offset + bytes;
  step_high_water_ = std::max(step_high_water_, step_used_);
  return base_ + persistent_capacity_ + offset;
}

void DeviceArena::rewind(uint64_t mark) {
  KIMIRT_ASSERT(mark <= step_used_);
  step_used_ = mark;
}

std::string DeviceArena::plan_text() const {
  // Group by label so that 93 layers of "layer.N.q_proj" do not flood the text: the label up to the
  // first digit run is the group key.
  std::map<std::string, std::pair<uint64_t, uint64_t>> groups;  // key -> (count, bytes)
  for (const Item& item : items_) {
    std::string key;
    for (size_t i = 0; i < item.label.size(); ++i) {
      if (std::isdigit(static_cast<unsigned char>(item.label[i]))) {
        key += 'N';
        while (i + 1 < item.label.size() && std::isdigit(static_cast<unsigned char>(item.label[i + 1]))) ++i;
      } else {
        key += item.label[i];
      }
    }
    auto& g = groups[key];
    g.first += 1;
    g.second += item.bytes;
  }
  std::string out =
      fmt::format("device arena: {} persistent ({} used, {} free), {} step (high water {})\n",
                  human(persistent_capacity_), human(persistent_used_), human(persistent_capacity_ - persistent_used_),
                  human(step_capacity_), human(step_high_water_));
  for (const auto& [key, g] : groups) {
    out += fmt::format("  {:<48} {:>6} x  {:>12}\n", key, g.first, human(g.second));
  }
  return out;
}

}  // namespace kimirt::cuda
