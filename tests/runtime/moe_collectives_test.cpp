// What one MoE layer of one rank sends, per path (parallel_config.h), recorded by a Comm wrapper and
// interleaved with the point where the latent RMSNorm starts:
//   direct (MoE-TP, EP, both)  exactly ONE all-reduce, of [shared | routed latent] (T·(H + L) elements; T·H
//                              without a latent), and the latent norm after it, on a latent equal to the
//                              unsharded model's (the full sum, not one rank's partial);
//   all_to_all (EP)            TWO all-reduces, the shared experts' own (T·H) before the exchange and the
//                              reassembly of the token shares (T·H) after it, and 3 all-to-all-v (counts,
//                              dispatch, combine); the latent norm between the combine and the reassembly, on
//                              the rank's share of the unsharded latent;
//   attention-DP               3 all-to-all-v and no all-reduce; the latent norm after the combine.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "kimirt/runtime/moe_exchange.h"
#include "kimirt/runtime/rank_group.h"
#include "runtime/recording_comm.h"
#include "runtime/test_util.h"

namespace kimirt::runtime {
namespace {

using testing::LoggedCall;
using testing::RandomModel;
using testing::RecordingComm;

constexpr int64_t kTokens = 7;

// The calls of a log that are collectives (not trace points), in order.
std::vector<LoggedCall> collectives(const std::vector<LoggedCall>& calls) {
  std::vector<LoggedCall> out;
  for (const auto& c : calls) {
    if (c.op != "latent_norm") out.push_back(c);
  }
  return out;
}

// Index in `calls` of the latent norm, or -1.
int latent_norm_at(const std::vector<LoggedCall>& calls) {
  for (size_t i = 0; i < calls.size(); ++i) {
    if (calls[i].op == "latent_norm") return static_cast<int>(i);
  }
  return -1;
}

// One prefill of the same kTokens on every rank (under attention-DP each rank runs its own copy); each rank's
// log.
std::vector<std::vector<LoggedCall>> record(const RandomModel& m, const ParallelConfig& pc) {
  const auto ids = testing::random_ids(kTokens, m.config().vocab_size, 5);
  std::vector<std::vector<LoggedCall>> logs(static_cast<size_t>(pc.tp));
  run_local_ranks(pc.tp, [&](Comm& comm) {
    RecordingComm rec(comm);
    const auto mapping = pc.mapping(comm.rank());
    CpuBackend backend(m.config(), m.store(mapping), rec, mapping, testing::small_cache(), pc.moe_comm);
    backend.set_tracer(&rec);
    testing::run_one(backend, ids, 0, 0);
    logs[static_cast<size_t>(comm.rank())] = rec.log;
  });
  return logs;
}

// The unsharded model's latent at each MoE layer's norm.
std::map<int, std::vector<float>> reference_latents(const RandomModel& m) {
  const auto logs = record(m, ParallelConfig{});
  std::map<int, std::vector<float>> out;
  for (int l = 0; l < m.config().num_layers; ++l) {
    if (!m.config().is_moe_layer(l)) continue;
    const auto calls = testing::moe_calls(logs[0], l);
    const int at = latent_norm_at(calls);
    if (at >= 0) out[l] = calls[static_cast<size_t>(at)].data;
  }
  return out;
}

std::vector<std::string> ops(const std::vector<LoggedCall>& calls) {
  std::vector<std::string> out;
  for (const auto& c : calls) out.push_back(c.op);
  return out;
}

void expect_direct(const model::ModelConfig& c, ParallelConfig pc) {
  SCOPED_TRACE(pc.str());
  const RandomModel m(c, 3);
  const auto ref = reference_latents(m);
  const auto logs = record(m, pc);
  const int64_t H = c.hidden_size, L = c.latent_moe() ? c.expert_hidden_size() : 0;
  int moe_layers = 0;
  for (int l = 0; l < c.num_layers; ++l) {
    if (!c.is_moe_layer(l)) continue;
    ++moe_layers;
    for (int r = 0; r < pc.tp; ++r) {
      SCOPED_TRACE(::testing::Message() << "layer " << l << " rank " << r);
      const auto calls = testing::moe_calls(logs[static_cast<size_t>(r)], l);
      const auto coll = collectives(calls);
      ASSERT_EQ(ops(coll), std::vector<std::string>{"all_reduce"});
      EXPECT_EQ(coll[0].count, static_cast<size_t>(kTokens * (H + L)));  // [shared | routed latent] together
      if (!c.latent_moe()) continue;
      const int at = latent_norm_at(calls);
      ASSERT_EQ(at, 1) << "the latent norm must follow the one all-reduce";
      EXPECT_LE(testing::rel_error(calls[1].data, ref.at(l)), 1e-5) << "the norm sees a partial latent";
    }
  }
  EXPECT_GT(moe_layers, 0);
}

void expect_exchanged(const model::ModelConfig& c, ParallelConfig pc) {
  SCOPED_TRACE(pc.str());
  const RandomModel m(c, 3);
  const auto ref = reference_latents(m);
  const auto logs = record(m, pc);
  const int64_t H = c.hidden_size, L = c.expert_hidden_size();
  for (int l = 0; l < c.num_layers; ++l) {
    if (!c.is_moe_layer(l)) continue;
    for (int r = 0; r < pc.tp; ++r) {
      SCOPED_TRACE(::testing::Message() << "layer " << l << " rank " << r);
      const auto calls = testing::moe_calls(logs[static_cast<size_t>(r)], l);
      const auto coll = collectives(calls);
      std::vector<std::string> want = {"all_to_all_v", "all_to_all_v", "all_to_all_v"};
      if (!pc.attention_dp) {
        want.insert(want.begin(), "all_reduce");  // the shared experts' own reduction
        want.push_back("all_reduce");             // the token shares reassembled
      }
      ASSERT_EQ(ops(coll), want);
      if (!pc.attention_dp) {
        EXPECT_EQ(coll.front().count, static_cast<size_t>(kTokens * H));
        EXPECT_EQ(coll.back().count, static_cast<size_t>(kTokens * H));
      }
      if (!c.latent_moe()) continue;
      const int at = latent_norm_at(calls);
      const int combine = pc.attention_dp ? 2 : 3;  // index of the combine among the calls
      ASSERT_EQ(at, combine + 1) << "the latent norm must follow the combine";
      const TokenShare share = pc.attention_dp ? TokenShare{0, kTokens} : token_share(kTokens, pc.tp, r);
      const auto& full = ref.at(l);
      const std::vector<float> mine(full.begin() + share.begin * L, full.begin() + share.end * L);
      EXPECT_EQ(calls[static_cast<size_t>(at)].count, static_cast<size_t>(share.size() * L));
      EXPECT_LE(testing::rel_error(calls[static_cast<size_t>(at)].data, mine), 1e-5);
    }
  }
}

TEST(MoeCollectives, DirectPathHasOneAllReducePerLayerBeforeTheLatentNorm) {
  const auto k3 = testing::k3_tiny_config();
  expect_direct(k3, {2, 1});  // MoE-TP
  expect_direct(k3, {2, 2});  // EP
  expect_direct(k3, {4, 2});  // both
  expect_direct(testing::kl_tiny_config(), {4, 4});
}

TEST(MoeCollectives, AllToAllPathHasTwoAllReducesAndNormalizesAfterTheCombine) {
  const auto k3 = testing::k3_tiny_config();
  expect_exchanged(k3, {2, 2, false, MoeComm::kAllToAll});
  expect_exchanged(k3, {4, 4, false, MoeComm::kAllToAll});
  expect_exchanged(testing::kl_tiny_config(), {2, 2, false, MoeComm::kAllToAll});
}

TEST(MoeCollectives, AttentionDpExchangesTokensWithoutAllReduce) {
  expect_exchanged(testing::k3_tiny_config(), {2, 2, true});
  expect_exchanged(testing::kl_tiny_config(), {4, 4, true});
}

}  // namespace
}  // namespace kimirt::runtime
