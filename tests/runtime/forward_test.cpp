// The forward over batches on random-weight models of both families: the ways of feeding the same tokens
// (one prefill, chunks, one token at a time, in a batch with others) give the same logits; the residual
// structure and the observer hook; one reduction per mixer and per FFN.
#include "kimirt/runtime/forward.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "runtime/delegating_backend.h"
#include "runtime/test_util.h"

namespace kimirt::runtime {
namespace {

using testing::RandomModel;
using testing::rel_error;
using testing::run_one;
using testing::TestBackend;

constexpr double kTol = 1e-4;  // the golden bound: fp32 paths that differ only in summation order

class ForwardTest : public ::testing::TestWithParam<const char*> {
 protected:
  model::ModelConfig config() const {
    return std::string(GetParam()) == "k3" ? testing::k3_tiny_config() : testing::kl_tiny_config();
  }
};

INSTANTIATE_TEST_SUITE_P(Families, ForwardTest, ::testing::Values("k3", "kl"));

TEST_P(ForwardTest, DecodeOneTokenAtATimeMatchesOnePrefill) {
  const RandomModel m(config(), 1);
  const auto ids = testing::random_ids(70, m.config().vocab_size, 2);  // longer than one KDA chunk (64)
  TestBackend a(m), b(m);
  const auto prefill = run_one(a.backend, ids, 0, 0);
  std::vector<float> decoded;
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto row = run_one(b.backend, {ids[i]}, static_cast<int64_t>(i), 1, LogitRows::kLast);
    decoded.insert(decoded.end(), row.begin(), row.end());
  }
  EXPECT_LE(rel_error(decoded, prefill), kTol);
}

TEST_P(ForwardTest, ChunkedPrefillMatchesOnePrefill) {
  const RandomModel m(config(), 3);
  const auto ids = testing::random_ids(100, m.config().vocab_size, 4);
  TestBackend a(m);
  const auto whole = run_one(a.backend, ids, 0, 0);
  for (int64_t chunk : {1, 7, 64}) {
    TestBackend b(m);
    std::vector<float> chunked;
    for (int64_t p = 0; p < static_cast<int64_t>(ids.size()); p += chunk) {
      const auto end = std::min<int64_t>(p + chunk, static_cast<int64_t>(ids.size()));
      const auto rows = run_one(b.backend, std::vector<int32_t>(ids.begin() + p, ids.begin() + end), p, 2);
      chunked.insert(chunked.end(), rows.begin(), rows.end());
    }
    EXPECT_LE(rel_error(chunked, whole), kTol) << "chunk " << chunk;
  }
}

TEST_P(ForwardTest, BatchOfSequencesMatchesEachAlone) {
  const RandomModel m(config(), 5);
  const int64_t V = m.config().vocab_size;
  const auto a_ids = testing::random_ids(30, V, 6), b_ids = testing::random_ids(12, V, 7);
  const auto c_ids = testing::random_ids(5, V, 8);

  // Alone: A prefill 10 then two decodes; B prefill 12 then one decode; C prefill 5.
  TestBackend alone(m);
  std::vector<float> a_ref = run_one(alone.backend, {a_ids.begin(), a_ids.begin() + 10}, 0, 0, LogitRows::kLast);
  for (int i = 10; i < 12; ++i) {
    auto r = run_one(alone.backend, {a_ids[i]}, i, 0, LogitRows::kLast);
    a_ref.insert(a_ref.end(), r.begin(), r.end());
  }
  std::vector<float> b_ref = run_one(alone.backend, b_ids, 0, 1, LogitRows::kAll);
  {
    auto r = run_one(alone.backend, {b_ids[0]}, 12, 1, LogitRows::kLast);
    b_ref.insert(b_ref.end(), r.begin(), r.end());
  }
  const std::vector<float> c_ref = run_one(alone.backend, c_ids, 0, 2, LogitRows::kLast);

  // Together: step 1 = A's prefill; step 2 = A decode + B prefill + C prefill; step 3 = A and B decode.
  TestBackend together(m);
  Backend& be = together.backend;
  const CacheConfig cc = be.cache_config();
  Forward fwd(be);
  auto run = [&](StepBatch& batch) {
    ActBuffer logits = fwd.run(batch);
    std::vector<float> host(static_cast<size_t>(batch.logit_rows * V));
    be.to_host(logits.get(), 0, batch.logit_rows, host);
    return host;
  };
  auto rows = [&](const std::vector<float>& all, int64_t first, int64_t n) {
    return std::vector<float>(all.begin() + first * V, all.begin() + (first + n) * V);
  };
  std::vector<float> a_out, b_out, c_out;
  StepBatch s1;
  s1.add(std::vector<int32_t>(a_ids.begin(), a_ids.begin() + 10), 0, 0, testing::blocks_of(0, cc), LogitRows::kLast);
  a_out = run(s1);
  StepBatch s2;
  s2.add(std::vector<int32_t>{a_ids[10]}, 10, 0, testing::blocks_of(0, cc), LogitRows::kLast);
  s2.add(b_ids, 0, 1, testing::blocks_of(1, cc), LogitRows::kAll);
  s2.add(c_ids, 0, 2, testing::blocks_of(2, cc), LogitRows::kLast);
  const auto o2 = run(s2);
  ASSERT_EQ(o2.size(), static_cast<size_t>((1 + 12 + 1) * V));
  auto a2 = rows(o2, 0, 1);
  a_out.insert(a_out.end(), a2.begin(), a2.end());
  b_out = rows(o2, 1, 12);
  c_out = rows(o2, 13, 1);
  StepBatch s3;
  s3.add(std::vector<int32_t>{a_ids[11]}, 11, 0, testing::blocks_of(0, cc), LogitRows::kLast);
  s3.add(std::vector<int32_t>{b_ids[0]}, 12, 1, testing::blocks_of(1, cc), LogitRows::kLast);
  const auto o3 = run(s3);
  auto a3 = rows(o3, 0, 1), b3 = rows(o3, 1, 1);
  a_out.insert(a_out.end(), a3.begin(), a3.end());
  b_out.insert(b_out.end(), b3.begin(), b3.end());

  EXPECT_LE(rel_error(a_out, a_ref), kTol);
  EXPECT_LE(rel_error(b_out, b_ref), kTol);
  EXPECT_LE(rel_error(c_out, c_ref), kTol);
}

// Block tables that are neither ascending nor contiguous, of two sequences interleaved in one cache (A = {37, 2,
// 21}, B = {5, 40, 13}, 16 rows each), both longer than a block and prefilled in two chunks, so that the second
// chunk's attention reads the first's rows back across blocks: the logits of each sequence alone on ascending
// blocks (every other test's tables are ascending and consecutive).
TEST_P(ForwardTest, ShuffledInterleavedBlockTablesGiveTheSameLogits) {
  const RandomModel m(config(), 12);
  const int64_t V = m.config().vocab_size;
  const auto a_ids = testing::random_ids(40, V, 13), b_ids = testing::random_ids(35, V, 14);
  TestBackend alone(m);
  const auto a_ref = run_one(alone.backend, a_ids, 0, 0, LogitRows::kAll);
  const auto b_ref = run_one(alone.backend, b_ids, 0, 1, LogitRows::kAll);

  TestBackend shuffled(m);
  Backend& be = shuffled.backend;
  ASSERT_EQ(be.cache_config().block_size, 16);
  Forward fwd(be);
  const std::vector<int32_t> a_blocks = {37, 2, 21}, b_blocks = {5, 40, 13};
  std::vector<float> a_out, b_out;
  for (const auto& [from, to] : {std::pair<int64_t, int64_t>{0, 20}, std::pair<int64_t, int64_t>{20, 40}}) {
    StepBatch batch;
    const int64_t b_to = std::min<int64_t>(to, static_cast<int64_t>(b_ids.size()));
    batch.add(std::vector<int32_t>(a_ids.begin() + from, a_ids.begin() + to), from, 0, a_blocks, LogitRows::kAll);
    batch.add(std::vector<int32_t>(b_ids.begin() + from, b_ids.begin() + b_to), from, 1, b_blocks, LogitRows::kAll);
    ActBuffer logits = fwd.run(batch);
    std::vector<float> host(static_cast<size_t>(batch.logit_rows * V));
    be.to_host(logits.get(), 0, batch.logit_rows, host);
    a_out.insert(a_out.end(), host.begin(), host.begin() + (to - from) * V);
    b_out.insert(b_out.end(), host.begin() + (to - from) * V, host.end());
  }
  EXPECT_LE(rel_error(a_out, a_ref), kTol);
  EXPECT_LE(rel_error(b_out, b_ref), kTol);
}

TEST_P(ForwardTest, ASequenceStartingInAUsedSlotStartsFromZeroState) {
  const RandomModel m(config(), 9);
  const int64_t V = m.config().vocab_size;
  const auto first = testing::random_ids(40, V, 10), second = testing::random_ids(9, V, 11);
  TestBackend used(m), fresh(m);
  run_one(used.backend, first, 0, 0);
  const auto again = run_one(used.backend, second, 0, 0);
  const auto ref = run_one(fresh.backend, second, 0, 3);
  EXPECT_EQ(again, ref);  // the same ops on the same inputs: bit-identical
}

TEST_P(ForwardTest, OneReductionPerMixerAndPerFfn) {
  const RandomModel m(config(), 12);
  TestBackend t(m);
  const uint64_t before = t.comm.num_all_reduces();
  run_one(t.backend, testing::random_ids(6, m.config().vocab_size, 13), 0, 0);
  EXPECT_EQ(t.comm.num_all_reduces() - before, static_cast<uint64_t>(2 * m.config().num_layers));
}

// Records what the forward shows.
class Recorder : public ForwardObserver {
 public:
  bool wants(Tap, int) const override { return true; }
  void on_activation(Tap tap, int layer, std::span<const float> data, int64_t rows, int64_t cols) override {
    EXPECT_EQ(data.size(), static_cast<size_t>(rows * cols));
    seen[{tap, layer}] = std::vector<float>(data.begin(), data.end());
  }
  bool wants_routes(int) const override { return true; }
  void on_routes(int layer, const RouteTrace& trace) override { routes[layer] = trace; }

  std::map<std::pair<Tap, int>, std::vector<float>> seen;
  std::map<int, RouteTrace> routes;
};

TEST_P(ForwardTest, ObserverSeesEveryTapAndTheRouterChoices) {
  const RandomModel m(config(), 14);
  const auto& c = m.config();
  const int64_t T = 8, H = c.hidden_size;
  const auto ids = testing::random_ids(T, c.vocab_size, 15);
  TestBackend t(m);
  Recorder rec;
  const auto logits = run_one(t.backend, ids, 0, 0, LogitRows::kAll, &rec);

  // The embedding tap is the rows of the table.
  const float* table = m.param("model.embed_tokens.weight").data_as<float>();
  const auto& emb = rec.seen.at({Tap::kEmbedding, -1});
  for (int64_t i = 0; i < T; ++i) {
    for (int64_t j = 0; j < H; ++j)
      ASSERT_EQ(emb[static_cast<size_t>(i * H + j)], table[ids[static_cast<size_t>(i)] * H + j]);
  }
  for (int l = 0; l < c.num_layers; ++l) {
    for (Tap tap : {Tap::kMixerIn, Tap::kMixerOut, Tap::kFfnIn, Tap::kFfnOut, Tap::kResidual}) {
      EXPECT_TRUE(rec.seen.count({tap, l})) << tap_name(tap) << " of layer " << l;
    }
    EXPECT_EQ(rec.routes.count(l) == 1, c.is_moe_layer(l)) << "layer " << l;
  }
  // Renormalized router weights sum to routed_scaling_factor per token; ids are distinct experts.
  for (const auto& [layer, trace] : rec.routes) {
    ASSERT_EQ(trace.expert_ids.size(), static_cast<size_t>(T * c.num_experts_per_token));
    for (int64_t t0 = 0; t0 < T; ++t0) {
      double sum = 0.0;
      std::set<int32_t> distinct;
      for (int64_t j = 0; j < trace.top_k; ++j) {
        const int32_t e = trace.expert_ids[static_cast<size_t>(t0 * trace.top_k + j)];
        EXPECT_TRUE(e >= 0 && e < c.num_experts);
        distinct.insert(e);
        sum += trace.weights[static_cast<size_t>(t0 * trace.top_k + j)];
      }
      EXPECT_EQ(distinct.size(), static_cast<size_t>(trace.top_k));
      EXPECT_NEAR(sum, c.routed_scaling_factor, 1e-5);
    }
  }
  // The logits are the final-norm output times the LM head, recomputed here in double.
  const auto& fin = rec.seen.at({Tap::kFinalNorm, -1});
  const float* head = m.param("lm_head.weight").data_as<float>();
  std::vector<float> ref(logits.size());
  for (int64_t i = 0; i < T; ++i) {
    for (int64_t v = 0; v < c.vocab_size; ++v) {
      double s = 0.0;
      for (int64_t j = 0; j < H; ++j) s += static_cast<double>(fin[static_cast<size_t>(i * H + j)]) * head[v * H + j];
      ref[static_cast<size_t>(i * c.vocab_size + v)] = static_cast<float>(s);
    }
  }
  EXPECT_LE(rel_error(logits, ref), 1e-6);

  if (!c.has_attn_res()) {
    // The plain residual stream: after each layer, the previous stream plus the mixer and FFN outputs.
    std::vector<float> stream = emb;
    for (int l = 0; l < c.num_layers; ++l) {
      const auto& a = rec.seen.at({Tap::kMixerOut, l});
      const auto& f = rec.seen.at({Tap::kFfnOut, l});
      for (size_t i = 0; i < stream.size(); ++i) stream[i] = (stream[i] + a[i]) + f[i];
      EXPECT_EQ(stream, rec.seen.at({Tap::kResidual, l})) << "layer " << l;
    }
  }
}

// Every AttnRes mix the forward asks for, with its candidates' values at the time of the call.
class MixRecorder final : public testing::DelegatingBackend {
 public:
  using DelegatingBackend::DelegatingBackend;
  struct Call {
    int layer;
    ResSite site;
    std::vector<std::vector<float>> candidates;
  };
  void attn_res_mix(int layer, ResSite site, std::span<const Act> candidates, Act out) override {
    Call call{layer, site, {}};
    for (Act a : candidates) {
      std::vector<float> v(static_cast<size_t>(rows(a) * cols(a)));
      to_host(a, 0, rows(a), v);
      call.candidates.push_back(std::move(v));
    }
    calls.push_back(std::move(call));
    DelegatingBackend::attn_res_mix(layer, site, candidates, out);
  }
  std::vector<Call> calls;
};

// The bank and prefix bookkeeping of Block Attention Residuals (spec §2), followed by hand from the taps
// (embedding e, mixer outputs a_l, FFN outputs f_l) and compared with the candidates of every mix:
//   P = e, B = []; per layer l: mix(B, P) before the mixer unless B is empty; at l mod block == 0 the
//   snapshot B += [P] is taken AFTER that mix and P restarts from a_l, else P += a_l; mix(B, P) before the
//   FFN; P += f_l. At the end mix(B, P).
TEST(ForwardAttnRes, BankAndPrefixFollowTheBlockRule) {
  for (const int64_t block : {1, 2, 4, 6}) {
    auto config = testing::k3_tiny_config();
    config.attn_res_block_size = block;
    config.validate();
    const RandomModel m(config, 16);
    const auto ids = testing::random_ids(5, config.vocab_size, 17);
    TestBackend t(m);
    MixRecorder mixes(t.backend);
    Recorder taps;
    run_one(mixes, ids, 0, 0, LogitRows::kAll, &taps);

    std::vector<std::vector<float>> bank;
    std::vector<float> prefix = taps.seen.at({Tap::kEmbedding, -1});
    size_t next = 0;
    auto expect_mix = [&](int layer, ResSite site) {
      ASSERT_LT(next, mixes.calls.size()) << "block " << block << ": no mix at layer " << layer;
      const auto& call = mixes.calls[next++];
      EXPECT_EQ(call.layer, layer) << "block " << block;
      EXPECT_EQ(call.site, site) << "block " << block << ", layer " << layer;
      ASSERT_EQ(call.candidates.size(), bank.size() + 1) << "block " << block << ", layer " << layer;
      for (size_t i = 0; i < bank.size(); ++i) {
        EXPECT_EQ(call.candidates[i], bank[i]) << "block " << block << ", layer " << layer << ", snapshot " << i;
      }
      EXPECT_EQ(call.candidates.back(), prefix) << "block " << block << ", layer " << layer << ", prefix";
    };
    auto add = [](std::vector<float>& p, const std::vector<float>& x) {
      for (size_t i = 0; i < p.size(); ++i) p[i] += x[i];
    };
    for (int l = 0; l < config.num_layers; ++l) {
      if (!bank.empty()) expect_mix(l, ResSite::kMixer);
      const auto& a = taps.seen.at({Tap::kMixerOut, l});
      if (l % block == 0) {
        bank.push_back(prefix);
        prefix = a;
      } else {
        add(prefix, a);
      }
      expect_mix(l, ResSite::kFfn);
      add(prefix, taps.seen.at({Tap::kFfnOut, l}));
    }
    expect_mix(-1, ResSite::kOutput);
    EXPECT_EQ(next, mixes.calls.size()) << "block " << block << ": more mixes than the rule has";
    // Snapshots at layers 0, block, 2·block, ...: the final mix sees one per started block, plus P.
    EXPECT_EQ(bank.size(), static_cast<size_t>((config.num_layers + block - 1) / block));
  }
}

}  // namespace
}  // namespace kimirt::runtime
