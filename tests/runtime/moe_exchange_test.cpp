// The all-to-all token exchange on its own: token shares tile the step, every (token, expert) pair's row
// reaches the expert's rank, and each output comes back to its pair, also for ranks that send nothing.
#include "kimirt/runtime/moe_exchange.h"

#include <gtest/gtest.h>

#include <random>

#include "kimirt/runtime/rank_group.h"

namespace kimirt::runtime {
namespace {

TEST(MoeExchange, TokenSharesTileTheStepEvenly) {
  for (int64_t tokens : {0, 1, 5, 7, 16}) {
    for (int ranks : {1, 2, 3, 4}) {
      int64_t next = 0;
      for (int r = 0; r < ranks; ++r) {
        const TokenShare s = token_share(tokens, ranks, r);
        EXPECT_EQ(s.begin, next) << tokens << " tokens, rank " << r << " of " << ranks;
        EXPECT_GE(s.size(), tokens / ranks);
        EXPECT_LE(s.size(), tokens / ranks + 1);
        next = s.end;
      }
      EXPECT_EQ(next, tokens);
    }
  }
}

TEST(MoeExchange, PairsReachTheirExpertsAndOutputsComeBack) {
  constexpr int kRanks = 3;
  constexpr int64_t kExperts = 6, kTopK = 2, kWidth = 5;
  const std::vector<int64_t> tokens = {4, 0, 3};  // rank 1 sends nothing (it still receives)
  run_local_ranks(kRanks, [&](Comm& comm) {
    const int r = comm.rank();
    const int64_t T = tokens[static_cast<size_t>(r)];
    // Row t of rank r: r·100 + t + column/10, so a received row says where it came from.
    std::vector<float> rows(static_cast<size_t>(T * kWidth));
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < kWidth; ++i) rows[static_cast<size_t>(t * kWidth + i)] = r * 100.0f + t + i / 10.0f;
    }
    std::mt19937 rng(static_cast<uint32_t>(r));
    std::vector<int32_t> ids(static_cast<size_t>(T * kTopK));
    for (int64_t t = 0; t < T; ++t) {
      ids[static_cast<size_t>(t * kTopK)] = static_cast<int32_t>(rng() % kExperts);
      ids[static_cast<size_t>(t * kTopK + 1)] =
          static_cast<int32_t>((ids[static_cast<size_t>(t * kTopK)] + 1 + rng() % (kExperts - 1)) % kExperts);
    }
    MoeExchange ex(comm, kExperts);
    ex.dispatch(rows.data(), T, kWidth, ids.data(), kTopK);
    for (int64_t i = 0; i < ex.received(); ++i) {
      const int32_t e = ex.received_experts()[i];
      EXPECT_EQ(e / (kExperts / kRanks), r) << "expert " << e << " does not live on rank " << r;
      for (int64_t c = 0; c < kWidth; ++c) {
        // The "expert": the row times (its id + 1).
        ex.results()[i * kWidth + c] = ex.received_rows()[i * kWidth + c] * static_cast<float>(e + 1);
      }
    }
    std::vector<float> out(static_cast<size_t>(T * kTopK * kWidth));
    ex.combine(out.data());
    for (int64_t p = 0; p < T * kTopK; ++p) {
      for (int64_t c = 0; c < kWidth; ++c) {
        EXPECT_EQ(out[static_cast<size_t>(p * kWidth + c)], rows[static_cast<size_t>((p / kTopK) * kWidth + c)] *
                                                                static_cast<float>(ids[static_cast<size_t>(p)] + 1))
            << "rank " << r << " pair " << p;
      }
    }
    int64_t total = ex.received();
    comm.all_reduce_sum(&total, 1, DType::kI64);
    EXPECT_EQ(total, (4 + 0 + 3) * kTopK) << "every pair arrives exactly once";
  });
}

}  // namespace
}  // namespace kimirt::runtime
