#include "kimirt/model/parallel.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "test_util.h"

namespace kimirt::model {
namespace {

using quant::Region;
using quant::WeightFormat;
using testing::error_of;
using testing::golden_config;
using testing::golden_schema;
using ::testing::HasSubstr;
using testing::index_keys;

const ParamSlice& slice_of(const std::vector<ParamSlice>& slices, const std::string& name) {
  for (const auto& s : slices) {
    if (s.spec->name == name) return s;
  }
  throw Error("no parameter " + name);
}

// A dtype for each component as checkpoints store it, so that the byte-level copy runs on real element sizes.
DType stored_dtype(WeightFormat f, const quant::Component& c) {
  if (c.role == quant::ComponentRole::kData) {
    if (f == WeightFormat::kFloat) return DType::kBF16;
    if (f == WeightFormat::kFp8BlockScale || f == WeightFormat::kFp8BlockScaleInv) return DType::kF8E4M3;
    return DType::kU8;
  }
  if (c.role == quant::ComponentRole::kBlockScale) {
    if (f == WeightFormat::kMxfp4) return DType::kU8;
    if (f == WeightFormat::kNvfp4ModelOpt || f == WeightFormat::kNvfp4CompressedTensors) return DType::kF8E4M3;
  }
  return DType::kF32;
}

uint8_t pattern(int32_t id) { return static_cast<uint8_t>((static_cast<uint32_t>(id) * 2654435761u) >> 24); }

// One parallel layout and every rank's slices of a schema.
struct Layout {
  int tp, ep;
  bool attention_dp;
  std::vector<std::vector<ParamSlice>> ranks;
};

Layout make_layout(const Schema& schema, int tp, int ep, bool attention_dp) {
  Layout l{tp, ep, attention_dp, {}};
  for (int r = 0; r < tp; ++r) l.ranks.push_back(slice_all(schema, ParallelMapping::make(tp, r, ep, attention_dp)));
  return l;
}

// Applies every rank's slices to synthetic full tensors and checks that (1) each local element is the source
// element its copy names (ids are distinct across all sources of a parameter), (2) the same copy on the
// stored dtype moves the same bytes, and (3) the ranks together cover every source element equally often:
// the slices reassemble the full tensor exactly. The synthetic tensors are built once per parameter and
// shared by all layouts.
void check_reassembly(const Schema& schema, const std::vector<Layout>& layouts) {
  for (size_t p = 0; p < schema.params().size(); ++p) {
    const ParamSpec& spec = schema.params()[p];
    const auto& src0 = spec.sources[0];
    const auto comps = quant::format_components(src0.format);
    for (int ci : schema.stored_components(src0)) {
      const auto& comp = comps[static_cast<size_t>(ci)];
      const DType dtype = stored_dtype(src0.format, comp);
      const int64_t width = dtype_bits(dtype) / 8;
      std::vector<Tensor> ids, real;
      int32_t next = 0;
      for (const auto& src : spec.sources) {
        const Shape shape = quant::component_shape(src.format, comp, src.shape);
        ids.emplace_back(DType::kI32, shape);
        real.emplace_back(dtype, shape);
        auto* id = ids.back().data_as<int32_t>();
        auto* b = real.back().data_as<uint8_t>();
        for (int64_t i = 0; i < ids.back().numel(); ++i) {
          id[i] = next++;
          for (int64_t k = 0; k < width; ++k) b[i * width + k] = pattern(id[i] + static_cast<int32_t>(k));
        }
      }
      std::vector<TensorView> id_views, real_views;
      for (size_t s = 0; s < ids.size(); ++s) {
        id_views.push_back(ids[s].view());
        real_views.push_back(real[s].view());
      }
      for (const Layout& layout : layouts) {
        std::vector<int> seen(static_cast<size_t>(next), 0);
        for (int r = 0; r < layout.tp; ++r) {
          const ParamSlice& slice = layout.ranks[static_cast<size_t>(r)][p];
          ASSERT_EQ(slice.spec, &spec);
          if (!slice.held()) continue;
          const ComponentSlice* cs = nullptr;
          for (const auto& c : slice.components) cs = c.component == ci ? &c : cs;
          ASSERT_NE(cs, nullptr) << spec.name;
          ASSERT_EQ(cs->keys.size(), spec.sources.size());
          const Tensor got_ids = quant::apply_slice(id_views, cs->rule);
          const Tensor got_real = quant::apply_slice(real_views, cs->rule);
          // Each copy's destination holds exactly its source region.
          for (const auto& copy : cs->rule.copies) {
            Tensor want(DType::kI32, copy.src.extent);
            Tensor have(DType::kI32, copy.dst.extent);
            quant::copy_region(id_views[static_cast<size_t>(copy.source)], copy.src, want.view(),
                               Region::full(want.shape()));
            quant::copy_region(got_ids.view(), copy.dst, have.view(), Region::full(have.shape()));
            ASSERT_EQ(0, std::memcmp(want.data(), have.data(), want.nbytes())) << spec.name << " rank " << r;
          }
          const auto* rb = got_real.data_as<uint8_t>();
          const auto* gi = got_ids.data_as<int32_t>();
          int64_t bad = -1;
          for (int64_t i = 0; i < got_ids.numel() && bad < 0; ++i) {
            if (gi[i] < 0 || gi[i] >= next || rb[i * width] != pattern(gi[i])) bad = i;
            if (bad < 0) ++seen[static_cast<size_t>(gi[i])];
          }
          ASSERT_LT(bad, 0) << spec.name << " rank " << r << ": local element " << bad
                            << " is not the bytes of source element " << gi[bad];
        }
        const int times = seen.empty() ? 0 : seen[0];
        EXPECT_GT(times, 0) << spec.name << " is held by no rank";
        const auto odd = std::find_if(seen.begin(), seen.end(), [&](int n) { return n != times; });
        ASSERT_TRUE(odd == seen.end()) << spec.name << " component " << comp.suffix << ": element "
                                       << (odd - seen.begin()) << " held " << *odd << " times, element 0 " << times
                                       << " times (tp " << layout.tp << ", ep " << layout.ep << ")";
      }
    }
  }
}

// What each (tp, ep, attention-DP) should do with a golden model: "" = valid, else a piece of the error.
std::string expected_error(const std::string& model, int tp, int ep, bool adp) {
  if (tp % ep != 0) return "must divide tp_size";
  if (adp && tp / ep > 1) return "requires attention-DP off";
  // k3-tiny's w2 is [128, 64] in MXFP4: 4-way MoE-TP would cut its 32-column scale groups in half.
  if (model == "k3-tiny" && tp / ep == 4) return "cut a 1x32 block of its weight_scale";
  return "";
}

class ParallelReassembly : public ::testing::TestWithParam<const char*> {};

TEST_P(ParallelReassembly, EveryParameterForTp124AndEp124) {
  {
    const std::string model = GetParam();
    const Schema schema = golden_schema(model);
    std::vector<Layout> layouts;
    for (int tp : {1, 2, 4}) {
      for (int ep : {1, 2, 4}) {
        for (bool adp : {false, true}) {
          SCOPED_TRACE(fmt::format("{} tp {} ep {} attention-DP {}", model, tp, ep, adp));
          const std::string want = expected_error(model, tp, ep, adp);
          if (!want.empty()) {
            EXPECT_THAT(error_of([&] {
                          for (int r = 0; r < tp; ++r) slice_all(schema, ParallelMapping::make(tp, r, ep, adp));
                        }),
                        HasSubstr(want));
            continue;
          }
          layouts.push_back(make_layout(schema, tp, ep, adp));
        }
      }
    }
    EXPECT_EQ(layouts.size(), model == "kl-tiny" ? 9u : 8u);  // k3-tiny also refuses 4-way MoE-TP
    check_reassembly(schema, layouts);
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, ParallelReassembly, ::testing::Values("kl-tiny", "k3-tiny"),
                         [](const auto& info) { return std::string(info.param) == "kl-tiny" ? "KlTiny" : "K3Tiny"; });

TEST(Parallel, RowsAndColumnsOfEachRoleAtTp2) {
  const Schema s = golden_schema("k3-tiny");
  const auto r1 = slice_all(s, ParallelMapping::make(2, 1));
  auto check = [&](const std::string& name, SliceKind kind, int64_t b, int64_t e, Shape local) {
    const auto& sl = slice_of(r1, name);
    EXPECT_EQ(sl.kind, kind) << name;
    EXPECT_EQ(sl.begin, b) << name;
    EXPECT_EQ(sl.end, e) << name;
    EXPECT_EQ(sl.local_shape, local) << name;
  };
  const std::string k = "model.layers.0.self_attn.", m = "model.layers.3.self_attn.";
  check(k + "q_proj.weight", SliceKind::kRows, 64, 128, {64, 256});
  check(k + "g_proj.weight", SliceKind::kRows, 64, 128, {64, 256});
  check(k + "f_b_proj.weight", SliceKind::kRows, 64, 128, {64, 32});
  check(k + "b_proj.weight", SliceKind::kRows, 2, 4, {2, 256});
  check(k + "q_conv1d.weight", SliceKind::kRows, 64, 128, {64, 1, 4});
  check(k + "dt_bias", SliceKind::kRows, 64, 128, {64});
  check(k + "A_log", SliceKind::kRows, 2, 4, {2});
  check(k + "o_proj.weight", SliceKind::kColumns, 64, 128, {256, 64});
  check(k + "f_a_proj.weight", SliceKind::kWhole, 0, 32, {32, 256});
  check(k + "o_norm.weight", SliceKind::kWhole, 0, 32, {32});
  check(m + "q_b_proj.weight", SliceKind::kRows, 96, 192, {96, 64});     // 2 heads x (32 nope + 16 rope)
  check(m + "kv_b_proj.weight", SliceKind::kRows, 128, 256, {128, 32});  // 2 heads x [32 k_nope | 32 v]
  check(m + "g_proj.weight", SliceKind::kRows, 64, 128, {64, 256});
  check(m + "o_proj.weight", SliceKind::kColumns, 64, 128, {256, 64});
  check(m + "q_a_proj.weight", SliceKind::kWhole, 0, 64, {64, 256});
  check(m + "kv_a_proj_with_mqa.weight", SliceKind::kWhole, 0, 48, {48, 256});
  check("lm_head.weight", SliceKind::kRows, 512, 1024, {512, 256});
  check("model.embed_tokens.weight", SliceKind::kWhole, 0, 1024, {1024, 256});
  check("model.layers.0.mlp.gate_up_proj.weight", SliceKind::kFusedRows, 256, 512, {512, 256});
  check("model.layers.0.mlp.down_proj.weight", SliceKind::kColumns, 256, 512, {256, 256});
  const std::string b = "model.layers.1.block_sparse_moe.";
  check(b + "shared_experts.gate_up_proj.weight", SliceKind::kFusedRows, 64, 128, {128, 256});
  check(b + "shared_experts.down_proj.weight", SliceKind::kColumns, 64, 128, {256, 64});
  check(b + "gate.weight", SliceKind::kWhole, 0, 16, {16, 256});
  check(b + "routed_expert_down_proj.weight", SliceKind::kWhole, 0, 128, {128, 256});
  // ep 1, moe_tp 2: every expert, half of its intermediate dimension.
  check(b + "experts.5.w1.weight", SliceKind::kRows, 32, 64, {32, 128});
  check(b + "experts.5.w2.weight", SliceKind::kColumns, 32, 64, {128, 32});
  const auto& w2 = slice_of(r1, b + "experts.5.w2.weight");
  EXPECT_EQ(w2.local_expert, 5);
  ASSERT_EQ(w2.components.size(), 2u);
  EXPECT_EQ(w2.components[0].keys[0], "language_model.model.layers.1.block_sparse_moe.experts.5.w2.weight_packed");
  EXPECT_EQ(w2.components[0].rule.copies[0].src, (Region{{0, 16}, {128, 16}}));  // bytes 16..31 of each row
  EXPECT_EQ(w2.components[0].rule.dst_shape, (Shape{128, 16}));
  EXPECT_EQ(w2.components[1].rule.copies[0].src, (Region{{0, 1}, {128, 1}}));  // the second scale group
  EXPECT_EQ(w2.describe(), "columns [32, 64) of [128, 64]");
}

TEST(Parallel, ExpertParallelismHoldsContiguousRanges) {
  const Schema s = golden_schema("k3-tiny");
  const auto r2 = slice_all(s, ParallelMapping::make(4, 2, 4));
  for (int e = 0; e < 16; ++e) {
    const auto& sl = slice_of(r2, fmt::format("model.layers.1.block_sparse_moe.experts.{}.w1.weight", e));
    EXPECT_EQ(sl.held(), e >= 8 && e < 12) << e;
    if (sl.held()) {
      EXPECT_EQ(sl.local_expert, e - 8);
      EXPECT_EQ(sl.kind, SliceKind::kWhole);
    } else {
      EXPECT_TRUE(sl.components.empty());
      EXPECT_EQ(sl.describe(), fmt::format("not held (expert {} lives on another EP rank)", e));
    }
  }
  // tp 4 = moe_tp 2 x ep 2: rank 3 is ep rank 1 (experts 8..15) and moe_tp rank 1 (second intermediate half).
  const auto r3 = slice_all(s, ParallelMapping::make(4, 3, 2));
  const auto& w3 = slice_of(r3, "model.layers.4.block_sparse_moe.experts.9.w3.weight");
  EXPECT_EQ(w3.local_expert, 1);
  EXPECT_EQ(w3.begin, 32);
  EXPECT_FALSE(slice_of(r3, "model.layers.4.block_sparse_moe.experts.7.w3.weight").held());
}

TEST(Parallel, AttentionDpReplicatesAttentionAndDenseMlp) {
  const Schema s = golden_schema("k3-tiny");
  const auto r1 = slice_all(s, ParallelMapping::make(4, 1, 4, true));
  for (const char* name : {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.o_proj.weight",
                           "model.layers.3.self_attn.kv_b_proj.weight", "model.layers.0.mlp.gate_up_proj.weight",
                           "model.layers.1.block_sparse_moe.shared_experts.down_proj.weight"}) {
    EXPECT_EQ(slice_of(r1, name).kind, SliceKind::kWhole) << name;
  }
  EXPECT_EQ(slice_of(r1, "lm_head.weight").kind, SliceKind::kRows);
  EXPECT_EQ(slice_of(r1, "model.layers.1.block_sparse_moe.experts.4.w1.weight").local_expert, 0);
}

// The fused [gate | up] of rank 1 at tp 2: the second half of gate's rows, then the second half of up's.
TEST(Parallel, DenseGateUpRank1GetsTheRightRows) {
  const Schema s = golden_schema("k3-tiny");
  const ParamSpec* spec = s.find("model.layers.0.mlp.gate_up_proj.weight");
  ASSERT_NE(spec, nullptr);
  Tensor gate(DType::kF32, {512, 256}), up(DType::kF32, {512, 256});
  for (int64_t i = 0; i < 512 * 256; ++i) {
    gate.data_as<float>()[i] = static_cast<float>(i);
    up.data_as<float>()[i] = -static_cast<float>(i) - 1.0f;
  }
  const ParamSlice sl = slice_param(s, *spec, ParallelMapping::make(2, 1));
  ASSERT_EQ(sl.components.size(), 1u);
  EXPECT_EQ(sl.components[0].keys, (std::vector<std::string>{"language_model.model.layers.0.mlp.gate_proj.weight",
                                                             "language_model.model.layers.0.mlp.up_proj.weight"}));
  const TensorView sources[] = {gate.view(), up.view()};
  const Tensor local = quant::apply_slice(sources, sl.components[0].rule);
  ASSERT_EQ(local.shape(), (Shape{512, 256}));
  const float* o = local.data_as<float>();
  for (int64_t row = 0; row < 512; ++row) {
    for (int64_t col : {int64_t{0}, int64_t{255}}) {
      const int64_t src_row = 256 + row % 256;
      const float want =
          row < 256 ? static_cast<float>(src_row * 256 + col) : -static_cast<float>(src_row * 256 + col) - 1;
      ASSERT_EQ(o[row * 256 + col], want) << row << "," << col;
    }
  }
}

// tp 4 does not divide an intermediate width of 66: the dense MLP runs on 2-rank subgroups, shard = rank mod 2.
TEST(Parallel, DenseMlpUsesASubgroupWhenTpDoesNotDivideItsWidth) {
  EXPECT_EQ(mlp_tp_size(4, 66), 2);
  EXPECT_EQ(mlp_tp_size(8, 33792), 8);
  EXPECT_EQ(mlp_tp_size(6, 40), 2);
  EXPECT_EQ(mlp_tp_size(3, 64), 1);
  auto config = golden_config("kl-tiny");
  config.intermediate_size = 66;
  const Schema s(config, default_layout(config));
  for (int r = 0; r < 4; ++r) {
    const auto slices = slice_all(s, ParallelMapping::make(4, r));
    const auto& gu = slice_of(slices, "model.layers.0.mlp.gate_up_proj.weight");
    EXPECT_EQ(gu.begin, r % 2 == 0 ? 0 : 33) << r;
    EXPECT_EQ(gu.local_shape, (Shape{66, 64}));
    EXPECT_EQ(gu.logical.copies[1].dst.begin[0], 33);  // up rows start after gate's 33
    const auto& down = slice_of(slices, "model.layers.0.mlp.down_proj.weight");
    EXPECT_EQ(down.begin, r % 2 == 0 ? 0 : 33);
    EXPECT_EQ(down.local_shape, (Shape{64, 33}));
  }
  check_reassembly(s, {make_layout(s, 4, 1, false)});
}

TEST(Parallel, MappingValidationNamesTheProblem) {
  EXPECT_THAT(error_of([] { ParallelMapping::make(0, 0); }), HasSubstr("tp_size must be at least 1, got 0"));
  EXPECT_THAT(error_of([] { ParallelMapping::make(2, 2); }), HasSubstr("tp_rank 2 is outside [0, 2)"));
  EXPECT_THAT(error_of([] { ParallelMapping::make(2, -1); }), HasSubstr("tp_rank -1 is outside"));
  EXPECT_THAT(error_of([] { ParallelMapping::make(2, 0, 0); }), HasSubstr("ep_size must be at least 1"));
  EXPECT_THAT(error_of([] { ParallelMapping::make(2, 0, 4); }), HasSubstr("ep_size (4) must divide tp_size (2)"));
  EXPECT_THAT(error_of([] { ParallelMapping::make(6, 0, 4); }), HasSubstr("ep_size (4) must divide tp_size (6)"));
  EXPECT_THAT(error_of([] {
                ParallelMapping{4, 1, 2, 0, false}.validate();
              }),
              HasSubstr("ep_rank must be tp_rank mod ep_size (1)"));
  EXPECT_THAT(error_of([] { ParallelMapping::make(4, 0, 2, true); }),
              HasSubstr("MoE tensor parallelism (moe_tp 2) requires attention-DP off"));
  const auto k3 = golden_config("k3-tiny");
  EXPECT_THAT(error_of([&] { ParallelMapping::make(8, 0, 8).validate(k3); }),
              HasSubstr("parallel mapping (tp 0/8, ep 0/8, moe_tp 1, attention-DP off): tp_size (8) does not divide "
                        "the KDA heads (4)"));
  ParallelMapping::make(8, 0, 8, true).validate(k3);  // attention-DP: heads need not divide
  auto mla = k3;
  mla.kda_num_heads = 8;
  EXPECT_THAT(error_of([&] { ParallelMapping::make(8, 0, 8).validate(mla); }),
              HasSubstr("tp_size (8) does not divide the MLA heads (4)"));
  auto vocab = k3;
  vocab.vocab_size = 1022;
  vocab.pad_token_id = 1000;
  EXPECT_THAT(error_of([&] { ParallelMapping::make(4, 0, 4).validate(vocab); }),
              HasSubstr("tp_size (4) does not divide vocab_size (1022)"));
  auto experts = k3;
  experts.num_experts = 14;
  EXPECT_THAT(error_of([&] { ParallelMapping::make(4, 0, 4).validate(experts); }),
              HasSubstr("ep_size (4) does not divide num_experts (14)"));
  auto inter = k3;
  inter.moe_intermediate_size = 66;
  EXPECT_THAT(error_of([&] { ParallelMapping::make(4, 0, 1).validate(inter); }),
              HasSubstr("moe_tp (4) does not divide moe_intermediate_size (66)"));
}

// FP8 128x128 blocks on the released shapes: a split that cuts a block is refused, naming tensor and sizes.
TEST(Parallel, RefusesSplitsThatCutFp8Blocks) {
  auto config = ModelConfig::kimi_k3();
  config.quantization = QuantizationConfig::fp8_block(QuantProvider::kDeepSeekFp8);
  const Schema s(config, default_layout(config));
  // tp 32: 3 MLA heads of 192 rows per rank = 576 rows, not a multiple of 128.
  ParamSpec q_b = *s.find("model.layers.3.self_attn.q_b_proj.weight");
  q_b.sources[0].format = WeightFormat::kFp8BlockScaleInv;
  EXPECT_THAT(error_of([&] { slice_param(s, q_b, ParallelMapping::make(32, 1, 32)); }),
              HasSubstr("language_model.model.layers.3.self_attn.q_b_proj.weight_scale_inv: rows [576, 1152) of a "
                        "[18432, 1536] weight cut a 128x128 block of its weight_scale_inv; pieces must be multiples of "
                        "128 rows"));
  // tp 8 keeps 12 heads = 2304 rows: whole blocks.
  const auto ok = slice_param(s, q_b, ParallelMapping::make(8, 1, 8));
  EXPECT_EQ(ok.components[1].rule.copies[0].src, (Region{{18, 0}, {18, 12}}));
  // MoE-TP 32 cuts the 3072-wide intermediate into 96-row pieces.
  const ParamSpec* w1 = s.find("model.layers.1.block_sparse_moe.experts.0.w1.weight");
  EXPECT_EQ(w1->sources[0].format, WeightFormat::kFp8BlockScaleInv);
  EXPECT_THAT(error_of([&] { slice_param(s, *w1, ParallelMapping::make(32, 1, 1)); }),
              HasSubstr("experts.0.w1.weight_scale_inv: rows [96, 192) of a [3072, 3584] weight cut a 128x128 block"));
}

// Fused halves with per-tensor global scales cannot become one tensor.
TEST(Parallel, RefusesFusingHalvesWithTheirOwnGlobalScales) {
  const auto config = golden_config("k3-tiny");
  std::vector<KeyEntry> entries;
  for (const auto& k : index_keys("k3-tiny")) entries.push_back({k, std::nullopt});
  const std::string p = "language_model.model.layers.1.block_sparse_moe.shared_experts.";
  for (const char* half : {"gate_proj.", "up_proj."}) {
    entries.push_back({p + half + "weight_scale", DType::kF8E4M3});
    entries.push_back({p + half + "weight_scale_2", DType::kF32});
  }
  const auto s = Schema::for_checkpoint(config, KeyIndex(entries));
  const ParamSpec* gu = s.find("model.layers.1.block_sparse_moe.shared_experts.gate_up_proj.weight");
  EXPECT_EQ(gu->sources[1].format, WeightFormat::kNvfp4ModelOpt);
  EXPECT_THAT(error_of([&] { slice_param(s, *gu, ParallelMapping::make(1, 0)); }),
              HasSubstr(p + "gate_proj.weight_scale_2: cannot fuse nvfp4(modelopt) halves"));
}

// The released Kimi K3 at tp 8 = ep 8: what one rank holds.
TEST(Parallel, ReleasedKimiK3RankHoldsItsShare) {
  const auto config = ModelConfig::kimi_k3();
  const Schema s(config, default_layout(config));
  const auto slices = slice_all(s, ParallelMapping::make(8, 3, 8));
  int64_t expert_bytes = 0, held_experts = 0;
  for (const auto& sl : slices) {
    if (sl.spec->expert < 0 || !sl.held()) continue;
    ++held_experts;
    for (const auto& c : sl.components) expert_bytes += shape_numel(c.rule.dst_shape);  // U8 components
  }
  EXPECT_EQ(held_experts, 92 * 112 * 3);
  EXPECT_EQ(expert_bytes, int64_t{92} * 112 * 17547264);
  EXPECT_EQ(slice_of(slices, "model.layers.0.self_attn.q_proj.weight").local_shape, (Shape{1536, 7168}));
  EXPECT_EQ(slice_of(slices, "model.layers.3.self_attn.kv_b_proj.weight").local_shape, (Shape{3072, 512}));
  EXPECT_EQ(slice_of(slices, "model.layers.0.mlp.gate_up_proj.weight").local_shape, (Shape{8448, 7168}));
  EXPECT_EQ(slice_of(slices, "lm_head.weight").begin, 3 * 20480);
  EXPECT_EQ(slice_of(slices, "model.layers.7.block_sparse_moe.experts.336.w2.weight").local_expert, 0);
}

}  // namespace
}  // namespace kimirt::model
