#include "kimirt/model/tiny_checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "kimirt/io/checkpoint.h"
#include "kimirt/model/load_plan.h"
#include "kimirt/model/schema.h"
#include "kimirt/tensor/float_convert.h"
#include "loader_test_util.h"

namespace kimirt::model {
namespace {

using loadtest::error_of;
using loadtest::Scratch;
using ::testing::HasSubstr;

std::vector<float> values_of(const io::Checkpoint& c, const std::string& key) { return c.read_tensor(key).to_f32(); }

double stddev(const std::vector<float>& v) {
  double mean = 0, sq = 0;
  for (float x : v) mean += x;
  mean /= static_cast<double>(v.size());
  for (float x : v) sq += (x - mean) * (x - mean);
  return std::sqrt(sq / static_cast<double>(v.size()));
}

TEST(TinyCheckpoint, K3OpensStrictlyAndMatchesItsSchemaExactly) {
  Scratch scratch;
  const ModelConfig config = tiny_config(ModelFamily::kKimiK3);
  const auto info = write_tiny_checkpoint(scratch / "k3", config, {.seed = 1, .shard_bytes = 256 << 10});
  const io::Checkpoint c = io::Checkpoint::open(scratch / "k3");  // every header and the index, strictly
  EXPECT_EQ(c.size(), info.tensors);
  EXPECT_EQ(c.tensor_bytes(), info.tensor_bytes);
  EXPECT_EQ(c.shards().size(), info.shards);
  EXPECT_TRUE(c.warnings().empty());
  ASSERT_NE(c.index(), nullptr);
  EXPECT_EQ(c.index()->total_size(), info.tensor_bytes);
  EXPECT_EQ(ModelConfig::from_json(c.config()), config);
  EXPECT_TRUE(c.has_file("generation_config.json"));
  EXPECT_EQ(info.tensor_bytes, tiny_checkpoint_bytes(config));

  const Schema schema = Schema::for_checkpoint(config, checkpoint_keys(c));
  EXPECT_EQ(schema.layout().prefix, "language_model.");
  const auto want = schema.all_checkpoint_keys();
  const auto names = c.tensor_names();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), want);
  // Same structure as the golden k3-tiny (its index lists 636 tensors for these dimensions).
  EXPECT_EQ(c.size(), 636u);
}

TEST(TinyCheckpoint, ShardLayoutFollowsTheRelease) {
  Scratch scratch;
  const ModelConfig config = tiny_config(ModelFamily::kKimiK3);
  write_tiny_checkpoint(scratch / "k3", config, {.seed = 1, .shard_bytes = 100 << 10});
  const io::Checkpoint c = io::Checkpoint::open(scratch / "k3");
  const auto& shards = c.shards();
  ASSERT_GE(shards.size(), 4u);
  EXPECT_NE(shards.front().find("language_model.model.embed_tokens.weight"), nullptr);
  ASSERT_EQ(shards.back().tensors().size(), 1u);
  EXPECT_EQ(shards.back().tensors()[0].name, "language_model.lm_head.weight");
  int expert_shards = 0;
  bool some_expert_split = false;
  for (const auto& shard : shards) {
    std::set<std::string> layers_with_experts;
    bool trunk = false;
    for (const auto& t : shard.tensors()) {
      const auto pos = t.name.find(".experts.");
      if (pos == std::string::npos) {
        trunk = true;
      } else {
        layers_with_experts.insert(t.name.substr(0, pos));
      }
    }
    if (layers_with_experts.empty()) continue;
    ++expert_shards;
    EXPECT_FALSE(trunk) << shard.path() << " mixes routed experts with other parameters";
    EXPECT_EQ(layers_with_experts.size(), 1u) << shard.path() << " holds experts of several layers";
    // A shard that starts mid-expert holds the rest of an expert whose first tensors are elsewhere.
    for (const auto& t : shard.tensors()) {
      const std::string w1 = t.name.substr(0, t.name.rfind(".w")) + ".w1.weight_packed";
      if (shard.find(w1) == nullptr) some_expert_split = true;
    }
  }
  EXPECT_GE(expert_shards, 5);  // layers 1..5 are MoE
  EXPECT_TRUE(some_expert_split) << "100 KiB shards should cut through an expert";
}

TEST(TinyCheckpoint, ValuesFollowTheGoldenDistributions) {
  Scratch scratch;
  const ModelConfig config = tiny_config(ModelFamily::kKimiK3);
  write_tiny_checkpoint(scratch / "k3", config, {.seed = 3});
  const io::Checkpoint c = io::Checkpoint::open(scratch / "k3");
  const std::string l1 = "language_model.model.layers.1.";

  // Linear: N(0, 1/fan_in) in BF16 (q_proj [128, 256]: 32768 samples, std within 3%).
  const auto& q = c.at(l1 + "self_attn.q_proj.weight");
  EXPECT_EQ(q.info->dtype, DType::kBF16);
  EXPECT_NEAR(stddev(values_of(c, l1 + "self_attn.q_proj.weight")), 1.0 / 16.0, 0.03 / 16.0);
  // Norms U(0.8, 1.2), rounded to BF16 (half an ulp near 1.2 is 2^-8).
  for (float v : values_of(c, l1 + "input_layernorm.weight")) {
    EXPECT_GE(v, 0.8f - 0x1p-8f);
    EXPECT_LE(v, 1.2f + 0x1p-8f);
  }
  // Small KDA tensors and the router bias in F32, as released.
  for (const char* k : {"self_attn.A_log", "self_attn.dt_bias", "self_attn.q_conv1d.weight", "self_attn.o_norm.weight",
                        "block_sparse_moe.gate.e_score_correction_bias"}) {
    EXPECT_EQ(c.at(l1 + k).info->dtype, DType::kF32) << k;
  }
  EXPECT_NEAR(stddev(values_of(c, l1 + "self_attn.q_conv1d.weight")), 0.3, 0.03);  // 512 samples
  EXPECT_NEAR(stddev(values_of(c, l1 + "self_attn.dt_bias")), 0.5, 0.1);           // 128 samples
  // A_log: log U(0.5, 16) for the 4 heads, zero padding up to head_dim 32.
  const auto a_log = values_of(c, l1 + "self_attn.A_log");
  ASSERT_EQ(a_log.size(), 32u);
  for (size_t i = 0; i < a_log.size(); ++i) {
    if (i < 4) {
      EXPECT_GE(std::exp(a_log[i]), 0.5f);
      EXPECT_LE(std::exp(a_log[i]), 16.0f);
    } else {
      EXPECT_EQ(a_log[i], 0.0f) << i;
    }
  }
  // MXFP4 experts: E8M0 scales 2^-3..2^-6 (codes 121..124), every E2M1 code used.
  const Tensor scale = c.read_tensor(l1 + "block_sparse_moe.experts.0.w1.weight_scale");
  std::set<int> scales(scale.data_as<uint8_t>(), scale.data_as<uint8_t>() + scale.nbytes());
  EXPECT_EQ(scales, (std::set<int>{121, 122, 123, 124}));
  const Tensor packed = c.read_tensor(l1 + "block_sparse_moe.experts.0.w1.weight_packed");
  std::set<int> codes;
  for (uint64_t i = 0; i < packed.nbytes(); ++i) {
    codes.insert(packed.data_as<uint8_t>()[i] & 15);
    codes.insert(packed.data_as<uint8_t>()[i] >> 4);
  }
  EXPECT_EQ(codes.size(), 16u);
}

TEST(TinyCheckpoint, ValuesDependOnlyOnSeedAndName) {
  Scratch scratch;
  const ModelConfig config = tiny_config(ModelFamily::kKimiK3);
  write_tiny_checkpoint(scratch / "a", config, {.seed = 5, .shard_bytes = 64 << 10});
  write_tiny_checkpoint(scratch / "b", config, {.seed = 5});
  write_tiny_checkpoint(scratch / "c", config, {.seed = 6});
  const io::Checkpoint a = io::Checkpoint::open(scratch / "a"), b = io::Checkpoint::open(scratch / "b"),
                       c = io::Checkpoint::open(scratch / "c");
  EXPECT_GT(a.shards().size(), b.shards().size());
  size_t differ = 0;
  for (const auto& name : a.tensor_names()) {
    EXPECT_EQ(loadtest::bytes_of(a.read_tensor(name)), loadtest::bytes_of(b.read_tensor(name))) << name;
    differ += loadtest::bytes_of(a.read_tensor(name)) != loadtest::bytes_of(c.read_tensor(name));
  }
  EXPECT_GT(differ, a.size() * 9 / 10);  // only all-constant tensors (none expected) would agree
}

TEST(TinyCheckpoint, KimiLinearWithBf16ExpertsLikeTheTransformersSave) {
  Scratch scratch;
  const ModelConfig config = tiny_config(ModelFamily::kKimiLinear, {}, ExpertStorage::kBf16);
  write_tiny_checkpoint(scratch / "kl", config);
  const io::Checkpoint c = io::Checkpoint::open(scratch / "kl");
  EXPECT_EQ(ModelConfig::from_json(c.config()), config);
  const auto& a_log = c.at("model.layers.0.self_attn.A_log");
  EXPECT_EQ(a_log.info->shape, (Shape{1, 1, 4, 1}));
  EXPECT_EQ(c.at("model.layers.1.block_sparse_moe.experts.3.w2.weight").info->dtype, DType::kBF16);
  EXPECT_EQ(c.find("model.layers.0.mlp.gate_proj.weight") != nullptr, true);
  const Schema schema = Schema::for_checkpoint(config, checkpoint_keys(c));
  const auto names = c.tensor_names();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), schema.all_checkpoint_keys());
  LoadOptions quiet;
  quiet.progress = false;
  const ParamStore store = load_params(c, schema, ParallelMapping::make(2, 1, 2), quiet);
  EXPECT_EQ(store.at("model.layers.0.self_attn.A_log").shape, (Shape{2}));  // rank 1's heads of 4
}

TEST(TinyCheckpoint, Fp8ExpertsCarryBlockScales) {
  Scratch scratch;
  TinyDims dims = loadtest::small_k3_dims();
  dims.moe_intermediate = 192;  // two 128-row blocks, the second partial
  dims.latent = 128;
  const ModelConfig config = tiny_config(ModelFamily::kKimiK3, dims, ExpertStorage::kFp8);
  write_tiny_checkpoint(scratch / "fp8", config);
  const io::Checkpoint c = io::Checkpoint::open(scratch / "fp8");
  const std::string w = "language_model.model.layers.1.block_sparse_moe.experts.2.w1.";
  const Tensor weight = c.read_tensor(w + "weight");
  const Tensor scale = c.read_tensor(w + "weight_scale");
  ASSERT_EQ(weight.dtype(), DType::kF8E4M3);
  ASSERT_EQ(weight.shape(), (Shape{192, 128}));
  ASSERT_EQ(scale.dtype(), DType::kF32);
  ASSERT_EQ(scale.shape(), (Shape{2, 1}));
  // scale = amax / 448: each block's largest code is +-448, and the scaled values are N(0, 1/128).
  for (int64_t b = 0; b < 2; ++b) {
    float amax = 0;
    for (int64_t i = b * 128 * 128; i < std::min<int64_t>(192, (b + 1) * 128) * 128; ++i) {
      amax = std::max(amax, std::fabs(e4m3_to_f32(weight.data_as<uint8_t>()[i])));
    }
    EXPECT_EQ(amax, 448.0f);
    EXPECT_NEAR(scale.data_as<float>()[b] * 448.0f, 3.5f / std::sqrt(128.0f), 2.0f / std::sqrt(128.0f));
  }
  const Schema schema = Schema::for_checkpoint(config, checkpoint_keys(c));
  EXPECT_EQ(schema.find("model.layers.1.block_sparse_moe.experts.2.w1.weight")->sources[0].format,
            quant::WeightFormat::kFp8BlockScale);
  // It loads, and dequantizes to code x block scale.
  LoadOptions quiet;
  quiet.progress = false;
  const LoadedModel m = load_model(scratch / "fp8", ParallelMapping{}, quiet);
  const LoadedParam& p = m.params.at("model.layers.1.block_sparse_moe.experts.2.w1.weight");
  EXPECT_EQ(p.format, quant::WeightFormat::kFp8BlockScale);
  const auto values = p.to_f32().to_f32();
  ASSERT_EQ(values.size(), 192u * 128);
  EXPECT_EQ(values[130 * 128 + 5], e4m3_to_f32(weight.data_as<uint8_t>()[130 * 128 + 5]) * scale.data_as<float>()[1]);
}

TEST(TinyCheckpoint, ScalesExpertsToATargetSize) {
  ModelConfig config = tiny_config(ModelFamily::kKimiK3);
  const uint64_t target = uint64_t{20} << 20;
  scale_experts_to_size(config, target);
  EXPECT_EQ(config.num_experts % 8, 0);
  EXPECT_GE(tiny_checkpoint_bytes(config), target);
  ModelConfig smaller = config;
  smaller.num_experts -= 8;
  EXPECT_LT(tiny_checkpoint_bytes(smaller), target);
  // A top-k above the experts a small target needs: the experts grow to hold it (top-k 12 had been lowered to 8).
  ModelConfig wide = tiny_config(ModelFamily::kKimiK3);
  wide.num_experts_per_token = 12;
  scale_experts_to_size(wide, 1);
  EXPECT_EQ(wide.num_experts_per_token, 12);
  EXPECT_EQ(wide.num_experts, 16);
}

TEST(TinyCheckpoint, RefusesToOverwriteAndLeavesNothingBehindOnError) {
  Scratch scratch;
  const ModelConfig config = tiny_config(ModelFamily::kKimiK3);
  std::filesystem::create_directories(scratch / "full");
  std::ofstream(scratch / "full" / "keep.txt") << "x";
  EXPECT_THAT(error_of([&] { write_tiny_checkpoint(scratch / "full", config); }),
              HasSubstr("full: exists and is not an empty directory"));
  TinyCheckpointOptions o;
  o.side_files = {scratch / "no-such-tokenizer.model"};
  EXPECT_THAT(error_of([&] { write_tiny_checkpoint(scratch / "out", config, o); }),
              HasSubstr("no-such-tokenizer.model: no such file"));
  EXPECT_FALSE(std::filesystem::exists(scratch / "out"));
  // Side files are copied in under their own names (the tokenizer hook).
  std::ofstream(scratch / "tiktoken.model") << "YQ== 0\n";
  o.side_files = {scratch / "tiktoken.model"};
  write_tiny_checkpoint(scratch / "empty-ok", config, o);
  EXPECT_TRUE(std::filesystem::is_regular_file(scratch / "empty-ok" / "tiktoken.model"));
  for (const auto& e : std::filesystem::directory_iterator(scratch.path())) {
    EXPECT_EQ(e.path().filename().string().find(".partial"), std::string::npos) << e.path();
  }
}

TEST(TinyCheckpoint, DimensionsAreValidated) {
  TinyDims dims;
  dims.top_k = 50;
  dims.experts = 8;
  // Refused, not clamped: a model that silently routes to 8 experts is not the one asked for.
  EXPECT_THAT(error_of([&] { tiny_config(ModelFamily::kKimiK3, dims); }),
              HasSubstr("make-tiny: --top-k (50) is more than the experts per layer (8, --experts)"));
  dims.top_k.reset();
  EXPECT_EQ(tiny_config(ModelFamily::kKimiK3, dims).num_experts_per_token, 4);  // the default
  dims.experts = 2;
  EXPECT_EQ(tiny_config(ModelFamily::kKimiK3, dims).num_experts_per_token, 2);  // the default, shrunk
  dims = {};
  dims.latent = 63;  // packed FP4 needs even widths
  EXPECT_THAT(error_of([&] { tiny_config(ModelFamily::kKimiK3, dims); }), HasSubstr("even widths"));
  dims = {};
  dims.q_lora_rank = 16;
  EXPECT_THAT(error_of([&] { tiny_config(ModelFamily::kKimiLinear, dims, ExpertStorage::kBf16); }),
              HasSubstr("--q-lora-rank is a Kimi K3 dimension"));
}

}  // namespace
}  // namespace kimirt::model
