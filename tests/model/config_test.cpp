#include "kimirt/model/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "test_util.h"

namespace kimirt::model {
namespace {

using testing::error_of;
using ::testing::HasSubstr;
using testing::read_json;
using json = nlohmann::json;

constexpr auto K = LayerMixer::kKda;
constexpr auto M = LayerMixer::kMla;

TEST(Config, ParsesKimiLinearTiny) {
  const auto c = ModelConfig::from_json(read_json("kl-tiny/config.json"));
  EXPECT_EQ(c.family, ModelFamily::kKimiLinear);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_layers, 5);
  EXPECT_EQ(c.intermediate_size, 128);
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_EQ(c.moe_layer_freq, 1);
  EXPECT_EQ(c.layer_mixers, (std::vector<LayerMixer>{K, K, K, M, K}));
  EXPECT_EQ(c.mla_num_heads, 4);
  EXPECT_FALSE(c.q_lora_rank.has_value());
  EXPECT_EQ(c.kv_lora_rank, 32);
  EXPECT_EQ(c.qk_nope_head_dim, 16);
  EXPECT_EQ(c.qk_rope_head_dim, 8);
  EXPECT_EQ(c.v_head_dim, 16);
  EXPECT_FALSE(c.mla_use_output_gate);
  EXPECT_EQ(c.head_dim_field, 24);
  EXPECT_EQ(c.kda_num_heads, 4);
  EXPECT_EQ(c.kda_head_dim, 16);
  EXPECT_EQ(c.kda_conv_kernel, 4);
  EXPECT_FALSE(c.kda_gate_lower_bound.has_value());
  EXPECT_FALSE(c.kda_use_full_rank_gate);
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.num_experts_per_token, 2);
  EXPECT_EQ(c.num_shared_experts, 1);
  EXPECT_EQ(c.moe_intermediate_size, 32);
  EXPECT_FALSE(c.latent_moe());
  EXPECT_TRUE(c.moe_renormalize);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.446);
  EXPECT_EQ(c.num_expert_group, 1);
  EXPECT_EQ(c.topk_group, 1);
  EXPECT_EQ(c.hidden_act, HiddenAct::kSilu);
  EXPECT_FALSE(c.has_attn_res());
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_id, 2);
  EXPECT_EQ(c.pad_token_id, 0);
  EXPECT_EQ(c.max_position_embeddings, 1048576);
  EXPECT_EQ(c.quantization.method, QuantMethod::kNone);
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(1));
  EXPECT_TRUE(c.is_moe_layer(4));
}

TEST(Config, ParsesKimiK3Tiny) {
  const auto c = ModelConfig::from_json(read_json("k3-tiny/config.json"));
  EXPECT_EQ(c.family, ModelFamily::kKimiK3);
  EXPECT_EQ(c.vocab_size, 1024);
  EXPECT_EQ(c.hidden_size, 256);
  EXPECT_EQ(c.num_layers, 6);
  EXPECT_EQ(c.intermediate_size, 512);
  EXPECT_EQ(c.layer_mixers, (std::vector<LayerMixer>{K, K, K, M, K, M}));
  EXPECT_EQ(c.mla_num_heads, 4);
  EXPECT_EQ(c.q_lora_rank, 64);
  EXPECT_EQ(c.kv_lora_rank, 32);
  EXPECT_EQ(c.qk_nope_head_dim, 32);
  EXPECT_EQ(c.qk_rope_head_dim, 16);
  EXPECT_EQ(c.v_head_dim, 32);
  EXPECT_TRUE(c.mla_use_output_gate);
  EXPECT_EQ(c.kda_num_heads, 4);
  EXPECT_EQ(c.kda_head_dim, 32);
  EXPECT_EQ(c.kda_gate_lower_bound, -5.0);
  EXPECT_TRUE(c.kda_use_full_rank_gate);
  EXPECT_EQ(c.num_experts, 16);
  EXPECT_EQ(c.num_experts_per_token, 4);
  EXPECT_EQ(c.num_shared_experts, 2);
  EXPECT_EQ(c.shared_intermediate_size(), 128);
  EXPECT_EQ(c.moe_intermediate_size, 64);
  EXPECT_EQ(c.routed_expert_hidden_size, 128);
  EXPECT_TRUE(c.latent_moe_use_norm);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 1.0);
  EXPECT_EQ(c.hidden_act, HiddenAct::kSitu);
  EXPECT_EQ(c.situ_beta, 4.0);
  EXPECT_EQ(c.situ_linear_beta, 25.0);
  EXPECT_EQ(c.attn_res_block_size, 2);
  EXPECT_EQ(c.bos_token_id, 768);
  EXPECT_EQ(c.eos_token_id, 770);
  EXPECT_EQ(c.pad_token_id, 1023);
  EXPECT_EQ(c.media_placeholder_token_id, 789);
  EXPECT_EQ(c.quantization.method, QuantMethod::kMxfp4);
  EXPECT_EQ(c.quantization.provider, QuantProvider::kCompressedTensors);
  EXPECT_EQ(c.quantization.group_size, 32);
  EXPECT_EQ(c.quantization.targets, std::vector<std::string>{"Linear"});
  EXPECT_EQ(c.quantization.ignore.size(), 6u);
  EXPECT_EQ(c.quantization.expert_format(), quant::WeightFormat::kMxfp4);
  EXPECT_EQ(c.quantization, QuantizationConfig::kimi_k3_mxfp4());
}

// to_json writes exactly the released layout: the golden config files come back field for field.
// tie_word_embeddings stated at the top level only: taken (the text level's absence had been compared as false
// and refused); stated at both levels, they must agree (Rules/ConfigRejects TieLevelsDisagree).
TEST(Config, TopLevelTieWordEmbeddingsAloneIsTaken) {
  json j = read_json("k3-tiny/config.json");
  j["text_config"].erase("tie_word_embeddings");
  j["tie_word_embeddings"] = true;
  EXPECT_TRUE(ModelConfig::from_json(j).tie_word_embeddings);
  j["tie_word_embeddings"] = false;
  EXPECT_FALSE(ModelConfig::from_json(j).tie_word_embeddings);
}

TEST(Config, ToJsonReproducesTheGoldenFiles) {
  for (const char* model : {"kl-tiny", "k3-tiny"}) {
    const json golden = read_json(std::string(model) + "/config.json");
    const json written = ModelConfig::from_json(golden).to_json();
    EXPECT_EQ(written, golden) << model << "\nwritten: " << written.dump(1) << "\ngolden: " << golden.dump(1);
  }
}

void expect_round_trip(const ModelConfig& c) {
  const ModelConfig back = ModelConfig::from_json(c.to_json());
  EXPECT_TRUE(back == c) << c.to_json().dump(1);
}

TEST(Config, RoundTripsEveryQuantizationAndFamily) {
  expect_round_trip(ModelConfig::from_json(read_json("kl-tiny/config.json")));
  expect_round_trip(ModelConfig::from_json(read_json("k3-tiny/config.json")));
  expect_round_trip(ModelConfig::kimi_k3());
  expect_round_trip(ModelConfig::kimi_linear_48b());
  auto c = ModelConfig::from_json(read_json("k3-tiny/config.json"));
  for (auto q :
       {QuantizationConfig{}, QuantizationConfig::fp8_block(QuantProvider::kDeepSeekFp8),
        QuantizationConfig::fp8_block(QuantProvider::kCompressedTensors),
        QuantizationConfig::fp8_block(QuantProvider::kModelOpt), QuantizationConfig::nvfp4(QuantProvider::kModelOpt),
        QuantizationConfig::nvfp4(QuantProvider::kCompressedTensors)}) {
    c.quantization = q;
    expect_round_trip(c);
  }
  c.quantization = QuantizationConfig::nvfp4(QuantProvider::kModelOpt);
  c.quantization.modelopt_mixed = true;
  c.quantization.ignore = {"lm_head"};
  expect_round_trip(c);
  // Kimi K3 features on a Kimi Linear layout are written flat, and come back.
  auto kl = ModelConfig::from_json(read_json("kl-tiny/config.json"));
  kl.attn_res_block_size = 2;
  kl.kda_gate_lower_bound = -5.0;
  kl.kda_use_full_rank_gate = true;
  kl.mla_use_output_gate = true;
  kl.q_lora_rank = 16;
  kl.tie_word_embeddings = true;
  kl.hidden_act = HiddenAct::kSitu;
  kl.situ_beta = 4.0;
  expect_round_trip(kl);
}

TEST(Config, ReleasedPresetsMatchTheSpec) {
  const auto k3 = ModelConfig::kimi_k3();
  k3.validate();
  int mla = 0;
  for (auto m : k3.layer_mixers) mla += m == M;
  EXPECT_EQ(mla, 24);
  EXPECT_EQ(k3.layer_mixers[3], M);
  EXPECT_EQ(k3.layer_mixers[91], M);
  EXPECT_EQ(k3.layer_mixers[92], M);
  EXPECT_EQ(k3.layer_mixers[90], K);
  EXPECT_EQ(k3.shared_intermediate_size(), 6144);
  EXPECT_EQ(k3.qk_head_dim(), 192);
  const auto kl = ModelConfig::kimi_linear_48b();
  kl.validate();
  mla = 0;
  for (auto m : kl.layer_mixers) mla += m == M;
  EXPECT_EQ(mla, 7);
  EXPECT_EQ(kl.layer_mixers[26], M);
}

TEST(Config, ParsesEachQuantizationDeclaration) {
  auto with = [](json q) {
    json j = read_json("k3-tiny/config.json");
    j["text_config"]["quantization_config"] = std::move(q);
    return ModelConfig::from_json(j).quantization;
  };
  auto ds = with(
      {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"}, {"weight_block_size", {128, 128}}});
  EXPECT_EQ(ds.method, QuantMethod::kFp8Block);
  EXPECT_EQ(ds.expert_format(), quant::WeightFormat::kFp8BlockScaleInv);
  EXPECT_EQ(ds.block_rows, 128);
  auto ct_fp8 = with({{"quant_method", "compressed-tensors"},
                      {"format", "float-quantized"},
                      {"config_groups",
                       {{"group_0",
                         {{"targets", {"Linear"}},
                          {"weights",
                           {{"num_bits", 8},
                            {"type", "float"},
                            {"strategy", "block"},
                            {"block_structure", {128, 128}},
                            {"symmetric", true},
                            {"dynamic", false}}},
                          {"input_activations", {{"num_bits", 8}, {"dynamic", true}}}}}}},
                      {"ignore", {"lm_head"}}});
  EXPECT_EQ(ct_fp8.expert_format(), quant::WeightFormat::kFp8BlockScale);
  EXPECT_EQ(ct_fp8.ignore, std::vector<std::string>{"lm_head"});
  auto ct_nv = with(
      {{"quant_method", "compressed-tensors"},
       {"config_groups",
        {{"group_0",
          {{"format", "nvfp4-pack-quantized"},
           {"weights", {{"num_bits", 4}, {"type", "float"}, {"strategy", "tensor_group"}, {"group_size", 16}}}}}}}});
  EXPECT_EQ(ct_nv.expert_format(), quant::WeightFormat::kNvfp4CompressedTensors);
  auto mo = with(
      {{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}, {"group_size", 16}, {"exclude_modules", {"lm_head"}}});
  EXPECT_EQ(mo.expert_format(), quant::WeightFormat::kNvfp4ModelOpt);
  auto mixed =
      with({{"quant_method", "modelopt"},
            {"quant_algo", "MIXED_PRECISION"},
            {"quantized_layers",
             {{"model.layers.1.self_attn.q_proj", {{"quant_algo", "FP8_PB_WO"}}},
              {"model.layers.1.block_sparse_moe.experts.0.w1", {{"quant_algo", "NVFP4"}, {"group_size", 16}}}}}});
  EXPECT_EQ(mixed.method, QuantMethod::kNvfp4);
  EXPECT_TRUE(mixed.modelopt_mixed);
  // Kimi K3 copies may carry the block at the top level instead.
  json j = read_json("k3-tiny/config.json");
  j["quantization_config"] = j["text_config"]["quantization_config"];
  j["text_config"].erase("quantization_config");
  EXPECT_EQ(ModelConfig::from_json(j).quantization, QuantizationConfig::kimi_k3_mxfp4());
}

// One broken rule per case: mutate a golden config and check that the error names the field.
struct BadConfig {
  const char* name;
  const char* model;
  void (*mutate)(json&);
  const char* message;
};

void PrintTo(const BadConfig& b, std::ostream* os) { *os << b.name; }

class ConfigRejects : public ::testing::TestWithParam<BadConfig> {};

TEST_P(ConfigRejects, NamingTheField) {
  const auto& p = GetParam();
  json j = read_json(std::string(p.model) + "/config.json");
  p.mutate(j);
  EXPECT_THAT(error_of([&] { ModelConfig::from_json(j); }), HasSubstr(p.message));
}

#define TC(j) j["text_config"]
#define QC(j) j["text_config"]["quantization_config"]
#define W0(j) j["text_config"]["quantization_config"]["config_groups"]["group_0"]["weights"]
const BadConfig kBadConfigs[] = {
    {"ModelType", "k3-tiny", [](json& j) { j["model_type"] = "llama"; }, "config.json: model_type is \"llama\""},
    {"TextModelType", "k3-tiny",
     [](json& j) {
       TC(j)["model_type"] = "deepseek_v3";
     },
     "text_config.model_type is \"deepseek_v3\""},
    {"TextConfigNotObject", "k3-tiny", [](json& j) { j["text_config"] = 5; },
     "config.json: text_config must be a JSON object, got 5"},
    {"MissingHidden", "k3-tiny", [](json& j) { TC(j).erase("hidden_size"); }, "text_config.hidden_size is missing"},
    {"HiddenNotInt", "k3-tiny",
     [](json& j) {
       TC(j)["hidden_size"] = "256";
     },
     "text_config.hidden_size must be an integer, got \"256\""},
    {"HiddenFraction", "k3-tiny",
     [](json& j) {
       TC(j)["hidden_size"] = 25.5;
     },
     "text_config.hidden_size must be an integer, got 25.5"},
    {"HiddenZero", "kl-tiny", [](json& j) { j["hidden_size"] = 0; }, "config.json: hidden_size must be positive"},
    // Beside vision_config.text_hidden_size: said as zero, not as a mismatch with the vision config.
    {"HiddenZeroK3", "k3-tiny",
     [](json& j) {
       TC(j)["hidden_size"] = 0;
     },
     "text_config.hidden_size must be positive"},
    {"HiddenNegativeK3", "k3-tiny",
     [](json& j) {
       TC(j)["hidden_size"] = -256;
     },
     "text_config.hidden_size must be positive"},
    {"VocabNegative", "k3-tiny",
     [](json& j) {
       TC(j)["vocab_size"] = -1;
     },
     "text_config.vocab_size must be positive"},
    {"LayersZero", "k3-tiny",
     [](json& j) {
       TC(j)["num_hidden_layers"] = 0;
     },
     "text_config.num_hidden_layers must be positive, got 0"},
    {"KvHeads", "k3-tiny",
     [](json& j) {
       TC(j)["num_key_value_heads"] = 2;
     },
     "text_config.num_key_value_heads (2) != num_attention_heads (4)"},
    {"MlaHeads", "k3-tiny",
     [](json& j) {
       TC(j)["num_attention_heads"] = 0;
       TC(j).erase("num_key_value_heads");
     },
     "text_config.num_attention_heads must be positive"},
    {"MlaHeadsZeroBesideKvHeads", "k3-tiny",
     [](json& j) {
       TC(j)["num_attention_heads"] = 0;
     },
     "text_config.num_attention_heads must be positive"},
    {"QLoraZero", "k3-tiny",
     [](json& j) {
       TC(j)["q_lora_rank"] = 0;
     },
     "text_config.q_lora_rank must be positive"},
    {"KvLoraZero", "k3-tiny",
     [](json& j) {
       TC(j)["kv_lora_rank"] = 0;
     },
     "text_config.kv_lora_rank must be positive"},
    {"RopeNegative", "k3-tiny",
     [](json& j) {
       TC(j)["qk_rope_head_dim"] = -2;
     },
     "text_config.qk_rope_head_dim must be at least 0"},
    {"VHeadDim", "k3-tiny",
     [](json& j) {
       TC(j)["v_head_dim"] = 0;
     },
     "text_config.v_head_dim must be positive"},
    {"NopeFalse", "k3-tiny",
     [](json& j) {
       TC(j)["mla_use_nope"] = false;
     },
     "text_config.mla_use_nope is missing or false"},
    {"NopeMissing", "kl-tiny", [](json& j) { j.erase("mla_use_nope"); }, "config.json: mla_use_nope is missing"},
    {"NopeNotBool", "k3-tiny",
     [](json& j) {
       TC(j)["mla_use_nope"] = 1;
     },
     "text_config.mla_use_nope must be true or false, got 1"},
    {"Router", "k3-tiny",
     [](json& j) {
       TC(j)["moe_router_activation_func"] = "softmax";
     },
     "text_config.moe_router_activation_func is \"softmax\": only the sigmoid router"},
    {"TopkMethod", "k3-tiny",
     [](json& j) {
       TC(j)["topk_method"] = "greedy";
     },
     "text_config.topk_method is \"greedy\""},
    {"Mtp", "k3-tiny",
     [](json& j) {
       TC(j)["num_nextn_predict_layers"] = 1;
     },
     "text_config.num_nextn_predict_layers is 1: MTP layers are not implemented"},
    {"HiddenAct", "k3-tiny",
     [](json& j) {
       TC(j)["hidden_act"] = "gelu";
     },
     "text_config.hidden_act is \"gelu\""},
    {"TopKAboveExperts", "k3-tiny",
     [](json& j) {
       TC(j)["num_experts_per_token"] = 20;
     },
     "config.json: text_config.num_experts_per_token (20) > num_experts (16)"},
    {"TopKAboveExpertsFlat", "kl-tiny", [](json& j) { j["num_experts_per_token"] = 9; },
     "config.json: num_experts_per_token (9) > num_experts (8)"},
    {"TopKZero", "k3-tiny",
     [](json& j) {
       TC(j)["num_experts_per_token"] = 0;
     },
     "text_config.num_experts_per_token must be positive"},
    {"ExpertsNegative", "k3-tiny",
     [](json& j) {
       TC(j)["num_experts"] = -4;
     },
     "text_config.num_experts must be at least 0"},
    {"MoeIntermediate", "k3-tiny",
     [](json& j) {
       TC(j)["moe_intermediate_size"] = 0;
     },
     "text_config.moe_intermediate_size must be positive"},
    {"SharedNegative", "k3-tiny",
     [](json& j) {
       TC(j)["num_shared_experts"] = -1;
     },
     "text_config.num_shared_experts must be at least 0"},
    {"GroupsDivide", "k3-tiny",
     [](json& j) {
       TC(j)["num_expert_group"] = 3;
     },
     "text_config.num_experts (16) is not divisible by num_expert_group (3)"},
    {"TopkGroupRange", "k3-tiny",
     [](json& j) {
       TC(j)["num_expert_group"] = 2;
       TC(j)["topk_group"] = 3;
     },
     "text_config.topk_group (3) must lie in [1, num_expert_group (2)]"},
    {"TopkGroupSupply", "k3-tiny",
     [](json& j) {
       TC(j)["num_expert_group"] = 8;
       TC(j)["topk_group"] = 1;
     },
     "text_config.topk_group (1) groups of 2 experts cannot supply num_experts_per_token (4)"},
    {"UngroupedGroups", "k3-tiny",
     [](json& j) {
       TC(j)["num_expert_group"] = 2;
       TC(j)["topk_group"] = 2;
       TC(j)["use_grouped_topk"] = false;
     },
     "text_config.use_grouped_topk is false with num_expert_group 2"},
    {"ScalingFactor", "k3-tiny",
     [](json& j) {
       TC(j)["routed_scaling_factor"] = 0.0;
     },
     "text_config.routed_scaling_factor must be a positive number"},
    {"LatentZero", "k3-tiny",
     [](json& j) {
       TC(j)["routed_expert_hidden_size"] = 0;
     },
     "text_config.routed_expert_hidden_size must be positive"},
    {"LatentWithoutNorm", "k3-tiny",
     [](json& j) {
       TC(j)["latent_moe_use_norm"] = false;
     },
     "text_config.latent_moe_use_norm is false with a latent MoE"},
    {"NormWithoutLatent", "k3-tiny", [](json& j) { TC(j).erase("routed_expert_hidden_size"); },
     "text_config.latent_moe_use_norm is true but routed_expert_hidden_size is missing"},
    // A K3 config without a field that would otherwise read as its feature switched off: the checkpoint would load
    // (the feature's tensors set aside, or the same A_log read with another gate) and compute another model.
    {"K3WithoutOutputGate", "k3-tiny", [](json& j) { TC(j).erase("mla_use_output_gate"); },
     "text_config.mla_use_output_gate is missing: a Kimi K3 config states it"},
    {"K3WithoutAttnRes", "k3-tiny", [](json& j) { TC(j).erase("attn_res_block_size"); },
     "text_config.attn_res_block_size is missing: a Kimi K3 config states it"},
    {"K3WithoutLatentNorm", "k3-tiny", [](json& j) { TC(j).erase("latent_moe_use_norm"); },
     "text_config.latent_moe_use_norm is missing: a Kimi K3 config states it"},
    {"K3WithoutSituLinearBeta", "k3-tiny", [](json& j) { TC(j).erase("activation_situ_linear_beta"); },
     "text_config.activation_situ_linear_beta is missing: a Kimi K3 config with SiTU states it"},
    {"K3WithoutGateLowerBound", "k3-tiny",
     [](json& j) {
       TC(j)["linear_attn_config"].erase("gate_lower_bound");
     },
     "text_config.linear_attn_config.gate_lower_bound is missing: a Kimi K3 config states it"},
    {"K3WithoutFullRankGate", "k3-tiny",
     [](json& j) {
       TC(j)["linear_attn_config"].erase("use_full_rank_gate");
     },
     "text_config.linear_attn_config.use_full_rank_gate is missing: a Kimi K3 config states it"},
    {"FirstKDense", "k3-tiny",
     [](json& j) {
       TC(j)["first_k_dense_replace"] = 7;
     },
     "text_config.first_k_dense_replace (7) must lie in [0, num_hidden_layers (6)]"},
    {"MoeLayerFreq", "k3-tiny",
     [](json& j) {
       TC(j)["moe_layer_freq"] = 0;
     },
     "text_config.moe_layer_freq must be positive"},
    {"DenseWidth", "k3-tiny", [](json& j) { TC(j).erase("intermediate_size"); },
     "text_config.intermediate_size must be positive"},
    {"AttnResTooBig", "k3-tiny",
     [](json& j) {
       TC(j)["attn_res_block_size"] = 7;
     },
     "text_config.attn_res_block_size (7) must lie in [0, num_hidden_layers (6)]"},
    {"AttnResNegative", "k3-tiny",
     [](json& j) {
       TC(j)["attn_res_block_size"] = -1;
     },
     "text_config.attn_res_block_size (-1) must lie in"},
    {"EpsZero", "k3-tiny",
     [](json& j) {
       TC(j)["rms_norm_eps"] = 0.0;
     },
     "text_config.rms_norm_eps must be a positive number"},
    {"EpsMissing", "kl-tiny", [](json& j) { j.erase("rms_norm_eps"); }, "config.json: rms_norm_eps is missing"},
    {"SituBeta", "k3-tiny", [](json& j) { TC(j).erase("activation_situ_beta"); },
     "text_config.activation_situ_beta must be a positive number that a float can hold when hidden_act is \"situ\""},
    {"SituLinearBeta", "k3-tiny",
     [](json& j) {
       TC(j)["activation_situ_linear_beta"] = -25.0;
     },
     "text_config.activation_situ_linear_beta must be a positive number"},
    {"GateLowerBound", "k3-tiny",
     [](json& j) {
       TC(j)["linear_attn_config"]["gate_lower_bound"] = 1.0;
     },
     "text_config.linear_attn_config.gate_lower_bound must be a negative number that a float can hold, got 1"},
    {"KdaHeads", "k3-tiny",
     [](json& j) {
       TC(j)["linear_attn_config"]["num_heads"] = 0;
     },
     "text_config.linear_attn_config.num_heads must be positive"},
    {"KdaHeadDim", "k3-tiny",
     [](json& j) {
       TC(j)["linear_attn_config"]["head_dim"] = -32;
     },
     "text_config.linear_attn_config.head_dim must be positive"},
    {"ConvKernel", "k3-tiny",
     [](json& j) {
       TC(j)["linear_attn_config"]["short_conv_kernel_size"] = 0;
     },
     "text_config.linear_attn_config.short_conv_kernel_size must be positive"},
    {"LinearAttnMissing", "k3-tiny", [](json& j) { TC(j).erase("linear_attn_config"); },
     "text_config.linear_attn_config is missing"},
    {"KdaLayersMissing", "k3-tiny",
     [](json& j) {
       TC(j)["linear_attn_config"].erase("kda_layers");
     },
     "text_config.linear_attn_config.kda_layers is missing"},
    {"LayerMapOverlap", "k3-tiny",
     [](json& j) {
       TC(j)["linear_attn_config"]["full_attn_layers"] = {3, 4, 6};
     },
     "text_config.linear_attn_config: layer 3 (1-based) is in both kda_layers and full_attn_layers"},
    {"LayerMapGap", "k3-tiny",
     [](json& j) {
       TC(j)["linear_attn_config"]["full_attn_layers"] = {4};
     },
     "text_config.linear_attn_config: layer 6 (1-based) is in neither kda_layers nor full_attn_layers"},
    {"LayerMapRange", "k3-tiny",
     [](json& j) {
       TC(j)["linear_attn_config"]["full_attn_layers"] = {4, 6, 7};
     },
     "text_config.linear_attn_config.full_attn_layers lists layer 7, outside 1..num_hidden_layers (6)"},
    {"LayerMapZeroBased", "kl-tiny",
     [](json& j) {
       j["linear_attn_config"]["kda_layers"] = {0, 1, 2, 4};
     },
     "config.json: linear_attn_config.kda_layers lists layer 0, outside 1..num_hidden_layers (5); the lists are "
     "1-based"},
    {"LayerMapDuplicate", "k3-tiny",
     [](json& j) {
       TC(j)["linear_attn_config"]["kda_layers"] = {1, 2, 2, 3, 5};
     },
     "text_config.linear_attn_config.kda_layers lists layer 2 twice"},
    {"BosOutsideVocab", "k3-tiny",
     [](json& j) {
       TC(j)["bos_token_id"] = 2000;
       j["bos_token_id"] = 2000;
     },
     "text_config.bos_token_id (2000) is outside the vocabulary [0, 1024)"},
    {"EosLevelsDisagree", "k3-tiny", [](json& j) { j["eos_token_id"] = 5; },
     "config.json: eos_token_id (5) != text_config.eos_token_id (770)"},
    {"TieLevelsDisagree", "k3-tiny", [](json& j) { j["tie_word_embeddings"] = true; },
     "config.json: tie_word_embeddings (true) != text_config.tie_word_embeddings (false)"},
    {"VisionTextHidden", "k3-tiny", [](json& j) { j["vision_config"]["text_hidden_size"] = 7168; },
     "vision_config.text_hidden_size (7168) != text_config.hidden_size (256)"},
    {"QuantMethod", "k3-tiny",
     [](json& j) {
       QC(j)["quant_method"] = "gptq";
     },
     "text_config.quantization_config.quant_method is \"gptq\""},
    {"QuantInt4", "k3-tiny",
     [](json& j) {
       W0(j)["type"] = "int";
     },
     "text_config.quantization_config.config_groups.group_0.weights: num_bits 4, type \"int\", strategy \"group\" is "
     "not a weight format kimirt implements"},
    {"QuantGroupSize", "k3-tiny",
     [](json& j) {
       W0(j)["group_size"] = 64;
     },
     "text_config.quantization_config.config_groups.group_0.weights.group_size is 64: MXFP4 groups are 32"},
    {"QuantScaleDtype", "k3-tiny",
     [](json& j) {
       W0(j)["scale_dtype"] = "torch.float16";
     },
     "config_groups.group_0.weights.scale_dtype is \"torch.float16\""},
    {"QuantAsymmetric", "k3-tiny",
     [](json& j) {
       W0(j)["symmetric"] = false;
     },
     "config_groups.group_0.weights.symmetric is false"},
    {"QuantDynamic", "k3-tiny",
     [](json& j) {
       W0(j)["dynamic"] = true;
     },
     "config_groups.group_0.weights.dynamic is true"},
    {"QuantStatus", "k3-tiny",
     [](json& j) {
       QC(j)["quantization_status"] = "frozen";
     },
     "text_config.quantization_config.quantization_status is \"frozen\""},
    {"QuantFormatMismatch", "k3-tiny",
     [](json& j) {
       QC(j)["config_groups"]["group_0"]["format"] = "float-quantized";
     },
     "text_config.quantization_config.config_groups.group_0.format \"float-quantized\" does not match its weights"},
    {"QuantNoGroups", "k3-tiny",
     [](json& j) {
       QC(j)["config_groups"] = json::object();
     },
     "text_config.quantization_config.config_groups is empty"},
    {"QuantTwoMethods", "k3-tiny",
     [](json& j) {
       QC(j)["format"] = nullptr;
       QC(j)["config_groups"]["group_0"].erase("format");
       QC(j)
       ["config_groups"]["group_1"] = {
           {"weights", {{"num_bits", 8}, {"type", "float"}, {"strategy", "block"}, {"block_structure", {128, 128}}}}};
     },
     "declares FP8 block but another group declares MXFP4"},
    {"Fp8BlockSize", "k3-tiny",
     [](json& j) {
       QC(j) = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {64, 64}}};
     },
     "text_config.quantization_config.weight_block_size is [64, 64]: only [128, 128] is implemented"},
    {"Fp8Fmt", "k3-tiny",
     [](json& j) {
       QC(j) = {{"quant_method", "fp8"}, {"fmt", "e5m2"}, {"weight_block_size", {128, 128}}};
     },
     "text_config.quantization_config.fmt is \"e5m2\""},
    {"ModelOptAlgo", "k3-tiny",
     [](json& j) {
       QC(j) = {{"quant_method", "modelopt"}, {"quant_algo", "W4A8_AWQ"}};
     },
     "text_config.quantization_config.quant_algo is \"W4A8_AWQ\""},
    {"ModelOptGroup", "k3-tiny",
     [](json& j) {
       QC(j) = {{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}, {"group_size", 32}};
     },
     "text_config.quantization_config.group_size is 32: NVFP4 groups are 16"},
    {"ModelOptMixedLayer", "k3-tiny",
     [](json& j) {
       QC(j) = {{"quant_method", "modelopt"},
                {"quant_algo", "MIXED_PRECISION"},
                {"quantized_layers", {{"model.layers.1.mlp", {{"quant_algo", "INT8"}}}}}};
     },
     "text_config.quantization_config.quantized_layers.model.layers.1.mlp.quant_algo is \"INT8\""},
    {"QuantLevelsDisagree", "k3-tiny",
     [](json& j) {
       j["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}};
     },
     "config.json: quantization_config differs from text_config.quantization_config"},
    {"PackedOddWidth", "k3-tiny",
     [](json& j) {
       TC(j)["moe_intermediate_size"] = 63;
     },
     "packed FP4 experts need even widths, got expert input 128 and moe_intermediate_size 63"},
    // Sanity bounds: before them, these values ran into std::bad_alloc (a layer table of 10^12 entries).
    {"HugeLayerCount", "k3-tiny",
     [](json& j) {
       TC(j)["num_hidden_layers"] = int64_t{1000000000000};
     },
     "text_config.num_hidden_layers is 1000000000000, over the sanity bound 65536"},
    {"HugeVocab", "kl-tiny", [](json& j) { j["vocab_size"] = int64_t{1} << 40; },
     "config.json: vocab_size is 1099511627776, over the sanity bound 2147483648"},
    {"HugeExpertCount", "k3-tiny",
     [](json& j) {
       TC(j)["num_experts"] = int64_t{1} << 30;
     },
     "text_config.num_experts is 1073741824, over the sanity bound 16777215"},
    {"TooManyExpertsInAll", "k3-tiny",
     [](json& j) {
       TC(j)["num_experts"] = int64_t{1} << 20;
     },
     "text_config.num_experts x text_config.num_hidden_layers (1048576 x 6) routed experts in all is over the "
     "sanity bound 131072"},
    {"HugeHidden", "kl-tiny", [](json& j) { j["hidden_size"] = int64_t{1} << 40; },
     "config.json: hidden_size is 1099511627776, over the sanity bound 16777216"},
    {"HugeKdaWidth", "kl-tiny",
     [](json& j) {
       j["linear_attn_config"]["num_heads"] = 1 << 20;
       j["linear_attn_config"]["head_dim"] = 1 << 20;
     },
     "linear_attn_config.num_heads x linear_attn_config.head_dim (1048576 x 1048576) is over the sanity bound"},
    {"HugeContext", "k3-tiny",
     [](json& j) {
       TC(j)["max_position_embeddings"] = int64_t{1} << 40;
     },
     "text_config.max_position_embeddings is 1099511627776, over the sanity bound 2147483648"},
    {"NegativeContext", "kl-tiny", [](json& j) { j["model_max_length"] = -1; },
     "model_max_length must be positive, got -1"},
    {"UnsignedPastInt64", "k3-tiny",
     [](json& j) {
       TC(j)["num_hidden_layers"] = uint64_t{18446744073709551615u};
     },
     "text_config.num_hidden_layers is too large, got 18446744073709551615"},
    // Float fields that a double holds but a float does not (1e39 would be inf, 1e-46 zero).
    {"EpsOverFloat", "kl-tiny", [](json& j) { j["rms_norm_eps"] = 1e39; },
     "config.json: rms_norm_eps must be a positive number that a float can hold, got 1e+39"},
    {"EpsUnderFloat", "kl-tiny", [](json& j) { j["rms_norm_eps"] = 1e-46; },
     "config.json: rms_norm_eps must be a positive number that a float can hold"},
    {"ScalingOverFloat", "k3-tiny",
     [](json& j) {
       TC(j)["routed_scaling_factor"] = 1e39;
     },
     "text_config.routed_scaling_factor must be a positive number that a float can hold"},
    {"SituBetaOverFloat", "k3-tiny",
     [](json& j) {
       TC(j)["activation_situ_beta"] = 1e39;
     },
     "text_config.activation_situ_beta must be a positive number that a float can hold"},
    {"GateBoundOverFloat", "k3-tiny",
     [](json& j) {
       TC(j)["linear_attn_config"]["gate_lower_bound"] = -1e39;
     },
     "text_config.linear_attn_config.gate_lower_bound must be a negative number that a float can hold"},
    {"OneExpertPerGroup", "k3-tiny",
     [](json& j) {
       TC(j)["num_expert_group"] = 16;
       TC(j)["topk_group"] = 8;
     },
     "text_config.num_expert_group (16) leaves 1 expert per group; grouped routing (topk_group 8 of the groups) needs "
     "at least 2"},
};
#undef TC
#undef QC
#undef W0

INSTANTIATE_TEST_SUITE_P(Rules, ConfigRejects, ::testing::ValuesIn(kBadConfigs),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(Config, ValidateNamesFieldsOfAConfigBuiltFromValues) {
  auto c = ModelConfig::kimi_k3();
  c.layer_mixers.pop_back();
  EXPECT_THAT(
      error_of([&] { c.validate("generator"); }),
      HasSubstr("generator: text_config.linear_attn_config.kda_layers / full_attn_layers describe 92 layers but "
                "num_hidden_layers is 93"));
  auto kl = ModelConfig::kimi_linear_48b();
  kl.num_experts_per_token = 300;
  EXPECT_THAT(error_of([&] { kl.validate(); }),
              HasSubstr("config.json: num_experts_per_token (300) > num_experts (256)"));
}

TEST(Config, FromFileNamesTheFile) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / "kimirt_config_test";
  std::filesystem::create_directories(dir);
  const auto bad = dir / "config.json";
  std::ofstream(bad) << "{\"model_type\": ";
  EXPECT_THAT(error_of([&] { ModelConfig::from_file(bad); }), HasSubstr(bad.string() + ": not valid JSON"));
  EXPECT_THAT(error_of([&] { ModelConfig::from_file(dir / "missing.json"); }), HasSubstr("missing.json: cannot open"));
  std::ofstream(bad) << read_json("k3-tiny/config.json").dump();
  EXPECT_EQ(ModelConfig::from_file(bad).hidden_size, 256);
  // config.json is read strictly, as io::Checkpoint reads it: a key twice is refused, not resolved.
  std::ofstream(bad) << "{\"model_type\": \"kimi_k3\", \"model_type\": \"kimi_linear\"}";
  EXPECT_THAT(error_of([&] { ModelConfig::from_file(bad); }),
              HasSubstr(bad.string() + ": duplicate key \"model_type\""));
  std::ofstream(bad) << "{\"model_type\": \"kimi_k3\", \"text_config\": {\"hidden_size\": 1}}";
  EXPECT_THAT(error_of([&] { ModelConfig::from_file(bad); }),
              HasSubstr(bad.string() + ": text_config.vocab_size is missing"));
}

}  // namespace
}  // namespace kimirt::model
