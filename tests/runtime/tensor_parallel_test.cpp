// The CPU backend sharded over tp ranks (threads sharing memory through LocalComm, each with its slice of
// a random model cut by model/parallel) gives the tp = 1 logits: the reductions sit where the model needs
// them (KDA/MLA o_proj, dense down_proj on its TP subgroup, one combined MoE reduction, LM-head gather).
#include <gtest/gtest.h>

#include <thread>

#include "kimirt/comm/local_comm.h"
#include "runtime/test_util.h"

namespace kimirt::runtime {
namespace {

using testing::RandomModel;

// Prefill of 20 tokens (every row), then three decode steps; the logits of every step, concatenated.
std::vector<float> run_steps(Backend& backend, const std::vector<int32_t>& ids) {
  std::vector<float> out = testing::run_one(backend, {ids.begin(), ids.begin() + 20}, 0, 1);
  for (int64_t p = 20; p < 23; ++p) {
    const auto row = testing::run_one(backend, {ids[static_cast<size_t>(p)]}, p, 1, LogitRows::kLast);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

// Runs every rank on its own thread; returns each rank's logits.
std::vector<std::vector<float>> run_sharded(const RandomModel& m, int tp, int ep, const std::vector<int32_t>& ids) {
  auto comms = LocalComm::create_group(tp);
  std::vector<std::vector<float>> out(static_cast<size_t>(tp));
  std::vector<std::string> errors(static_cast<size_t>(tp));
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; ++r) {
    threads.emplace_back([&, r] {
      try {
        const auto mapping = model::ParallelMapping::make(tp, r, ep);
        CpuBackend backend(m.config(), m.store(mapping), *comms[static_cast<size_t>(r)], mapping,
                           testing::small_cache());
        out[static_cast<size_t>(r)] = run_steps(backend, ids);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < tp; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  return out;
}

void expect_sharded_matches(const model::ModelConfig& config, int tp, int ep) {
  const RandomModel m(config, 21);
  const auto ids = testing::random_ids(23, config.vocab_size, 22);
  testing::TestBackend single(m);
  const auto ref = run_steps(single.backend, ids);
  const auto ranks = run_sharded(m, tp, ep, ids);
  for (int r = 0; r < tp; ++r) {
    // Partial sums add up in another order than the unsharded products: rounding-level differences.
    EXPECT_LE(testing::rel_error(ranks[static_cast<size_t>(r)], ref), 1e-5)
        << "tp " << tp << " ep " << ep << " rank " << r;
    EXPECT_EQ(ranks[static_cast<size_t>(r)], ranks[0]) << "ranks disagree (rank " << r << ")";
  }
}

TEST(TensorParallel, KimiK3MatchesOneRank) {
  const auto c = testing::k3_tiny_config();
  expect_sharded_matches(c, 2, 1);  // MoE-TP: every expert cut by intermediate rows
  expect_sharded_matches(c, 2, 2);  // EP: experts 0-7 and 8-15
  expect_sharded_matches(c, 4, 2);  // both
}

TEST(TensorParallel, KimiLinearMatchesOneRank) {
  const auto c = testing::kl_tiny_config();
  expect_sharded_matches(c, 2, 2);
  expect_sharded_matches(c, 4, 1);
}

TEST(TensorParallel, DenseMlpOnASubgroupWhenTpDoesNotDivideItsWidth) {
  auto c = testing::k3_tiny_config();
  c.intermediate_size = 514;  // 4 does not divide it, 2 does: two subgroups of two ranks
  ASSERT_EQ(model::mlp_tp_size(4, c.intermediate_size), 2);
  expect_sharded_matches(c, 4, 4);
}

}  // namespace
}  // namespace kimirt::runtime
