// The CPU backend refuses what it cannot run, with errors that name the parameter, the field or the
// sequence, and a refused step leaves the caches as they were.
#include "kimirt/runtime/cpu_backend.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/error_of.h"
#include "kimirt/base/memory_info.h"
#include "runtime/test_util.h"

namespace kimirt::runtime {
namespace {

using ::testing::HasSubstr;
using testing::RandomModel;

// A copy of `from` without the parameter `skip`, and with `reshape` (if named) given a wrong shape.
model::ParamStore edited(const model::ParamStore& from, const std::string& skip, const std::string& reshape = "") {
  model::ParamStore out;
  for (const auto& [name, p] : from.params()) {
    if (name == skip) continue;
    model::LoadedParam q;
    q.spec = p.spec;
    q.format = p.format;
    q.shape = p.shape;
    q.component_ids = p.component_ids;
    for (const auto& t : p.components) q.components.push_back(t.clone());
    if (name == reshape) {
      q.shape[0] -= 1;
      q.components[0] = Tensor(DType::kF32, q.shape);
    }
    out.put(name, std::move(q));
  }
  return out;
}

using ::kimirt::test::error_of;

TEST(CpuBackend, AMissingParameterIsNamed) {
  const RandomModel m(testing::k3_tiny_config(), 1);
  const auto store = edited(m.store(), "model.layers.2.self_attn.dt_bias");
  SingleComm comm;
  EXPECT_THAT(error_of([&] { CpuBackend(m.config(), store, comm, {}, testing::small_cache()); }),
              HasSubstr("model.layers.2.self_attn.dt_bias"));
}

TEST(CpuBackend, AWrongShapeIsNamed) {
  const RandomModel m(testing::kl_tiny_config(), 1);
  const auto store = edited(m.store(), "", "model.layers.3.self_attn.kv_b_proj.weight");
  SingleComm comm;
  const auto msg = error_of([&] { CpuBackend(m.config(), store, comm, {}, testing::small_cache()); });
  EXPECT_THAT(msg, HasSubstr("model.layers.3.self_attn.kv_b_proj.weight"));
  EXPECT_THAT(msg, HasSubstr("[127, 32]"));
}

// A cache the machine cannot hold is refused before anything is allocated, with its size: under Linux's
// overcommit the allocation could succeed and the kernel end the process while the zeros are written.
TEST(CpuBackend, ACacheBeyondTheAvailableMemoryIsRefusedBeforeAllocating) {
  const auto available = available_memory_bytes();
  if (!available) GTEST_SKIP() << "this system does not say how much memory is available";
  const RandomModel m(testing::k3_tiny_config(), 1);
  const CacheConfig cache{1, 64, 1 << 30};  // 2^36 positions: terabytes for any MLA layer
  SingleComm comm;
  try {
    CpuBackend(m.config(), m.store(), comm, {}, cache);
    ADD_FAILURE() << "a cache of 2^36 positions was made";
  } catch (const OutOfMemory& e) {
    EXPECT_THAT(e.what(), HasSubstr("a cache of 68719476736 positions (1 sequences) needs"));
    EXPECT_THAT(e.what(), HasSubstr("GiB of memory available"));
  }
}

TEST(CpuBackend, TheCommunicatorMustMatchTheMapping) {
  const RandomModel m(testing::k3_tiny_config(), 1);
  const auto mapping = model::ParallelMapping::make(2, 0);
  SingleComm comm;
  EXPECT_THAT(error_of([&] { CpuBackend(m.config(), m.store(mapping), comm, mapping, testing::small_cache()); }),
              HasSubstr("communicator"));
}

TEST(CpuBackend, TheAllToAllMoeNeedsWholeExpertsPerRank) {
  const RandomModel m(testing::k3_tiny_config(), 1);
  const auto mapping = model::ParallelMapping::make(2, 0, 1);  // MoE-TP: every expert cut in two
  SingleComm comm;
  EXPECT_THAT(error_of([&] {
                CpuBackend(m.config(), m.store(mapping), comm, mapping, testing::small_cache(), MoeComm::kAllToAll);
              }),
              HasSubstr("--moe-comm all_to_all"));
}

TEST(CpuBackend, ABadCacheConfigIsNamed) {
  const RandomModel m(testing::k3_tiny_config(), 1);
  SingleComm comm;
  EXPECT_THAT(error_of([&] {
                CpuBackend(m.config(), m.store(), comm, {}, CacheConfig{0, 16, 8});
              }),
              HasSubstr("max_sequences"));
}

TEST(CpuBackend, BadStepsAreRefusedBeforeAnythingChanges) {
  const RandomModel m(testing::k3_tiny_config(), 2);
  testing::TestBackend t(m);
  Backend& be = t.backend;
  const CacheConfig cc = be.cache_config();
  const auto ids = testing::random_ids(10, m.config().vocab_size, 3);
  const auto first = testing::run_one(be, ids, 0, 0);
  Forward fwd(be);

  auto refused = [&](StepBatch& b) { return error_of([&] { fwd.run(b); }); };
  {
    StepBatch b;
    b.add(std::vector<int32_t>{5, static_cast<int32_t>(m.config().vocab_size)}, 10, 0, testing::blocks_of(0, cc),
          LogitRows::kLast);
    EXPECT_THAT(refused(b), HasSubstr("outside the vocabulary"));
  }
  {
    StepBatch b;
    b.add(std::vector<int32_t>{5}, 10, 0, {}, LogitRows::kLast);
    EXPECT_THAT(refused(b), HasSubstr("needs 1 cache blocks for 11 tokens"));
  }
  {
    StepBatch b;
    b.add(std::vector<int32_t>{5}, 10, cc.max_sequences, testing::blocks_of(0, cc), LogitRows::kLast);
    EXPECT_THAT(refused(b), HasSubstr("KDA slot"));
  }
  {
    StepBatch b;
    b.add(std::vector<int32_t>{5}, 10, 0, testing::blocks_of(0, cc), LogitRows::kLast);
    b.add(std::vector<int32_t>{6}, 3, 0, testing::blocks_of(1, cc), LogitRows::kLast);
    EXPECT_THAT(refused(b), HasSubstr("reuses KDA slot 0"));
  }
  {
    StepBatch b;
    b.add(std::vector<int32_t>{5}, 10, 0, testing::blocks_of(0, cc), LogitRows::kLast);
    b.add(std::vector<int32_t>{6}, 3, 1, testing::blocks_of(0, cc), LogitRows::kLast);
    EXPECT_THAT(refused(b), HasSubstr("cache block 0 is used twice"));
  }
  // Nothing of the refused steps reached the cache: continuing gives what a fresh run gives.
  const auto next = testing::run_one(be, {ids[0]}, 10, 0, LogitRows::kLast);
  testing::TestBackend fresh(m);
  testing::run_one(fresh.backend, ids, 0, 0);
  EXPECT_EQ(next, testing::run_one(fresh.backend, {ids[0]}, 10, 0, LogitRows::kLast));
  EXPECT_FALSE(first.empty());
}

}  // namespace
}  // namespace kimirt::runtime
