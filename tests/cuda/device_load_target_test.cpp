// The loader's device upload target: testdata/k3-tiny loaded through model::load_into into device memory must
// hold, destination by destination, exactly the bytes the host load (load_params) holds, at tp 1 and for a
// rank of tp 2, with staging buffers small enough that they are fenced and reused many times, also onto a GPU
// other than the loading threads' current one; a load that fails part-way returns every byte of arena memory
// it took.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <optional>

#include "kimirt/base/error.h"
#include "kimirt/cuda/device_load_target.h"
#include "kimirt/io/checkpoint.h"
#include "kimirt/model/loader.h"
#include "test_util.h"

namespace kimirt::cuda {
namespace {

struct Opened {
  io::Checkpoint checkpoint;
  model::ModelConfig config;
  std::unique_ptr<model::Schema> schema;
};

Opened open_k3_tiny() {
  const auto dir = std::filesystem::path(KIMIRT_TESTDATA_DIR) / "k3-tiny";
  io::Checkpoint c = io::Checkpoint::open(dir);
  model::ModelConfig config = model::ModelConfig::from_json(c.config());
  auto schema = std::make_unique<model::Schema>(model::Schema::for_checkpoint(config, model::checkpoint_keys(c)));
  return {std::move(c), std::move(config), std::move(schema)};
}

model::LoadOptions options(uint64_t staging) {
  model::LoadOptions o;
  o.staging_bytes = staging;
  o.io_threads = 3;
  o.progress = false;
  return o;
}

std::vector<uint8_t> device_bytes(const DeviceComponent& c) {
  std::vector<uint8_t> out(c.bytes);
  // Default: the component may live on a device other than the current one.
  if (c.bytes) KIMIRT_CUDA_CHECK(cudaMemcpy(out.data(), c.data, c.bytes, cudaMemcpyDefault));
  return out;
}

// The arena is made on `device`; the target and the load then run with the test thread's current device
// (and the I/O threads' device 0) wherever the arena is.
void expect_same_as_host(const Opened& o, const model::ParallelMapping& mapping, uint64_t staging, int device = 0) {
  SCOPED_TRACE(mapping.str() + ", staging " + std::to_string(staging) + ", device " + std::to_string(device));
  const model::ParamStore host = model::load_params(o.checkpoint, *o.schema, mapping, options(1ull << 30));
  const int current = current_device();
  // The thread uses its current device, so the guards below restore it (one never used would stay unrestored:
  // Device.AThreadThatNeverUsedItsDeviceGrowsNoContextThere).
  KIMIRT_CUDA_CHECK(cudaFree(nullptr));
  std::optional<DeviceArena> arena;
  {
    const DeviceGuard on_device(device);
    arena.emplace(host.total_bytes() + (64ull << 20), 0);
    // Poisoned, so that a load writing nothing cannot pass on bytes an earlier load left in the same memory.
    const uint64_t mark = arena->persistent_mark(), all = arena->persistent_capacity();
    KIMIRT_CUDA_CHECK(cudaMemset(arena->allocate_persistent(all, "poison", 256), 0xFF, all));
    KIMIRT_CUDA_CHECK(cudaDeviceSynchronize());
    arena->rewind_persistent(mark);
  }
  ASSERT_EQ(arena->device(), device);
  DeviceLoadTarget target(*arena);
  model::load_into(target, o.checkpoint, *o.schema, mapping, options(staging));
  EXPECT_EQ(current_device(), current);
  const DeviceParamStore dev = target.take();
  ASSERT_EQ(dev.size(), host.size());
  EXPECT_EQ(dev.total_bytes(), host.total_bytes());
  for (const auto& [name, p] : host.params()) {
    const DeviceParam& d = dev.at(name);
    EXPECT_EQ(d.spec, p.spec) << name;
    EXPECT_EQ(d.format, p.format) << name;
    EXPECT_EQ(d.shape, p.shape) << name;
    ASSERT_EQ(d.components.size(), p.components.size()) << name;
    for (size_t i = 0; i < p.components.size(); ++i) {
      const DeviceComponent& c = d.components[i];
      const Tensor& t = p.components[i];
      EXPECT_EQ(c.component_id, p.component_ids[i]) << name;
      EXPECT_EQ(c.dtype, t.dtype()) << name;
      EXPECT_EQ(c.shape, t.shape()) << name;
      ASSERT_EQ(c.bytes, t.nbytes()) << name;
      const auto* h = static_cast<const uint8_t*>(t.data());
      EXPECT_TRUE(device_bytes(c) == std::vector<uint8_t>(h, h + t.nbytes())) << name << " component " << i;
      if (c.bytes) {
        cudaPointerAttributes attr{};
        KIMIRT_CUDA_CHECK(cudaPointerGetAttributes(&attr, c.data));
        EXPECT_EQ(attr.device, device) << name;
      }
    }
  }
}

TEST(DeviceLoadTarget, K3TinyMatchesTheHostLoadByteForByte) {
  KIMIRT_REQUIRE_GPU();
  const Opened o = open_k3_tiny();
  // 64 KiB of staging: every large tensor arrives in pieces, and each buffer is fenced before reuse.
  expect_same_as_host(o, model::ParallelMapping{}, 64 << 10);
  expect_same_as_host(o, model::ParallelMapping{}, 1ull << 30);
  expect_same_as_host(o, model::ParallelMapping::make(2, 1), 96 << 10);
}

// The loader's I/O threads have device 0 current. A target on another GPU used to record its slot events
// (created on device 0) on its own streams, which fails: fences then did not wait, and staging buffers could
// be freed under running copies.
TEST(DeviceLoadTarget, LoadsOntoAGpuOtherThanTheCurrentOne) {
  KIMIRT_REQUIRE_TWO_GPUS();
  const Opened o = open_k3_tiny();
  expect_same_as_host(o, model::ParallelMapping{}, 64 << 10, 1);
}

// Fails the load after some writes have been issued: the loader abandons, the arena gets its memory back
// (allocations made before the load stay), and the target holds nothing.
class FailingTarget final : public model::LoadTarget {
 public:
  FailingTarget(DeviceArena& arena, int fail_after) : inner_(arena), fail_after_(fail_after) {}
  io::StagingAllocator* staging_allocator() override { return inner_.staging_allocator(); }
  bool writes_async() const override { return true; }
  void begin(const model::LoadPlan& plan) override { inner_.begin(plan); }
  void write(const model::StagedWrite& w) override {
    if (writes_.fetch_add(1) == fail_after_) fail("injected failure after {} writes", fail_after_);
    inner_.write(w);
  }
  void fence(int slot) override { inner_.fence(slot); }
  void finish() override { inner_.finish(); }
  void abandon() noexcept override { inner_.abandon(); }
  DeviceLoadTarget inner_;

 private:
  int fail_after_;
  std::atomic<int> writes_{0};
};

TEST(DeviceLoadTarget, AFailedLoadReturnsItsMemory) {
  KIMIRT_REQUIRE_GPU();
  const Opened o = open_k3_tiny();
  DeviceArena arena(64ull << 20, 0);
  void* before = arena.allocate_persistent(1000, "kv cache allocated before the load");
  const uint64_t used = arena.persistent_used();
  FailingTarget target(arena, 25);
  try {
    model::load_into(target, o.checkpoint, *o.schema, model::ParallelMapping{}, options(64 << 10));
    ADD_FAILURE() << "the injected failure did not surface";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("injected failure"), std::string::npos) << e.what();
  }
  EXPECT_EQ(arena.persistent_used(), used);
  EXPECT_EQ(target.inner_.take().size(), 0u);
  EXPECT_EQ(arena.allocate_persistent(1000, "next"), static_cast<uint8_t*>(before) + 1024);
}

// A finished load is committed: a second begin() before take() must neither drop it silently (its arena
// memory would be lost) nor rewind it (the arena may hold later allocations above it).
TEST(DeviceLoadTarget, BeginRefusesWhileAFinishedLoadWasNotTaken) {
  KIMIRT_REQUIRE_GPU();
  const Opened o = open_k3_tiny();
  DeviceArena arena(64ull << 20, 0);
  DeviceLoadTarget target(arena);
  model::load_into(target, o.checkpoint, *o.schema, model::ParallelMapping{}, options(1ull << 30));
  const uint64_t used = arena.persistent_used();
  try {
    model::load_into(target, o.checkpoint, *o.schema, model::ParallelMapping{}, options(1ull << 30));
    ADD_FAILURE() << "a second load started over an un-taken one";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("take()"), std::string::npos) << e.what();
  }
  EXPECT_EQ(arena.persistent_used(), used);
  const DeviceParamStore first = target.take();
  EXPECT_GT(first.size(), 0u);
  model::load_into(target, o.checkpoint, *o.schema, model::ParallelMapping{}, options(1ull << 30));
  EXPECT_EQ(target.take().size(), first.size());
}

TEST(DeviceLoadTarget, ACheckpointLargerThanTheArenaFailsBeforeReading) {
  KIMIRT_REQUIRE_GPU();
  const Opened o = open_k3_tiny();
  DeviceArena arena(1 << 20, 0);
  DeviceLoadTarget target(arena);
  try {
    model::load_into(target, o.checkpoint, *o.schema, model::ParallelMapping{}, options(64 << 10));
    ADD_FAILURE() << "a 9 MB checkpoint fit a 1 MiB arena";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("persistent region"), std::string::npos) << e.what();
  }
  EXPECT_EQ(arena.persistent_used(), 0u);
}

}  // namespace
}  // namespace kimirt::cuda
