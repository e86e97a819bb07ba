// The CPU backend sharded over ranks (threads sharing memory through LocalComm, each with its slice of a
// random model cut by model/parallel) gives the tp = 1 logits on every path: the reductions sit where the
// model needs them (KDA/MLA o_proj, dense down_proj on its TP subgroup, the MoE block's collectives, the
// LM-head gather), and under attention-DP every rank gets its own sequences' logits, also when ranks have
// different numbers of tokens or none at all.
#include <gtest/gtest.h>

#include "kimirt/runtime/rank_group.h"
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
std::vector<std::vector<float>> run_sharded(const RandomModel& m, const ParallelConfig& pc,
                                            const std::vector<int32_t>& ids) {
  std::vector<std::vector<float>> out(static_cast<size_t>(pc.tp));
  run_local_ranks(pc.tp, [&](Comm& comm) {
    const auto mapping = pc.mapping(comm.rank());
    CpuBackend backend(m.config(), m.store(mapping), comm, mapping, testing::small_cache(), pc.moe_comm);
    out[static_cast<size_t>(comm.rank())] = run_steps(backend, ids);
  });
  return out;
}

void expect_sharded_matches(const model::ModelConfig& config, const ParallelConfig& pc) {
  const RandomModel m(config, 21);
  const auto ids = testing::random_ids(23, config.vocab_size, 22);
  testing::TestBackend single(m);
  const auto ref = run_steps(single.backend, ids);
  const auto ranks = run_sharded(m, pc, ids);
  for (int r = 0; r < pc.tp; ++r) {
    // Partial sums add up in another order than the unsharded products: rounding-level differences.
    EXPECT_LE(testing::rel_error(ranks[static_cast<size_t>(r)], ref), 1e-5) << pc.str() << ", rank " << r;
    EXPECT_EQ(ranks[static_cast<size_t>(r)], ranks[0]) << "ranks disagree (" << pc.str() << ", rank " << r << ")";
  }
}

TEST(TensorParallel, KimiK3MatchesOneRank) {
  const auto c = testing::k3_tiny_config();
  expect_sharded_matches(c, {2, 1});  // MoE-TP: every expert cut by intermediate rows
  expect_sharded_matches(c, {2, 2});  // EP: experts 0-7 and 8-15
  expect_sharded_matches(c, {4, 2});  // both
}

TEST(TensorParallel, KimiLinearMatchesOneRank) {
  const auto c = testing::kl_tiny_config();
  expect_sharded_matches(c, {2, 2});
  expect_sharded_matches(c, {4, 1});
}

TEST(TensorParallel, AllToAllMoeMatchesOneRank) {
  expect_sharded_matches(testing::k3_tiny_config(), {2, 2, false, MoeComm::kAllToAll});
  expect_sharded_matches(testing::k3_tiny_config(), {4, 4, false, MoeComm::kAllToAll});
  expect_sharded_matches(testing::kl_tiny_config(), {4, 4, false, MoeComm::kAllToAll});
}

TEST(TensorParallel, DenseMlpOnASubgroupWhenTpDoesNotDivideItsWidth) {
  auto c = testing::k3_tiny_config();
  c.intermediate_size = 514;  // 4 does not divide it, 2 does: two subgroups of two ranks
  ASSERT_EQ(model::mlp_tp_size(4, c.intermediate_size), 2);
  expect_sharded_matches(c, {4, 4});
}

TEST(TensorParallel, SharedExpertsOnASubgroupAddEachShardOnce) {
  auto c = testing::kl_tiny_config();
  c.moe_intermediate_size = 34;  // one shared expert of width 34: shards over 2 of the 4 ranks
  ASSERT_EQ(model::mlp_tp_size(4, c.shared_intermediate_size()), 2);
  expect_sharded_matches(c, {4, 4});
  expect_sharded_matches(c, {4, 4, false, MoeComm::kAllToAll});
}

// Attention-DP: rank r runs its own sequence (or nothing), each step on every rank together.
void expect_data_parallel_matches(const model::ModelConfig& config, int tp,
                                  const std::vector<int64_t>& prompt_lengths) {
  const RandomModel m(config, 23);
  const ParallelConfig pc{tp, tp, true};
  constexpr int kDecodes = 3;
  std::vector<std::vector<int32_t>> seqs;
  for (size_t r = 0; r < prompt_lengths.size(); ++r) {
    seqs.push_back(testing::random_ids(prompt_lengths[r] + kDecodes, config.vocab_size, 40 + static_cast<uint32_t>(r)));
  }
  // Each sequence alone on one rank: prefill (every row), then one token per step.
  auto steps = [&](Backend& be, const std::vector<int32_t>& ids, int64_t prompt, int step) {
    if (step == 0) return testing::run_one(be, {ids.begin(), ids.begin() + prompt}, 0, 0);
    const int64_t p = prompt + step - 1;
    return testing::run_one(be, {ids[static_cast<size_t>(p)]}, p, 0, LogitRows::kLast);
  };
  std::vector<std::vector<float>> ref(seqs.size());
  for (size_t s = 0; s < seqs.size(); ++s) {
    if (prompt_lengths[s] == 0) continue;
    testing::TestBackend single(m);
    for (int step = 0; step <= kDecodes; ++step) {
      const auto rows = steps(single.backend, seqs[s], prompt_lengths[s], step);
      ref[s].insert(ref[s].end(), rows.begin(), rows.end());
    }
  }
  std::vector<std::vector<float>> got(static_cast<size_t>(tp));
  run_local_ranks(tp, [&](Comm& comm) {
    const auto r = static_cast<size_t>(comm.rank());
    const auto mapping = pc.mapping(comm.rank());
    CpuBackend backend(m.config(), m.store(mapping), comm, mapping, testing::small_cache());
    const int64_t prompt = r < prompt_lengths.size() ? prompt_lengths[r] : 0;
    for (int step = 0; step <= kDecodes; ++step) {
      if (prompt == 0) {
        Forward(backend).run(StepBatch{});  // nothing of its own, but every collective needs it
        continue;
      }
      const auto rows = steps(backend, seqs[r], prompt, step);
      got[r].insert(got[r].end(), rows.begin(), rows.end());
    }
  });
  for (int r = 0; r < tp; ++r) {
    const auto ur = static_cast<size_t>(r);
    if (ur >= prompt_lengths.size() || prompt_lengths[ur] == 0) {
      EXPECT_TRUE(got[ur].empty());
      continue;
    }
    EXPECT_LE(testing::rel_error(got[ur], ref[ur]), 1e-5) << "tp " << tp << " attention-DP, rank " << r;
  }
}

TEST(TensorParallel, AttentionDpRunsEachRanksOwnSequences) {
  expect_data_parallel_matches(testing::k3_tiny_config(), 2, {11, 5});
  expect_data_parallel_matches(testing::k3_tiny_config(), 4, {9, 0, 17});  // ranks 1 and 3 have nothing
  expect_data_parallel_matches(testing::kl_tiny_config(), 4, {3, 14, 6, 1});
}

}  // namespace
}  // namespace kimirt::runtime
