// Ranks stepping their engines in lockstep (ParallelEngine over LocalComm): under attention-DP each rank runs
// its own requests, ranks with less or no work keep joining the collectives, and all stop at the same step;
// under tensor parallelism the tokens are sampled on rank 0 and broadcast, so the ranks agree even when their
// samplers are seeded differently; a rank whose step fails stops the whole group with its error.
#include "kimirt/runtime/parallel_engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>

#include <map>

#include "kimirt/runtime/rank_group.h"
#include "runtime/failing_backend.h"
#include "runtime/test_util.h"

namespace kimirt::runtime {
namespace {

using ::testing::HasSubstr;
using testing::RandomModel;

GenerationRequest request(std::vector<int32_t> prompt, int max_tokens) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.sampling.max_tokens = max_tokens;
  return r;
}

// The request's tokens when it runs alone on one rank.
std::vector<int32_t> alone(const RandomModel& m, const GenerationRequest& r) {
  testing::TestBackend t(m);
  std::vector<int32_t> tokens;
  Engine engine(t.backend, {}, [&](const TokenEvent& e) {
    if (e.token >= 0) tokens.push_back(e.token);
  });
  engine.submit(r);
  engine.run_until_idle();
  return tokens;
}

TEST(ParallelEngine, AttentionDpRanksRunTheirOwnRequestsAndStopTogether) {
  const RandomModel m(testing::kl_tiny_config(), 51);
  const int64_t V = m.config().vocab_size;
  // Rank 1 has nothing; the others differ in how many requests they have and how long those run.
  const std::vector<std::vector<GenerationRequest>> work = {
      {request(testing::random_ids(5, V, 1), 4), request(testing::random_ids(12, V, 2), 7)},
      {},
      {request(testing::random_ids(3, V, 3), 10)},
      {request(testing::random_ids(8, V, 4), 2)},
  };
  const ParallelConfig pc{4, 4, true};
  std::vector<std::map<int64_t, std::vector<int32_t>>> tokens(4);
  std::vector<std::vector<int64_t>> ids(4);
  std::vector<int64_t> steps(4);
  run_local_ranks(pc.tp, [&](Comm& comm) {
    const auto r = static_cast<size_t>(comm.rank());
    const auto mapping = pc.mapping(comm.rank());
    CpuBackend backend(m.config(), m.store(mapping), comm, mapping, testing::small_cache());
    ParallelEngine engine(backend, comm, {}, [&](const TokenEvent& e) {
      if (e.token >= 0) tokens[r][e.request_id].push_back(e.token);
    });
    for (const auto& req : work[r]) ids[r].push_back(engine.engine().submit(req));
    engine.run_until_idle();
    EXPECT_TRUE(engine.engine().idle());
    steps[r] = engine.steps();
  });
  for (size_t r = 0; r < work.size(); ++r) {
    for (size_t i = 0; i < work[r].size(); ++i) {
      EXPECT_EQ(tokens[r][ids[r][i]], alone(m, work[r][i])) << "rank " << r << " request " << i;
    }
    EXPECT_EQ(steps[r], steps[0]) << "rank " << r << " stopped at another step";
  }
  EXPECT_EQ(steps[0], 10) << "the longest request (a 3-token prompt and 10 tokens) sets the number of steps";
}

TEST(ParallelEngine, TensorParallelRanksTakeRankZerosSampledTokens) {
  const RandomModel m(testing::k3_tiny_config(), 52);
  auto sampled = [&](uint64_t seed) {
    GenerationRequest r = request(testing::random_ids(6, m.config().vocab_size, 9), 12);
    r.sampling.temperature = 1.0f;
    r.sampling.seed = seed;
    return r;
  };
  const auto with_rank0_seed = alone(m, sampled(7));
  ASSERT_NE(with_rank0_seed, alone(m, sampled(99))) << "the seeds must matter for this test to mean anything";

  const ParallelConfig pc{2, 2};
  std::vector<std::vector<int32_t>> tokens(2);
  run_local_ranks(pc.tp, [&](Comm& comm) {
    const auto r = static_cast<size_t>(comm.rank());
    const auto mapping = pc.mapping(comm.rank());
    CpuBackend backend(m.config(), m.store(mapping), comm, mapping, testing::small_cache());
    ParallelEngine engine(backend, comm, {}, [&](const TokenEvent& e) {
      if (e.token >= 0) tokens[r].push_back(e.token);
    });
    engine.engine().submit(sampled(r == 0 ? 7 : 99));  // rank 1's seed is never used
    engine.run_until_idle();
  });
  EXPECT_EQ(tokens[0], with_rank0_seed);
  EXPECT_EQ(tokens[1], tokens[0]);
}

// Every rank's every request still gets its one final event, kError: those of the failing step's batch, and the
// fifth, left waiting for a cache slot (4 per rank), which had none.
void expect_failure_stops_the_group(const ParallelConfig& pc) {
  SCOPED_TRACE(pc.str());
  const RandomModel m(testing::k3_tiny_config(), 53);
  constexpr int kRequests = 5;
  std::vector<std::atomic<int>> errors(static_cast<size_t>(pc.tp)), others(static_cast<size_t>(pc.tp));
  std::string error;
  try {
    run_local_ranks(pc.tp, [&](Comm& comm) {
      const auto mapping = pc.mapping(comm.rank());
      CpuBackend backend(m.config(), m.store(mapping), comm, mapping, testing::small_cache());
      testing::FailingBackend failing(backend);
      failing.fail = comm.rank() == 1;  // the other ranks go on into the step's collectives
      const size_t rank = static_cast<size_t>(comm.rank());
      ParallelEngine engine(failing, comm, {}, [&, rank](const TokenEvent& e) {
        if (e.finished) ++(e.reason == FinishReason::kError ? errors[rank] : others[rank]);
      });
      for (int i = 0; i < kRequests; ++i) {
        engine.engine().submit(request(testing::random_ids(5, m.config().vocab_size, 3 + i), 3));
      }
      engine.run_until_idle();
    });
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_THAT(error, HasSubstr("injected failure in layer 0"));
  for (int r = 0; r < pc.tp; ++r) {
    EXPECT_EQ(errors[static_cast<size_t>(r)].load(), kRequests) << "rank " << r;
    EXPECT_EQ(others[static_cast<size_t>(r)].load(), 0) << "rank " << r;
  }
}

TEST(ParallelEngine, AFailingRankStopsTheGroupWithItsError) {
  expect_failure_stops_the_group({2, 2, true});
  expect_failure_stops_the_group({2, 1});
}

}  // namespace
}  // namespace kimirt::runtime
