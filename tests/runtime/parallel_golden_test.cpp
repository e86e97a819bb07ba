// The golden checkpoints (testdata/{kl-tiny,k3-tiny}) run by a group of ranks in one process (LocalComm),
// each rank loading its own slice through the loader and stepping its engine in lockstep (ParallelEngine):
// tensor parallelism with MoE-TP and/or EP, the all-to-all MoE path, and attention-DP (the prompts dealt
// out to the ranks, some ranks with none). Same bound as the single-rank golden test: ‖out − ref‖/‖ref‖ ≤ 1e-4
// on pN.logits (every prompt position) and pN.greedy_logits, every greedy id equal; with attention-DP off
// every rank also gets exactly the same tokens and logits.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <ostream>

#include "kimirt/io/safetensors.h"
#include "kimirt/model/loader.h"
#include "kimirt/runtime/parallel_engine.h"
#include "kimirt/runtime/rank_group.h"
#include "runtime/test_util.h"

namespace kimirt::runtime {
namespace {

constexpr double kTol = 1e-4;

struct GoldenData {
  std::map<std::string, Tensor> tensors;
  std::vector<std::string> prompts;

  std::vector<float> f32(const std::string& name) const { return tensors.at(name).to_f32(); }
  std::vector<int32_t> ids(const std::string& name) const {
    std::vector<int32_t> out;
    for (int64_t v : tensors.at(name).span<const int64_t>()) out.push_back(static_cast<int32_t>(v));
    return out;
  }
};

const GoldenData& golden(const std::string& name) {
  static std::map<std::string, std::unique_ptr<GoldenData>> cache;
  auto& slot = cache[name];
  if (!slot) {
    slot = std::make_unique<GoldenData>();
    const auto file = io::SafetensorsFile::open(testing::testdata(name + "/golden.safetensors"));
    for (const auto& info : file.tensors()) slot->tensors.emplace(info.name, file.read_tensor(info.name));
    for (int i = 0; slot->tensors.count(fmt::format("p{}.input_ids", i)); ++i) {
      slot->prompts.push_back(fmt::format("p{}", i));
    }
  }
  return *slot;
}

// What one rank saw of one prompt it ran.
struct PromptResult {
  std::vector<float> logits;  // every prompt position
  std::vector<int32_t> tokens;
  std::vector<float> step_logits;
};

struct Case {
  const char* model;
  ParallelConfig pc;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.model << ", " << c.pc.str(); }

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string name = fmt::format("{}_tp{}_ep{}", c.model, c.pc.tp, c.pc.ep);
  if (c.pc.attention_dp) name += "_attention_dp";
  if (c.pc.moe_comm == MoeComm::kAllToAll) name += "_all_to_all";
  for (auto& ch : name) {
    if (ch == '-') ch = '_';
  }
  return name;
}

class ParallelGolden : public ::testing::TestWithParam<Case> {};

TEST_P(ParallelGolden, MatchesTheGoldenOutputs) {
  const Case& c = GetParam();
  const GoldenData& g = golden(c.model);
  const int tp = c.pc.tp;
  // ranks[r][prompt index]: the prompts rank r ran.
  std::vector<std::map<size_t, PromptResult>> ranks(static_cast<size_t>(tp));
  run_local_ranks(tp, [&](Comm& comm) {
    const int r = comm.rank();
    const auto mapping = c.pc.mapping(r);
    model::LoadOptions options;
    options.progress = false;
    const model::LoadedModel loaded = model::load_model(testing::testdata(c.model), mapping, options);
    CpuBackend backend(loaded.config, loaded.params, comm, mapping, CacheConfig{4, 16, 64}, c.pc.moe_comm);
    auto& mine = ranks[static_cast<size_t>(r)];
    std::map<int64_t, size_t> prompt_of;  // request id → prompt index
    ParallelEngine engine(backend, comm, {}, [&](const TokenEvent& e) {
      if (e.token < 0) return;
      PromptResult& pr = mine[prompt_of.at(e.request_id)];
      pr.tokens.push_back(e.token);
      pr.step_logits.insert(pr.step_logits.end(), e.logits.begin(), e.logits.end());
    });
    engine.engine().set_prompt_logits_callback([&](int64_t id, int64_t, std::span<const float> rows, int64_t) {
      PromptResult& pr = mine[prompt_of.at(id)];
      pr.logits.insert(pr.logits.end(), rows.begin(), rows.end());
    });
    for (size_t i = 0; i < g.prompts.size(); ++i) {
      // Attention-DP deals the prompts out (rank i mod tp); otherwise every rank runs every prompt.
      if (c.pc.attention_dp && static_cast<int>(i % static_cast<size_t>(tp)) != r) continue;
      GenerationRequest req;
      req.prompt = g.ids(g.prompts[i] + ".input_ids");
      req.sampling.max_tokens = static_cast<int>(g.ids(g.prompts[i] + ".greedy_ids").size());
      req.prompt_logits = true;
      req.step_logits = true;
      prompt_of[engine.engine().submit(req)] = i;
      mine[i];
    }
    engine.run_until_idle();
  });

  for (size_t i = 0; i < g.prompts.size(); ++i) {
    const std::string& p = g.prompts[i];
    int ran = 0;
    for (int r = 0; r < tp; ++r) {
      const auto& mine = ranks[static_cast<size_t>(r)];
      if (!mine.count(i)) continue;
      ++ran;
      const PromptResult& pr = mine.at(i);
      EXPECT_LE(testing::rel_error(pr.logits, g.f32(p + ".logits")), kTol) << p << " on rank " << r;
      EXPECT_EQ(pr.tokens, g.ids(p + ".greedy_ids")) << p << " on rank " << r;
      EXPECT_LE(testing::rel_error(pr.step_logits, g.f32(p + ".greedy_logits")), kTol) << p << " on rank " << r;
      if (!c.pc.attention_dp) {
        const PromptResult& first = ranks[0].at(i);
        EXPECT_EQ(pr.logits, first.logits) << p << ": rank " << r << " disagrees with rank 0";
        EXPECT_EQ(pr.step_logits, first.step_logits) << p << ": rank " << r << " disagrees with rank 0";
      }
    }
    EXPECT_EQ(ran, c.pc.attention_dp ? 1 : tp) << p;
  }
}

constexpr MoeComm kA2a = MoeComm::kAllToAll;

// k3-tiny's MXFP4 experts (64 wide, groups of 32) allow moe_tp ≤ 2; kl-tiny's BF16 experts any.
INSTANTIATE_TEST_SUITE_P(Modes, ParallelGolden,
                         ::testing::Values(Case{"k3-tiny", {2, 1}}, Case{"k3-tiny", {2, 2}}, Case{"k3-tiny", {4, 2}},
                                           Case{"k3-tiny", {4, 4}}, Case{"k3-tiny", {2, 2, false, kA2a}},
                                           Case{"k3-tiny", {4, 4, false, kA2a}}, Case{"k3-tiny", {2, 2, true}},
                                           Case{"k3-tiny", {4, 4, true}}, Case{"kl-tiny", {2, 1}},
                                           Case{"kl-tiny", {2, 2}}, Case{"kl-tiny", {4, 1}}, Case{"kl-tiny", {4, 2}},
                                           Case{"kl-tiny", {4, 4}}, Case{"kl-tiny", {4, 4, false, kA2a}},
                                           Case{"kl-tiny", {2, 2, true}}, Case{"kl-tiny", {4, 4, true}}),
                         case_name);

}  // namespace
}  // namespace kimirt::runtime
