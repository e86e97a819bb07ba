#include "kimirt/model/schema.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <map>

#include "kimirt/tensor/float_convert.h"
#include "test_util.h"

namespace kimirt::model {
namespace {

using quant::WeightFormat;
using testing::error_of;
using testing::golden_config;
using testing::golden_schema;
using ::testing::HasSubstr;
using testing::index_keys;

// The schema implied by each golden config names exactly the tensors of its checkpoint.
TEST(Schema, KeySetsEqualTheGoldenIndexes) {
  for (const char* model : {"kl-tiny", "k3-tiny"}) {
    const auto want = index_keys(model);
    const auto got = golden_schema(model).all_checkpoint_keys();
    std::vector<std::string> missing, extra;
    std::set_difference(want.begin(), want.end(), got.begin(), got.end(), std::back_inserter(missing));
    std::set_difference(got.begin(), got.end(), want.begin(), want.end(), std::back_inserter(extra));
    EXPECT_TRUE(missing.empty() && extra.empty())
        << model << ": schema lacks " << missing.size() << " (first: " << (missing.empty() ? "" : missing[0])
        << "), has " << extra.size() << " extra (first: " << (extra.empty() ? "" : extra[0]) << ")";
    EXPECT_EQ(got.size(), want.size());
  }
}

TEST(Schema, DetectsTheLayoutOfEachCheckpoint) {
  const auto k3 = detect_layout(golden_config("k3-tiny"), KeyIndex::from_names(index_keys("k3-tiny")));
  EXPECT_EQ(k3.prefix, "language_model.");
  EXPECT_EQ(k3.dense_mlp, DenseMlpNaming::kMlp);
  const auto kl_config = golden_config("kl-tiny");
  const auto kl = detect_layout(kl_config, KeyIndex::from_names(index_keys("kl-tiny")));
  EXPECT_EQ(kl.prefix, "");
  EXPECT_EQ(kl.dense_mlp, DenseMlpNaming::kBlockSparseMoe);
  EXPECT_EQ(default_layout(kl_config), (CheckpointLayout{"", DenseMlpNaming::kMlp}));
  // The same model saved with mlp.* names resolves to the mlp spelling.
  std::set<std::string> renamed;
  for (auto k : index_keys("kl-tiny")) {
    if (k.starts_with("model.layers.0.block_sparse_moe.")) k.replace(15, 16, "mlp");
    renamed.insert(k);
  }
  EXPECT_EQ(detect_layout(kl_config, KeyIndex::from_names(renamed)).dense_mlp, DenseMlpNaming::kMlp);
  EXPECT_EQ(Schema::for_checkpoint(kl_config, KeyIndex::from_names(renamed)).all_checkpoint_keys(), renamed);
}

TEST(Schema, RuntimeNamesDoNotDependOnTheLayout) {
  const auto s = golden_schema("kl-tiny");
  const ParamSpec* dense = s.find("model.layers.0.mlp.gate_up_proj.weight");
  ASSERT_NE(dense, nullptr);
  EXPECT_EQ(dense->shape, (Shape{256, 64}));
  EXPECT_EQ(s.checkpoint_keys(*dense), (std::vector<std::string>{"model.layers.0.block_sparse_moe.gate_proj.weight",
                                                                 "model.layers.0.block_sparse_moe.up_proj.weight"}));
  ASSERT_NE(s.find("model.layers.0.mlp.down_proj.weight"), nullptr);
  const auto k3 = golden_schema("k3-tiny");
  const ParamSpec* a_log = k3.find("model.layers.0.self_attn.A_log");
  ASSERT_NE(a_log, nullptr);
  EXPECT_EQ(k3.checkpoint_keys(*a_log), std::vector<std::string>{"language_model.model.layers.0.self_attn.A_log"});
  const ParamSpec* w2 = k3.find("model.layers.2.block_sparse_moe.experts.7.w2.weight");
  ASSERT_NE(w2, nullptr);
  EXPECT_EQ(w2->role, ParamRole::kExpertW2);
  EXPECT_EQ(w2->layer, 2);
  EXPECT_EQ(w2->expert, 7);
  EXPECT_EQ(w2->shape, (Shape{128, 64}));
  EXPECT_EQ(w2->sources[0].format, WeightFormat::kMxfp4);
  EXPECT_EQ(k3.checkpoint_keys(*w2),
            (std::vector<std::string>{"language_model.model.layers.2.block_sparse_moe.experts.7.w2.weight_packed",
                                      "language_model.model.layers.2.block_sparse_moe.experts.7.w2.weight_scale"}));
}

// Every stored tensor of both golden checkpoints passes normalize (dtype accepted, shape as the schema
// expects), including A_log's zero padding, and comes out in the canonical shape.
TEST(Schema, EveryGoldenTensorMatchesItsSpec) {
  for (const char* model : {"kl-tiny", "k3-tiny"}) {
    const auto schema = golden_schema(model);
    const auto stored = testing::read_checkpoint(model);
    size_t checked = 0;
    for (const auto& spec : schema.params()) {
      for (size_t s = 0; s < spec.sources.size(); ++s) {
        const auto comps = quant::format_components(spec.sources[s].format);
        for (int c : schema.stored_components(spec.sources[s])) {
          const std::string key = schema.key(spec, spec.sources[s], comps[static_cast<size_t>(c)]);
          const auto it = stored.find(key);
          ASSERT_NE(it, stored.end()) << key;
          const TensorView v = schema.normalize(spec, s, static_cast<size_t>(c), it->second.view(), key);
          EXPECT_EQ(v.shape(), quant::component_shape(spec.sources[s].format, comps[static_cast<size_t>(c)],
                                                      spec.sources[s].shape))
              << key;
          ++checked;
        }
      }
    }
    EXPECT_EQ(checked, stored.size()) << model;
  }
}

TEST(Schema, ResolvesQuantizedFormatsFromNamesAndDtypes) {
  const auto config = golden_config("k3-tiny");
  std::vector<KeyEntry> entries;
  for (const auto& k : index_keys("k3-tiny")) entries.push_back({k, std::nullopt});
  const std::string q = "language_model.model.layers.0.self_attn.q_proj.";
  for (auto& e : entries) {
    if (e.name == q + "weight") e.dtype = DType::kF8E4M3;
  }
  entries.push_back({q + "weight_scale_inv", DType::kF32});
  const auto s = Schema::for_checkpoint(config, KeyIndex(entries));
  const ParamSpec* spec = s.find("model.layers.0.self_attn.q_proj.weight");
  ASSERT_NE(spec, nullptr);
  EXPECT_EQ(spec->sources[0].format, WeightFormat::kFp8BlockScaleInv);
  EXPECT_EQ(s.checkpoint_keys(*spec), (std::vector<std::string>{q + "weight", q + "weight_scale_inv"}));
  // An optional component present in the checkpoint is listed; absent ones are not.
  entries.push_back({q + "input_scale", DType::kF32});
  EXPECT_EQ(Schema::for_checkpoint(config, KeyIndex(entries)).all_checkpoint_keys().count(q + "input_scale"), 1u);
}

TEST(Schema, RefusesFormatsAParameterCannotTake) {
  const auto config = golden_config("k3-tiny");
  auto with = [&](std::vector<KeyEntry> extra, std::string drop) {
    std::vector<KeyEntry> entries;
    for (const auto& k : index_keys("k3-tiny")) {
      if (k != drop) entries.push_back({k, std::nullopt});
    }
    for (auto& e : extra) entries.push_back(e);
    return error_of([&] { Schema::for_checkpoint(config, KeyIndex(entries)); });
  };
  const std::string p = "language_model.model.layers.0.";
  // FP8 without a scale: known from the dtype once headers are read.
  EXPECT_THAT(with({{p + "self_attn.q_proj.weight", DType::kF8E4M3}}, p + "self_attn.q_proj.weight"),
              HasSubstr(p + "self_attn.q_proj.weight is F8_E4M3 but has no block scale"));
  // A quantized norm.
  EXPECT_THAT(with({{p + "input_layernorm.weight_scale", DType::kF32}}, ""),
              HasSubstr(p + "input_layernorm: stored as fp8-block, but model.layers.0.input_layernorm.weight "
                            "(input_norm) may only be stored as float"));
  // Fused halves in different formats.
  EXPECT_THAT(with({{p + "mlp.up_proj.weight_scale_inv", std::nullopt}}, ""),
              HasSubstr(p + "mlp.up_proj: stored as fp8-block(scale_inv) but " + p +
                        "mlp.gate_proj is float; the fused halves must match"));
}

TEST(Schema, ALogPaddingMustBeZero) {
  Tensor padded = Tensor::from_f32(std::vector<float>{1, 2, 3, 4, 0, 0, 0, 0}, {8});
  check_a_log_padding(padded.view(), 4, "A_log");
  Tensor bad = Tensor::from_f32(std::vector<float>{1, 2, 3, 4, 0, 0, 1e-30f, 0}, {8});
  EXPECT_THAT(error_of([&] { check_a_log_padding(bad.view(), 4, "layers.0.self_attn.A_log"); }),
              HasSubstr("layers.0.self_attn.A_log: padding entry 6 is 1e-30 (entries past num_heads (4) must be "
                        "exactly zero)"));
  Tensor shaped = Tensor::from_f32(std::vector<float>{1, 2, 3, 4}, {1, 1, 4, 1});
  check_a_log_padding(shaped.view(), 4, "A_log");
  EXPECT_THAT(error_of([&] { check_a_log_padding(shaped.view(), 5, "A_log"); }),
              HasSubstr("A_log: shape [1, 1, 4, 1] is not a vector of at least num_heads (5) values"));
  Tensor matrix = Tensor::from_f32(std::vector<float>{1, 2, 3, 4}, {2, 2});
  EXPECT_THROW(check_a_log_padding(matrix.view(), 2, "A_log"), Error);
  Tensor ints(DType::kI32, {4});
  EXPECT_THROW(check_a_log_padding(ints.view(), 4, "A_log"), Error);

  // Through the schema: the padding is cut off and a non-zero tail is refused.
  const auto s = golden_schema("k3-tiny");
  const ParamSpec* a_log = s.find("model.layers.0.self_attn.A_log");
  ASSERT_NE(a_log, nullptr);
  Tensor stored = Tensor::from_f32(std::vector<float>(32, 0.0f), {32});
  stored.data_as<float>()[0] = 0.5f;
  EXPECT_EQ(s.normalize(*a_log, 0, 0, stored.view(), "A_log").shape(), Shape{4});
  stored.data_as<float>()[31] = 2.0f;
  EXPECT_THROW(s.normalize(*a_log, 0, 0, stored.view(), "A_log"), Error);
}

TEST(Schema, AcceptsTwoDimensionalConvWeightsAndRefusesWrongShapes) {
  const auto s = golden_schema("k3-tiny");
  const ParamSpec* conv = s.find("model.layers.0.self_attn.q_conv1d.weight");
  ASSERT_NE(conv, nullptr);
  Tensor flat(DType::kF32, {128, 4});
  EXPECT_EQ(s.normalize(*conv, 0, 0, flat.view(), "conv").shape(), (Shape{128, 1, 4}));
  // The 2-D form goes through the same dtype checks as the 3-D one: not a float (and F8 without a scale),
  // refused in both forms, naming the key and the dtype.
  for (DType t : {DType::kF8E4M3, DType::kI32, DType::kU8}) {
    Tensor flat_bad(t, {128, 4}), full_bad(t, {128, 1, 4});
    for (const Tensor* bad : {&flat_bad, &full_bad}) {
      const std::string e = error_of([&] { s.normalize(*conv, 0, 0, bad->view(), "x.q_conv1d.weight"); });
      EXPECT_THAT(e, HasSubstr("x.q_conv1d.weight")) << dtype_name(t) << " rank " << bad->view().rank();
      EXPECT_THAT(e, HasSubstr(std::string(dtype_name(t)))) << "rank " << bad->view().rank();
    }
  }
  Tensor wrong(DType::kF32, {128, 1, 3});
  EXPECT_THAT(error_of([&] { s.normalize(*conv, 0, 0, wrong.view(), "x.q_conv1d.weight"); }),
              HasSubstr("x.q_conv1d.weight: shape [128, 1, 3] != expected [128, 1, 4]"));
  const ParamSpec* norm = s.find("model.norm.weight");
  Tensor u8(DType::kU8, {256});
  EXPECT_THAT(error_of([&] { s.normalize(*norm, 0, 0, u8.view(), "model.norm.weight"); }),
              HasSubstr("model.norm.weight: dtype U8 is not valid"));
}

TEST(Schema, TiedEmbeddingsReadTheEmbeddingTable) {
  auto config = golden_config("kl-tiny");
  config.tie_word_embeddings = true;
  const Schema s(config, default_layout(config));
  const ParamSpec* head = s.find("lm_head.weight");
  ASSERT_NE(head, nullptr);
  EXPECT_EQ(s.checkpoint_keys(*head), std::vector<std::string>{"model.embed_tokens.weight"});
  EXPECT_EQ(s.all_checkpoint_keys().count("lm_head.weight"), 0u);
}

// The released Kimi K3: tensor counts and the routed-expert shapes of spec §4.1.
TEST(Schema, ReleasedKimiK3HasTheSpecShapes) {
  const auto config = ModelConfig::kimi_k3();
  const auto t0 = std::chrono::steady_clock::now();
  const Schema s(config, default_layout(config));
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  size_t experts = 0;
  std::map<ParamRole, size_t> count;
  for (const auto& p : s.params()) {
    experts += p.expert >= 0;
    ++count[p.role];
  }
  EXPECT_EQ(experts, 92u * 896u * 3u);
  EXPECT_EQ(count[ParamRole::kKdaQ], 69u);
  EXPECT_EQ(count[ParamRole::kMlaQB], 24u);
  EXPECT_EQ(count[ParamRole::kDenseGateUp], 1u);
  EXPECT_EQ(count[ParamRole::kAttnResProj], 93u);
  const ParamSpec* w1 = s.find("model.layers.92.block_sparse_moe.experts.895.w1.weight");
  ASSERT_NE(w1, nullptr);
  const auto mx = quant::format_components(WeightFormat::kMxfp4);
  EXPECT_EQ(quant::component_shape(WeightFormat::kMxfp4, mx[0], w1->shape), (Shape{3072, 1792}));
  EXPECT_EQ(quant::component_shape(WeightFormat::kMxfp4, mx[1], w1->shape), (Shape{3072, 112}));
  const ParamSpec* w2 = s.find("model.layers.1.block_sparse_moe.experts.0.w2.weight");
  EXPECT_EQ(quant::component_shape(WeightFormat::kMxfp4, mx[0], w2->shape), (Shape{3584, 1536}));
  EXPECT_EQ(quant::component_shape(WeightFormat::kMxfp4, mx[1], w2->shape), (Shape{3584, 96}));
  EXPECT_EQ(s.find("model.layers.3.self_attn.kv_b_proj.weight")->shape, (Shape{24576, 512}));
  EXPECT_EQ(s.find("model.layers.3.self_attn.q_b_proj.weight")->shape, (Shape{18432, 1536}));
  EXPECT_EQ(s.find("model.layers.0.self_attn.A_log")->shape, Shape{96});
  EXPECT_EQ(s.find("model.layers.0.mlp.gate_up_proj.weight")->shape, (Shape{67584, 7168}));
  // Bytes of one expert bundle (w1 + w2 + w3, packed data and scales): 17,547,264 (spec §5.5).
  int64_t bundle = 0;
  for (const char* w : {"w1", "w2", "w3"}) {
    const ParamSpec* e = s.find(fmt::format("model.layers.5.block_sparse_moe.experts.3.{}.weight", w));
    for (const auto& c : mx) bundle += shape_numel(quant::component_shape(WeightFormat::kMxfp4, c, e->shape));
  }
  EXPECT_EQ(bundle, 17547264);
  std::cout << "[ info ] released Kimi K3 schema: " << s.params().size() << " parameters built in " << ms << " ms\n";
}

}  // namespace
}  // namespace kimirt::model
