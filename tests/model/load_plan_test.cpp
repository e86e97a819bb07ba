#include "kimirt/model/load_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <utility>

#include "loader_test_util.h"

namespace kimirt::model {
namespace {

using loadtest::error_of;
using loadtest::Scratch;
using quant::Region;
using ::testing::HasSubstr;

std::string testdata(const std::string& rel) { return std::string(KIMIRT_TESTDATA_DIR) + "/" + rel; }

struct Opened {
  io::Checkpoint checkpoint;
  ModelConfig config;
  Schema schema;
};

Opened open(const std::filesystem::path& dir) {
  io::Checkpoint c = io::Checkpoint::open(dir);
  ModelConfig config = ModelConfig::from_json(c.config());
  Schema schema = Schema::for_checkpoint(config, checkpoint_keys(c));
  return {std::move(c), std::move(config), std::move(schema)};
}

const PlannedRead& read_of(const LoadPlan& plan, const std::string& key) {
  for (const auto& r : plan.reads()) {
    if (r.key == key) return r;
  }
  throw Error("no read of " + key);
}

TEST(RegionBlocks, MergesWholeDimensionsIntoOneRun) {
  // Rows [2, 5) of a [8, 6] F32 tensor: one contiguous run.
  auto b = region_blocks({8, 6}, Region{{2, 0}, {3, 6}}, {3, 6}, Region{{0, 0}, {3, 6}}, 4, 7);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].dest, 7u);
  EXPECT_EQ(b[0].src_offset, 2u * 6 * 4);
  EXPECT_EQ(b[0].width, 3u * 6 * 4);
  EXPECT_EQ(b[0].rows, 1u);
  // Columns [2, 4) of it: 8 rows of 2 elements.
  b = region_blocks({8, 6}, Region{{0, 2}, {8, 2}}, {8, 2}, Region{{0, 0}, {8, 2}}, 4, 0);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].src_offset, 8u);
  EXPECT_EQ(b[0].src_pitch, 24u);
  EXPECT_EQ(b[0].dst_pitch, 8u);
  EXPECT_EQ(b[0].width, 8u);
  EXPECT_EQ(b[0].rows, 8u);
  // Into the second half of a fused destination: rows land at an offset.
  b = region_blocks({4, 6}, Region{{0, 0}, {4, 6}}, {8, 6}, Region{{4, 0}, {4, 6}}, 2, 0);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].dst_offset, 4u * 6 * 2);
  // A middle dimension cut in a 3-D tensor: one block per outer index.
  b = region_blocks({2, 4, 3}, Region{{0, 1, 0}, {2, 2, 3}}, {2, 2, 3}, Region{{0, 0, 0}, {2, 2, 3}}, 1, 0);
  ASSERT_EQ(b.size(), 1u);  // rows = the outer dimension, width = 2 x 3
  EXPECT_EQ(b[0].rows, 2u);
  EXPECT_EQ(b[0].width, 6u);
  EXPECT_EQ(b[0].src_pitch, 12u);
  b = region_blocks({2, 3, 4, 5}, Region{{0, 0, 1, 0}, {2, 3, 2, 5}}, {2, 3, 2, 5}, Region{{0, 0, 0, 0}, {2, 3, 2, 5}},
                    1, 0);
  EXPECT_EQ(b.size(), 2u);  // index over dim 0, rows over dim 1
  uint64_t total = 0;
  for (const auto& x : b) total += x.bytes();
  EXPECT_EQ(total, 2u * 3 * 2 * 5);
  // A scalar.
  b = region_blocks({}, Region{}, {}, Region{}, 4, 3);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].bytes(), 4u);
}

TEST(LoadPlan, K3TinyAtTp1ReadsEveryTensorOnceGroupedByFile) {
  const Opened o = open(testdata("k3-tiny"));
  const LoadPlan plan = LoadPlan::build(o.checkpoint, o.schema, ParallelMapping{});
  EXPECT_TRUE(plan.unexpected_keys().empty());
  EXPECT_EQ(plan.reads().size(), o.checkpoint.size());  // 636: every tensor, each once
  EXPECT_EQ(plan.read_bytes(), o.checkpoint.tensor_bytes());
  EXPECT_EQ(plan.files().size(), 12u);
  for (size_t f = 0; f < plan.files().size(); ++f) {
    if (f > 0) {
      EXPECT_LT(plan.files()[f - 1].shard->path(), plan.files()[f].shard->path());
    }
    uint64_t last = 0;
    for (uint32_t r : plan.files()[f].reads) {
      EXPECT_EQ(plan.reads()[r].shard, plan.files()[f].shard);
      EXPECT_GE(plan.reads()[r].offset, last);
      last = plan.reads()[r].offset + plan.reads()[r].length;
    }
  }
  // 5 MoE layers x 16 local experts, each slot the six MXFP4 tensors of w1/w2/w3.
  ASSERT_EQ(plan.expert_slots().size(), 80u);
  const ExpertSlot& s = plan.expert_slots()[17];
  EXPECT_EQ(s.layer, 2);
  EXPECT_EQ(s.local_expert, 1);
  EXPECT_EQ(s.params.size(), 3u);
  EXPECT_EQ(s.bytes, 3u * (64 * 128 / 2 + 64 * 4));
  // Fused gate/up: two reads into one destination, gate rows first.
  const auto& gate = read_of(plan, "language_model.model.layers.0.mlp.gate_proj.weight");
  const auto& up = read_of(plan, "language_model.model.layers.0.mlp.up_proj.weight");
  ASSERT_EQ(gate.blocks.size(), 1u);
  ASSERT_EQ(up.blocks.size(), 1u);
  EXPECT_EQ(gate.blocks[0].dest, up.blocks[0].dest);
  EXPECT_EQ(gate.blocks[0].dst_offset, 0u);
  EXPECT_EQ(up.blocks[0].dst_offset, 512u * 256 * 2);
  // A_log is read whole, padding included, so its values can be checked.
  const auto& a_log = read_of(plan, "language_model.model.layers.1.self_attn.A_log");
  EXPECT_TRUE(a_log.check_values);
  EXPECT_EQ(a_log.length, 32u * 4);
  EXPECT_EQ(plan.dests()[a_log.blocks[0].dest].shape, (Shape{4}));
}

TEST(LoadPlan, TensorParallelReadsOnlyTheRowsARankHolds) {
  const Opened o = open(testdata("k3-tiny"));
  const LoadPlan plan = LoadPlan::build(o.checkpoint, o.schema, ParallelMapping::make(2, 1, 2));
  const auto& info = *o.checkpoint.at("language_model.lm_head.weight").info;
  const auto& head = read_of(plan, "language_model.lm_head.weight");
  EXPECT_EQ(head.length, info.nbytes() / 2);  // vocabulary rows [512, 1024)
  EXPECT_EQ(head.offset,
            o.checkpoint.at("language_model.lm_head.weight").shard->absolute_offset(info) + info.nbytes() / 2);
  // o_proj [256, 128] is cut by columns [64, 128): every row is needed, so all but the first row's first
  // 64 BF16 columns is read.
  const std::string o_proj = "language_model.model.layers.1.self_attn.o_proj.weight";
  EXPECT_EQ(read_of(plan, o_proj).length, o.checkpoint.at(o_proj).info->nbytes() - 64 * 2);
  EXPECT_EQ(read_of(plan, o_proj).blocks[0].rows, 256u);
  // EP rank 1 of 2 holds experts 8..15 only; the others are not read and not unexpected.
  EXPECT_TRUE(plan.unexpected_keys().empty());
  EXPECT_EQ(plan.expert_slots().size(), 5u * 8);
  for (const auto& r : plan.reads()) {
    EXPECT_EQ(r.key.find(".experts.3."), std::string::npos) << r.key;
  }
  EXPECT_EQ(plan.expert_slots()[0].expert, 8);
  EXPECT_EQ(plan.expert_slots()[0].local_expert, 0);
  EXPECT_LT(plan.read_bytes(), o.checkpoint.tensor_bytes() * 3 / 4);
}

TEST(LoadPlan, MissingKeysAreOneErrorListingThemAll) {
  Scratch scratch;
  const ModelConfig config = tiny_config(ModelFamily::kKimiK3, loadtest::small_k3_dims());
  auto raw = loadtest::read_raw(loadtest::make_checkpoint(scratch / "good", config));
  const std::string a = "language_model.model.layers.1.block_sparse_moe.experts.2.w2.weight_scale";
  const std::string b = "language_model.model.norm.weight";
  raw.tensors.erase(a);
  raw.tensors.erase(b);
  loadtest::write_raw(scratch / "bad", raw);
  const io::Checkpoint c = io::Checkpoint::open(scratch / "bad");
  const Schema schema(config, default_layout(config));
  const std::string e = error_of([&] { LoadPlan::build(c, schema, ParallelMapping{}); });
  EXPECT_THAT(e, HasSubstr("2 tensor(s) that this rank (tp 0/1, ep 0/1, moe_tp 1, attention-DP off) needs are "
                           "missing from the checkpoint: " +
                           a + ", " + b));
  EXPECT_THAT(e, HasSubstr("bad"));
  // Another EP rank does not need expert 2, so it loads without it... but still misses the norm.
  EXPECT_THAT(error_of([&] { LoadPlan::build(c, schema, ParallelMapping::make(2, 1, 2)); }),
              HasSubstr("1 tensor(s) that this rank"));
}

TEST(LoadPlan, UnexpectedKeysWarnOrFailWhenStrict) {
  Scratch scratch;
  const ModelConfig config = tiny_config(ModelFamily::kKimiK3, loadtest::small_k3_dims());
  auto raw = loadtest::read_raw(loadtest::make_checkpoint(scratch / "good", config));
  const auto shard = raw.shard_of.begin()->second;
  raw.tensors["language_model.model.layers.9.mlp.up_proj.weight"] = {DType::kBF16, {2}, std::vector<uint8_t>(4)};
  raw.shard_of["language_model.model.layers.9.mlp.up_proj.weight"] = shard;
  raw.tensors["language_model.vision_tower.patch_embed.weight"] = {DType::kBF16, {2}, std::vector<uint8_t>(4)};
  raw.shard_of["language_model.vision_tower.patch_embed.weight"] = shard;
  loadtest::write_raw(scratch / "extra", raw);
  const io::Checkpoint c = io::Checkpoint::open(scratch / "extra");
  const Schema schema = Schema::for_checkpoint(config, checkpoint_keys(c));
  const LoadPlan plan = LoadPlan::build(c, schema, ParallelMapping{});
  // The vision tower is not a warning: a text model never reads it.
  EXPECT_EQ(plan.unexpected_keys(), std::vector<std::string>{"language_model.model.layers.9.mlp.up_proj.weight"});
  EXPECT_THAT(error_of([&] { LoadPlan::build(c, schema, ParallelMapping{}, /*strict=*/true); }),
              HasSubstr("1 tensor(s) are not parameters of this kimi_k3 model (strict loading): "
                        "language_model.model.layers.9.mlp.up_proj.weight"));
}

// A K3 checkpoint read under a config that turns one of its parts off (AttnRes, the MLA output gate, the shared
// experts, an untied LM head): the model would run without weights it was trained with, so the plan refuses it,
// naming the field and the tensors (it had ignored them with the warning for stray tensors).
TEST(LoadPlan, WeightsOfAPartTheConfigTurnsOffAreRefused) {
  Scratch scratch;
  const ModelConfig config = tiny_config(ModelFamily::kKimiK3, loadtest::small_k3_dims());
  ASSERT_TRUE(config.has_attn_res() && config.mla_use_output_gate && config.num_shared_experts > 0 &&
              !config.tie_word_embeddings);
  const auto dir = loadtest::make_checkpoint(scratch / "k3", config);
  const io::Checkpoint c = io::Checkpoint::open(dir);
  const std::pair<std::function<void(ModelConfig&)>, std::string> parts[] = {
      {[](ModelConfig& m) { m.attn_res_block_size = 0; },
       "block attention residual (AttnRes) tensor(s) are in the checkpoint, but the config's attn_res_block_size is 0"},
      {[](ModelConfig& m) { m.mla_use_output_gate = false; },
       "MLA output gate tensor(s) are in the checkpoint, but the config's mla_use_output_gate is false"},
      {[](ModelConfig& m) { m.num_shared_experts = 0; },
       "shared expert tensor(s) are in the checkpoint, but the config's num_shared_experts is 0"},
      {[](ModelConfig& m) { m.tie_word_embeddings = true; },
       "1 LM head tensor(s) are in the checkpoint, but the config's tie_word_embeddings is true"},
  };
  for (const auto& [off, message] : parts) {
    ModelConfig changed = config;
    off(changed);
    const Schema schema = Schema::for_checkpoint(changed, checkpoint_keys(c));
    const std::string error = error_of([&] { LoadPlan::build(c, schema, ParallelMapping{}); });
    EXPECT_THAT(error, HasSubstr(message));
    EXPECT_THAT(error, HasSubstr("language_model."));
  }
}

TEST(LoadPlan, WrongShapeOrDtypeIsRefusedBeforeAnyRead) {
  Scratch scratch;
  const ModelConfig config = tiny_config(ModelFamily::kKimiK3, loadtest::small_k3_dims());
  const auto good = loadtest::read_raw(loadtest::make_checkpoint(scratch / "good", config));
  const Schema schema(config, default_layout(config));
  const std::string q = "language_model.model.layers.1.self_attn.q_proj.weight";
  {
    auto raw = good;
    raw.tensors[q].shape = {63, 64};
    raw.tensors[q].bytes.resize(63 * 64 * 2);
    loadtest::write_raw(scratch / "shape", raw);
    const io::Checkpoint c = io::Checkpoint::open(scratch / "shape");
    EXPECT_THAT(error_of([&] { LoadPlan::build(c, schema, ParallelMapping{}); }),
                HasSubstr(q + ": shape [63, 64] != expected [64, 64]"));
  }
  {
    auto raw = good;
    raw.tensors[q].dtype = DType::kI16;
    loadtest::write_raw(scratch / "dtype", raw);
    const io::Checkpoint c = io::Checkpoint::open(scratch / "dtype");
    EXPECT_THAT(error_of([&] { LoadPlan::build(c, schema, ParallelMapping{}); }),
                HasSubstr(q + ": dtype I16 is not valid"));
  }
  {
    auto raw = good;  // A_log's shape is checked up front too; its padding values when it is read
    const std::string a_log = "language_model.model.layers.1.self_attn.A_log";
    raw.tensors[a_log].shape = {2};
    raw.tensors[a_log].bytes.resize(8);
    loadtest::write_raw(scratch / "alog", raw);
    const io::Checkpoint c = io::Checkpoint::open(scratch / "alog");
    EXPECT_THAT(error_of([&] { LoadPlan::build(c, schema, ParallelMapping{}); }),
                HasSubstr(a_log + ": shape [2] is not a vector of at least num_heads (4) values"));
  }
}

TEST(LoadPlan, RefusesAMappingTheModelCannotTake) {
  const Opened o = open(testdata("k3-tiny"));
  EXPECT_THAT(error_of([&] { LoadPlan::build(o.checkpoint, o.schema, ParallelMapping::make(8, 0, 8)); }),
              HasSubstr("does not divide the KDA heads"));
}

}  // namespace
}  // namespace kimirt::model
