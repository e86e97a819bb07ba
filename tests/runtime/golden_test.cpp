// The golden checkpoints (testdata/{kl-tiny,k3-tiny}) through the real components: loader → CPU backend →
// forward → engine. Bound: ‖out − ref‖/‖ref‖ ≤ 1e-4 (fp32 against an fp32 reference, golden/README.md),
// every greedy id equal. Where a per-layer reference exists (kl-tiny's residual stream, k3-tiny's layer tensors
// and router choices), a failure names the first place that departs.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "kimirt/io/safetensors.h"
#include "kimirt/model/loader.h"
#include "kimirt/runtime/engine.h"
#include "runtime/test_util.h"

namespace kimirt::runtime {
namespace {

constexpr double kTol = 1e-4;

struct Golden {
  model::LoadedModel model;
  std::map<std::string, Tensor> tensors;

  std::vector<float> f32(const std::string& name) const { return tensors.at(name).to_f32(); }
  std::vector<int32_t> ids(const std::string& name) const {
    const Tensor& t = tensors.at(name);
    std::vector<int32_t> out;
    for (int64_t v : t.span<const int64_t>()) out.push_back(static_cast<int32_t>(v));
    return out;
  }
  bool has(const std::string& name) const { return tensors.count(name) != 0; }
};

// Loaded once per checkpoint for the whole test program.
const Golden& golden(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Golden>> cache;
  auto& slot = cache[name];
  if (!slot) {
    slot = std::make_unique<Golden>();
    model::LoadOptions options;
    options.progress = false;
    slot->model = model::load_model(testing::testdata(name), {}, options);
    const auto file = io::SafetensorsFile::open(testing::testdata(name + "/golden.safetensors"));
    for (const auto& info : file.tensors()) slot->tensors.emplace(info.name, file.read_tensor(info.name));
  }
  return *slot;
}

struct GoldenBackend {
  explicit GoldenBackend(const Golden& g) : backend(g.model.config, g.model.params, comm, {}, CacheConfig{4, 16, 64}) {}
  SingleComm comm;
  CpuBackend backend;
};

class GoldenTest : public ::testing::TestWithParam<const char*> {
 protected:
  const Golden& g() const { return golden(GetParam()); }
  int64_t vocab() const { return g().model.config.vocab_size; }
  std::vector<std::string> prompts() const {
    std::vector<std::string> out;
    for (int i = 0; g().has(fmt::format("p{}.input_ids", i)); ++i) out.push_back(fmt::format("p{}", i));
    return out;
  }
};

INSTANTIATE_TEST_SUITE_P(Checkpoints, GoldenTest, ::testing::Values("kl-tiny", "k3-tiny"));

TEST_P(GoldenTest, PromptLogits) {
  GoldenBackend t(g());
  int slot = 0;
  for (const auto& p : prompts()) {
    const auto logits = testing::run_one(t.backend, g().ids(p + ".input_ids"), 0, slot++);
    EXPECT_LE(testing::rel_error(logits, g().f32(p + ".logits")), kTol) << p;
  }
}

TEST_P(GoldenTest, GreedyContinuationThroughTheEngine) {
  GoldenBackend t(g());
  std::map<int64_t, std::vector<int32_t>> tokens;
  std::map<int64_t, std::vector<float>> rows;
  Engine engine(t.backend, {}, [&](const TokenEvent& e) {
    if (e.token < 0) return;
    tokens[e.request_id].push_back(e.token);
    rows[e.request_id].insert(rows[e.request_id].end(), e.logits.begin(), e.logits.end());
  });
  std::map<int64_t, std::string> which;
  for (const auto& p : prompts()) {
    GenerationRequest r;
    r.prompt = g().ids(p + ".input_ids");
    r.sampling.max_tokens = static_cast<int>(g().ids(p + ".greedy_ids").size());
    r.step_logits = true;
    which[engine.submit(r)] = p;
  }
  engine.run_until_idle();
  for (const auto& [id, p] : which) {
    EXPECT_EQ(tokens[id], g().ids(p + ".greedy_ids")) << p;
    EXPECT_LE(testing::rel_error(rows[id], g().f32(p + ".greedy_logits")), kTol) << p;
  }
}

TEST_P(GoldenTest, DecodingOneTokenAtATimeMatchesOnePrefill) {
  GoldenBackend a(g()), b(g());
  for (const auto& p : prompts()) {
    auto ids = g().ids(p + ".input_ids");
    const auto greedy = g().ids(p + ".greedy_ids");
    ids.insert(ids.end(), greedy.begin(), greedy.end() - 1);
    const auto whole = testing::run_one(a.backend, ids, 0, 0);
    std::vector<float> stepped;
    for (size_t i = 0; i < ids.size(); ++i) {
      const auto row = testing::run_one(b.backend, {ids[i]}, static_cast<int64_t>(i), 1, LogitRows::kLast);
      stepped.insert(stepped.end(), row.begin(), row.end());
    }
    EXPECT_LE(testing::rel_error(stepped, whole), kTol) << p;
  }
}

TEST_P(GoldenTest, ChunkedPrefillMatchesOnePrefill) {
  const auto ids = g().ids("p0.input_ids");
  GoldenBackend a(g());
  const auto whole = testing::run_one(a.backend, ids, 0, 0);
  for (int64_t chunk : {1, 7, 64}) {
    GoldenBackend b(g());
    std::vector<float> chunked;
    for (int64_t p = 0; p < static_cast<int64_t>(ids.size()); p += chunk) {
      const auto end = std::min<int64_t>(p + chunk, static_cast<int64_t>(ids.size()));
      const auto rows = testing::run_one(b.backend, std::vector<int32_t>(ids.begin() + p, ids.begin() + end), p, 0);
      chunked.insert(chunked.end(), rows.begin(), rows.end());
    }
    EXPECT_LE(testing::rel_error(chunked, whole), kTol) << "chunk " << chunk;
  }
}

TEST_P(GoldenTest, AllPromptsInOneBatchMatchEachAlone) {
  GoldenBackend t(g());
  Backend& be = t.backend;
  StepBatch batch;
  std::vector<std::string> ps = prompts();
  for (size_t i = 0; i < ps.size(); ++i) {
    batch.add(g().ids(ps[i] + ".input_ids"), 0, static_cast<int>(i),
              testing::blocks_of(static_cast<int>(i), be.cache_config()), LogitRows::kAll);
  }
  Forward forward(be);
  ActBuffer logits = forward.run(batch);
  for (size_t i = 0; i < ps.size(); ++i) {
    const StepSequence& s = batch.sequences[i];
    std::vector<float> rows(static_cast<size_t>(s.num_tokens * vocab()));
    be.to_host(logits.get(), s.first_logit_row, s.num_tokens, rows);
    GoldenBackend alone(g());
    const auto ref = testing::run_one(alone.backend, g().ids(ps[i] + ".input_ids"), 0, 0);
    EXPECT_LE(testing::rel_error(rows, ref), kTol) << ps[i];
    EXPECT_LE(testing::rel_error(rows, g().f32(ps[i] + ".logits")), kTol) << ps[i];
  }
}

// Keeps host copies of the activations the golden file has for p0.
class GoldenTaps : public ForwardObserver {
 public:
  bool wants(Tap, int) const override { return true; }
  void on_activation(Tap tap, int layer, std::span<const float> data, int64_t, int64_t) override {
    seen[{tap, layer}].assign(data.begin(), data.end());
  }
  bool wants_routes(int) const override { return true; }
  void on_routes(int layer, const RouteTrace& trace) override { routes[layer] = trace; }

  std::map<std::pair<Tap, int>, std::vector<float>> seen;
  std::map<int, RouteTrace> routes;
};

// kl-tiny: pN.hidden.L is the residual stream after layer L − 1 (hidden.0 the embedding, the last one after the
// final norm).
TEST_P(GoldenTest, ResidualStreamLayerByLayer) {
  const auto& c = g().model.config;
  if (!g().has("p0.hidden.0")) {
    EXPECT_TRUE(c.has_attn_res()) << "only the AttnRes model's golden has no hidden states";
    return;
  }
  for (const auto& p : prompts()) {
    GoldenBackend t(g());
    GoldenTaps taps;
    testing::run_one(t.backend, g().ids(p + ".input_ids"), 0, 0, LogitRows::kLast, &taps);
    std::string first_departure;
    for (int64_t L = 0; L <= c.num_layers; ++L) {
      const auto& mine = L == 0              ? taps.seen.at({Tap::kEmbedding, -1})
                         : L == c.num_layers ? taps.seen.at({Tap::kFinalNorm, -1})
                                             : taps.seen.at({Tap::kResidual, static_cast<int>(L - 1)});
      const double rel = testing::rel_error(mine, g().f32(p + ".hidden." + std::to_string(L)));
      if (rel > kTol && first_departure.empty()) {
        first_departure = fmt::format("{}.hidden.{} (rel {:.2e})", p, L, rel);
      }
    }
    EXPECT_EQ(first_departure, "") << "first departure from the golden residual stream";
  }
}

// k3-tiny: p0.layerL.{mixer_in, mixer_out, ffn_in, ffn_out, router_idx, router_weight}, walked in forward order.
TEST_P(GoldenTest, LayerTensorsAndRouterChoices) {
  const auto& c = g().model.config;
  if (!g().has("p0.layer0.mixer_in")) {
    EXPECT_FALSE(c.has_attn_res()) << "the AttnRes golden has per-layer tensors";
    return;
  }
  GoldenBackend t(g());
  GoldenTaps taps;
  testing::run_one(t.backend, g().ids("p0.input_ids"), 0, 0, LogitRows::kLast, &taps);
  std::string first_departure;
  auto check = [&](const std::string& what, double rel, double bound) {
    if (rel > bound && first_departure.empty()) first_departure = fmt::format("{} (rel {:.2e})", what, rel);
  };
  const std::pair<Tap, const char*> points[] = {
      {Tap::kMixerIn, "mixer_in"}, {Tap::kMixerOut, "mixer_out"}, {Tap::kFfnIn, "ffn_in"}, {Tap::kFfnOut, "ffn_out"}};
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string base = "p0.layer" + std::to_string(l) + ".";
    for (const auto& [tap, name] : points) {
      if (tap == Tap::kFfnOut && c.is_moe_layer(l)) {
        // The router's choices come before the FFN output they decide.
        const auto ref_ids = g().ids(base + "router_idx");
        const auto ref_w = g().f32(base + "router_weight");
        const RouteTrace& tr = taps.routes.at(l);
        std::vector<int32_t> got_ids;
        std::vector<float> got_w;
        for (size_t t0 = 0; t0 * tr.top_k < tr.expert_ids.size(); ++t0) {
          std::vector<std::pair<int32_t, float>> v;
          for (int64_t j = 0; j < tr.top_k; ++j)
            v.emplace_back(tr.expert_ids[t0 * tr.top_k + j], tr.weights[t0 * tr.top_k + j]);
          std::sort(v.begin(), v.end());  // the golden lists them in ascending id order
          for (const auto& [e, w] : v) {
            got_ids.push_back(e);
            got_w.push_back(w);
          }
        }
        if (got_ids != ref_ids && first_departure.empty()) first_departure = base + "router_idx";
        check(base + "router_weight", testing::rel_error(got_w, ref_w), kTol);
      }
      check(base + name, testing::rel_error(taps.seen.at({tap, l}), g().f32(base + name)), kTol);
    }
  }
  EXPECT_EQ(first_departure, "") << "first departure from the golden layer tensors";
}

}  // namespace
}  // namespace kimirt::runtime
