// Dense ops against the CPU reference (kimirt::cpu, fp32) on the same bf16-rounded inputs. Bounds: one
// bf16 rounding of the output (2^-9 relative) → ‖out − ref‖/‖ref‖ ≤ 4e-3 unless stated.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <tuple>

#include <fmt/format.h>

#include "kimirt/base/error.h"
#include "kimirt/cpu/activation.h"
#include "kimirt/cpu/attn_res.h"
#include "kimirt/cpu/norm.h"
#include "kimirt/cpu/router.h"
#include "kimirt/cuda/attn_res.h"
#include "kimirt/cuda/embedding.h"
#include "kimirt/cuda/gemm_lt.h"
#include "kimirt/cuda/quantize_fp8.h"
#include "kimirt/cuda/random_fill.h"
#include "kimirt/cuda/rms_norm.h"
#include "kimirt/cuda/router.h"
#include "kimirt/cuda/situ.h"
#include "test_util.h"

namespace kimirt::cuda {
namespace {

using test::download;
using test::upload;

std::vector<float> dl_bf16(const DeviceBuffer& b, size_t n) { return test::from_bf16(download<uint16_t>(b.data(), n)); }

TEST(Embedding, GathersRowsAndCountsBadIds) {
  KIMIRT_REQUIRE_GPU();
  // K3's hidden; K3's vocabulary with its last id; an odd hidden size.
  for (const auto& [vocab, hidden] : {std::pair<int64_t, int64_t>{1000, 7168}, {163840, 8}, {1000, 1032}}) {
    SCOPED_TRACE(test::shape({vocab, hidden}));
    std::vector<float> table = test::random_vec(vocab * hidden, 1);
    DeviceBuffer dt = upload(test::to_bf16(table));  // rounds `table` in place
    const std::vector<int32_t> ids = {5, static_cast<int32_t>(vocab - 1), 0, static_cast<int32_t>(vocab), -1, 5};
    DeviceBuffer di = upload(ids), bad = upload(std::vector<int32_t>{0});
    DeviceBuffer out = test::poisoned(ids.size() * hidden * 2);
    embedding_gather(nullptr, dt.as<__nv_bfloat16>(), vocab, hidden, di.as<int32_t>(), ids.size(),
                     out.as<__nv_bfloat16>(), hidden, bad.as<int32_t>());
    const auto got = dl_bf16(out, ids.size() * hidden);
    for (size_t t = 0; t < ids.size(); ++t)
      for (int64_t j = 0; j < hidden; ++j) {
        const float want = ids[t] >= 0 && ids[t] < vocab ? table[ids[t] * hidden + j] : 0.0f;
        ASSERT_EQ(got[t * hidden + j], want) << "token " << t << " dim " << j;
      }
    EXPECT_EQ(download<int32_t>(bad.data(), 1)[0], 2);
  }
}

class NormShapes : public ::testing::TestWithParam<std::pair<int64_t, int64_t>> {};

TEST_P(NormShapes, RmsNormAndFusedAdd) {
  KIMIRT_REQUIRE_GPU();
  const auto [rows, dim] = GetParam();
  // Two bf16 roundings separate the kernel from the fp32 reference (the normalized value, rounded before the
  // weight as the reference models do, and the output): 6e-3 rather than the file's 4e-3 of one.
  std::vector<float> x = test::random_vec(rows * dim, 3, -2, 2), r = test::random_vec(rows * dim, 4),
                     w = test::random_vec(dim, 5, 0.5, 1.5);
  DeviceBuffer dx = upload(test::to_bf16(x)), dr = upload(test::to_bf16(r)), dw = upload(test::to_bf16(w));
  DeviceBuffer out = test::poisoned(rows * dim * 2), sum = test::poisoned(rows * dim * 2);
  std::vector<float> ref(rows * dim);
  rms_norm(nullptr, dx.as<__nv_bfloat16>(), dim, dw.as<__nv_bfloat16>(), out.as<__nv_bfloat16>(), dim, rows, dim,
           1e-5f);
  cpu::rms_norm(x.data(), w.data(), ref.data(), rows, dim, 1e-5f);
  EXPECT_LE(test::rel_err(dl_bf16(out, rows * dim), ref), 6e-3) << "rms_norm " << test::shape({rows, dim});
  // The FP8 outputs: what quantize_fp8_act makes of the bf16 output (padding rows included), and the host's.
  const auto expect_fp8_of_out = [&](const std::function<void(uint8_t*, float*)>& norm_fp8, const char* what) {
    if (dim % 128 != 0) return;
    const int64_t rp = fp8_pad_m(rows), ns = fp8_x_scale_count(rows, dim);
    DeviceBuffer q = test::poisoned(rp * dim), sc = test::poisoned(ns * 4), q2 = test::poisoned(rp * dim),
                 sc2 = test::poisoned(ns * 4);
    norm_fp8(q.as<uint8_t>(), sc.as<float>());
    quantize_fp8_act(nullptr, out.as<__nv_bfloat16>(), dim, rows, dim, q2.as<uint8_t>(), sc2.as<float>());
    const auto codes = download<uint8_t>(q.data(), rp * dim);
    const auto scales = download<float>(sc.data(), ns);
    EXPECT_EQ(codes, download<uint8_t>(q2.data(), rp * dim)) << what << " " << test::shape({rows, dim});
    EXPECT_EQ(scales, download<float>(sc2.data(), ns)) << what << " " << test::shape({rows, dim});
    EXPECT_EQ(test::act_quant_mismatch(dl_bf16(out, rows * dim), rows, dim, rp, codes, scales), "") << what;
  };
  expect_fp8_of_out(
      [&](uint8_t* q, float* sc) {
        rms_norm_fp8(nullptr, dx.as<__nv_bfloat16>(), dim, dw.as<__nv_bfloat16>(), q, sc, rows, dim, 1e-5f);
      },
      "rms_norm_fp8");

  poison(out.data(), out.size(), nullptr);  // the fused call must write every output itself
  add_rms_norm(nullptr, dx.as<__nv_bfloat16>(), dim, dr.as<__nv_bfloat16>(), dim, sum.as<__nv_bfloat16>(), dim,
               dw.as<__nv_bfloat16>(), out.as<__nv_bfloat16>(), dim, rows, dim, 1e-5f);
  std::vector<float> s(rows * dim);
  for (size_t i = 0; i < s.size(); ++i) s[i] = bf16_to_f32(f32_to_bf16(x[i] + r[i]));
  EXPECT_EQ(dl_bf16(sum, rows * dim), s) << "the residual sum is the bf16-rounded x + r";
  cpu::rms_norm(s.data(), w.data(), ref.data(), rows, dim, 1e-5f);
  EXPECT_LE(test::rel_err(dl_bf16(out, rows * dim), ref), 6e-3) << "add_rms_norm " << test::shape({rows, dim});
  DeviceBuffer sum8 = test::poisoned(rows * dim * 2);
  expect_fp8_of_out(
      [&](uint8_t* q, float* sc) {
        add_rms_norm_fp8(nullptr, dx.as<__nv_bfloat16>(), dim, dr.as<__nv_bfloat16>(), dim, sum8.as<__nv_bfloat16>(),
                         dim, dw.as<__nv_bfloat16>(), q, sc, rows, dim, 1e-5f);
      },
      "add_rms_norm_fp8");
  if (dim % 128 == 0) {
    EXPECT_EQ(dl_bf16(sum8, rows * dim), s) << "add_rms_norm_fp8's residual sum";
  }
}

INSTANTIATE_TEST_SUITE_P(K3AndOdd, NormShapes,
                         ::testing::Values(std::make_pair(4, 7168), std::make_pair(33, 1536), std::make_pair(7, 512),
                                           std::make_pair(3, 3584), std::make_pair(5, 8), std::make_pair(2, 16384),
                                           std::make_pair(1, 2312)));

// What rms_norm.h allows and the model relies on (Linear::rms_normed passes x itself as out): out equal to x,
// row strides above dim (the columns past dim keep their values), and add_rms_norm with sum_out null or equal to
// the residual (the residual stream updated in place).
TEST(RmsNorm, InPlaceWithStridesAndOptionalSum) {
  KIMIRT_REQUIRE_GPU();
  const int64_t rows = 5, dim = 7168, ld = dim + 64;
  std::vector<float> x = test::random_vec(rows * ld, 61, -2, 2), r = test::random_vec(rows * ld, 62),
                     w = test::random_vec(dim, 63, 0.5, 1.5);
  const std::vector<uint16_t> x16 = test::to_bf16(x), r16 = test::to_bf16(r);  // x, r now hold the bf16 values
  DeviceBuffer dw = upload(test::to_bf16(w));
  const auto rows_of = [&](const std::vector<float>& v) {
    std::vector<float> o(rows * dim);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < dim; ++j) o[i * dim + j] = v[i * ld + j];
    return o;
  };
  // The columns past dim hold what they held; the rows' first dim columns go to a [rows, dim] vector.
  const auto check = [&](const DeviceBuffer& b, const std::vector<uint16_t>& before, const std::vector<float>& ref,
                         double tol, const char* what) {
    const auto got16 = download<uint16_t>(b.data(), rows * ld);
    int64_t touched = 0;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = dim; j < ld; ++j) touched += got16[i * ld + j] != before[i * ld + j];
    EXPECT_EQ(touched, 0) << what << ": columns past dim written";
    EXPECT_LE(test::rel_err(rows_of(test::from_bf16(got16)), ref), tol) << what;
  };
  std::vector<float> ref(rows * dim), s(rows * dim), sum_ref(rows * dim);
  {
    DeviceBuffer dx = upload(x16);  // out = x
    rms_norm(nullptr, dx.as<__nv_bfloat16>(), ld, dw.as<__nv_bfloat16>(), dx.as<__nv_bfloat16>(), ld, rows, dim, 1e-5f);
    cpu::rms_norm(rows_of(x).data(), w.data(), ref.data(), rows, dim, 1e-5f);
    check(dx, x16, ref, 6e-3, "rms_norm in place");
  }
  const std::vector<float> xr = rows_of(x), rr = rows_of(r);
  for (size_t i = 0; i < s.size(); ++i) s[i] = bf16_to_f32(f32_to_bf16(xr[i] + rr[i]));
  cpu::rms_norm(s.data(), w.data(), ref.data(), rows, dim, 1e-5f);
  {
    DeviceBuffer dx = upload(x16), dr = upload(r16), out = upload(x16);  // sum_out null
    add_rms_norm(nullptr, dx.as<__nv_bfloat16>(), ld, dr.as<__nv_bfloat16>(), ld, nullptr, 0, dw.as<__nv_bfloat16>(),
                 out.as<__nv_bfloat16>(), ld, rows, dim, 1e-5f);
    check(out, x16, ref, 6e-3, "add_rms_norm without sum_out");
    EXPECT_EQ(download<uint16_t>(dr.data(), rows * ld), r16) << "the residual is left alone";
  }
  {
    DeviceBuffer dx = upload(x16), dr = upload(r16), out = upload(x16);  // sum_out = residual
    add_rms_norm(nullptr, dx.as<__nv_bfloat16>(), ld, dr.as<__nv_bfloat16>(), ld, dr.as<__nv_bfloat16>(), ld,
                 dw.as<__nv_bfloat16>(), out.as<__nv_bfloat16>(), ld, rows, dim, 1e-5f);
    check(out, x16, ref, 6e-3, "add_rms_norm, sum over the residual");
    check(dr, r16, s, 0.0, "the residual stream, x + r in place");
  }
}

// The FP8-output norms against the bf16 norms followed by quantize_fp8_act, bit for bit, on a K3 batch: the
// promise of rms_norm.h. NormShapes checks this on a few rows; here enough rows that an rs one ulp apart (a sum
// of squares added in another order) shows in some code: the FP8 kernel, with its own stride over the row,
// differed in a few codes per batch like this one.
TEST(RmsNormFp8, EqualsTheQuantizedBf16NormOnAFullBatch) {
  KIMIRT_REQUIRE_GPU();
  const int64_t rows = 4096, dim = 7168, rp = fp8_pad_m(rows), ns = fp8_x_scale_count(rows, dim);
  DeviceBuffer x(rows * dim * 2), r(rows * dim * 2), w(dim * 2);
  fill_uniform(x.as<__nv_bfloat16>(), rows * dim, -2.0f, 2.0f, 11, nullptr);
  fill_uniform(r.as<__nv_bfloat16>(), rows * dim, -1.0f, 1.0f, 12, nullptr);
  fill_uniform(w.as<__nv_bfloat16>(), dim, 0.5f, 1.5f, 13, nullptr);
  for (const bool add : {false, true}) {
    DeviceBuffer out = test::poisoned(rows * dim * 2), sum = test::poisoned(rows * dim * 2),
                 sum8 = test::poisoned(rows * dim * 2), q = test::poisoned(rp * dim), sc = test::poisoned(ns * 4),
                 q2 = test::poisoned(rp * dim), sc2 = test::poisoned(ns * 4);
    const auto* xb = x.as<__nv_bfloat16>();
    const auto* rb = r.as<__nv_bfloat16>();
    const auto* wb = w.as<__nv_bfloat16>();
    if (add) {
      add_rms_norm(nullptr, xb, dim, rb, dim, sum.as<__nv_bfloat16>(), dim, wb, out.as<__nv_bfloat16>(), dim, rows, dim,
                   1e-5f);
      add_rms_norm_fp8(nullptr, xb, dim, rb, dim, sum8.as<__nv_bfloat16>(), dim, wb, q.as<uint8_t>(), sc.as<float>(),
                       rows, dim, 1e-5f);
    } else {
      rms_norm(nullptr, xb, dim, wb, out.as<__nv_bfloat16>(), dim, rows, dim, 1e-5f);
      rms_norm_fp8(nullptr, xb, dim, wb, q.as<uint8_t>(), sc.as<float>(), rows, dim, 1e-5f);
    }
    quantize_fp8_act(nullptr, out.as<__nv_bfloat16>(), dim, rows, dim, q2.as<uint8_t>(), sc2.as<float>());
    const auto codes = download<uint8_t>(q.data(), rp * dim), want = download<uint8_t>(q2.data(), rp * dim);
    int64_t differ = 0, first = -1;
    for (int64_t i = 0; i < rp * dim; ++i) {
      if (codes[i] != want[i] && differ++ == 0) first = i;
    }
    EXPECT_EQ(differ, 0) << (add ? "add_rms_norm_fp8" : "rms_norm_fp8") << ": codes unlike the quantized bf16 norm's, "
                         << "the first at row " << first / dim << " column " << first % dim;
    EXPECT_EQ(download<float>(sc.data(), ns), download<float>(sc2.data(), ns))
        << (add ? "add_rms_norm_fp8" : "rms_norm_fp8");
    if (add) {
      EXPECT_EQ(download<uint16_t>(sum8.data(), rows * dim), download<uint16_t>(sum.data(), rows * dim));
    }
  }
}

TEST(RmsNormGated, BothInputTypes) {
  KIMIRT_REQUIRE_GPU();
  for (int64_t hd : {128, 256, 512}) {
    const int64_t rows = 9, heads = 96 / (hd / 128) + 1, width = heads * hd;
    std::vector<float> x = test::random_vec(rows * width, 7, -3, 3), g = test::random_vec(rows * width, 8, -4, 4),
                       w = test::random_vec(hd, 9, 0.5, 1.5);
    std::vector<float> xb = x;
    DeviceBuffer dxb = upload(test::to_bf16(xb)), dxf = upload(x), dg = upload(test::to_bf16(g)), dw = upload(w);
    std::vector<float> ref(rows * width);
    for (int in_f32 = 0; in_f32 < 2; ++in_f32) {
      DeviceBuffer out = test::poisoned(rows * width * 2);
      if (in_f32) {
        rms_norm_gated(nullptr, dxf.as<float>(), width, dg.as<__nv_bfloat16>(), width, dw.as<float>(),
                       out.as<__nv_bfloat16>(), width, rows, heads, hd, 1e-5f);
        cpu::rms_norm_gated(x.data(), g.data(), w.data(), ref.data(), rows, heads, hd, 1e-5f);
      } else {
        rms_norm_gated(nullptr, dxb.as<__nv_bfloat16>(), width, dg.as<__nv_bfloat16>(), width, dw.as<float>(),
                       out.as<__nv_bfloat16>(), width, rows, heads, hd, 1e-5f);
        cpu::rms_norm_gated(xb.data(), g.data(), w.data(), ref.data(), rows, heads, hd, 1e-5f);
      }
      EXPECT_LE(test::rel_err(dl_bf16(out, rows * width), ref), 4e-3) << "head_dim " << hd << " f32 in " << in_f32;
    }
  }
}

TEST(RmsNormGated, NanGateGivesNanAsOnTheCpu) {
  // The sigmoid's clamp of very negative gates must not swallow a NaN gate (fmaxf(NaN, -80) is -80, which
  // made the output 0 where the CPU gives NaN); -inf and -1e4 still give 0.
  KIMIRT_REQUIRE_GPU();
  const int64_t hd = 128, heads = 2, width = heads * hd;
  std::vector<float> x = test::random_vec(width, 17, -3, 3), g = test::random_vec(width, 18, -4, 4),
                     w = test::random_vec(hd, 19, 0.5, 1.5);
  g[5] = std::nanf("");
  g[7] = -1e4f;
  g[hd + 9] = -INFINITY;
  DeviceBuffer dx = upload(x), dg = upload(test::to_bf16(g)), dw = upload(w);
  DeviceBuffer out = test::poisoned(width * 2);
  rms_norm_gated(nullptr, dx.as<float>(), width, dg.as<__nv_bfloat16>(), width, dw.as<float>(), out.as<__nv_bfloat16>(),
                 width, 1, heads, hd, 1e-5f);
  std::vector<float> ref(width);
  const std::vector<float> gb = test::from_bf16(test::to_bf16(g));  // the gate the GPU reads
  cpu::rms_norm_gated(x.data(), gb.data(), w.data(), ref.data(), 1, heads, hd, 1e-5f);
  const std::vector<float> got = dl_bf16(out, width);
  ASSERT_TRUE(std::isnan(ref[5]));
  EXPECT_TRUE(std::isnan(got[5])) << got[5];
  EXPECT_LT(std::abs(got[7]), 1e-30f);
  EXPECT_LT(std::abs(got[hd + 9]), 1e-30f);
  for (int64_t i = 0; i < width; ++i) {
    if (i == 5) continue;
    EXPECT_NEAR(got[i], ref[i], 4e-3 * std::abs(ref[i]) + 1e-6) << i;
  }
}

TEST(Glu, SituSiluAndFp8Output) {
  KIMIRT_REQUIRE_GPU();
  for (int64_t width : {3072, 6144, 1024, 256, 8, 1032}) {  // the last two: bf16 output only (FP8 needs 128 | width)
    const int64_t rows = width == 256 ? 7 : 5;
    std::vector<float> gu = test::random_vec(rows * 2 * width, 11, -8, 8);
    DeviceBuffer dgu = upload(test::to_bf16(gu));
    const auto* gate = dgu.as<__nv_bfloat16>();
    const auto* up = gate + width;
    for (auto kind : {Glu::Kind::kSitu, Glu::Kind::kSilu}) {
      Glu act{kind, 4.0f, 25.0f};
      cpu::GluActivation ca =
          kind == Glu::Kind::kSitu ? cpu::GluActivation::situ(4.0f, 25.0f) : cpu::GluActivation::silu();
      std::vector<float> ref(rows * width);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < width; ++c)
          ref[r * width + c] = cpu::glu(ca, gu[r * 2 * width + c], gu[r * 2 * width + width + c]);
      DeviceBuffer out = test::poisoned(rows * width * 2);
      glu(nullptr, act, gate, up, 2 * width, out.as<__nv_bfloat16>(), width, rows, width);
      const auto got = dl_bf16(out, rows * width);
      EXPECT_LE(test::rel_err(got, ref), 4e-3) << "glu width " << width;
      if (width % 128 == 0) {
        const int64_t rp = fp8_pad_m(rows);
        DeviceBuffer q = test::poisoned(rp * width), s = test::poisoned(fp8_x_scale_count(rows, width) * 4);
        glu_fp8(nullptr, act, gate, up, 2 * width, q.as<uint8_t>(), s.as<float>(), rows, width);
        DeviceBuffer q2 = test::poisoned(rp * width), s2 = test::poisoned(fp8_x_scale_count(rows, width) * 4);
        quantize_fp8_act(nullptr, out.as<__nv_bfloat16>(), width, rows, width, q2.as<uint8_t>(), s2.as<float>());
        EXPECT_EQ(download<uint8_t>(q.data(), rp * width), download<uint8_t>(q2.data(), rp * width))
            << "fused FP8 output equals quantize(bf16 output), width " << width;
        EXPECT_EQ(download<float>(s.data(), fp8_x_scale_count(rows, width)),
                  download<float>(s2.data(), fp8_x_scale_count(rows, width)));
        // And the host's quantization of the bf16 output (shares no code with the kernels' FP8 helpers).
        EXPECT_EQ(test::act_quant_mismatch(got, rows, width, rp, download<uint8_t>(q.data(), rp * width),
                                           download<float>(s.data(), fp8_x_scale_count(rows, width))),
                  "")
            << "width " << width;
      }
    }
  }
  // β₂ absent: u passes through.
  std::vector<float> gu = test::random_vec(2 * 16, 3, -2, 2);
  DeviceBuffer dgu = upload(test::to_bf16(gu));
  DeviceBuffer out = test::poisoned(16 * 2);
  glu(nullptr, Glu{Glu::Kind::kSitu, 4.0f, 0.0f}, dgu.as<__nv_bfloat16>(), dgu.as<__nv_bfloat16>() + 16, 32,
      out.as<__nv_bfloat16>(), 16, 1, 16);
  std::vector<float> ref(16);
  for (int c = 0; c < 16; ++c) ref[c] = cpu::glu(cpu::GluActivation::situ(4.0f, std::nullopt), gu[c], gu[16 + c]);
  EXPECT_LE(test::rel_err(dl_bf16(out, 16), ref), 4e-3);
}

// The GPU's expf and the host's std::exp may differ by an ulp, so two experts whose biased scores are
// within a few ulp may legitimately trade places; everywhere else the selection must equal the CPU's
// exactly, and exact ties (equal logits and biases give bit-equal scores on both) go to the lower id.
TEST(Router, MatchesCpuSelectionAndWeights) {
  KIMIRT_REQUIRE_GPU();
  struct Case {
    int experts, top_k;
    bool renormalize;
    int64_t tokens;
  };
  for (const auto [experts, top_k, renorm, tokens] : {Case{896, 16, true, 64},
                                                      {256, 8, true, 33},
                                                      {1024, 16, true, 64},
                                                      {37, 5, true, 64},
                                                      {896, 16, false, 33},
                                                      {896, 1, true, 1},
                                                      {64, 1, true, 33}}) {
    SCOPED_TRACE(fmt::format("{} experts, top-{}, renormalize {}, {} tokens", experts, top_k, renorm, tokens));
    std::vector<float> logits = test::random_vec(tokens * experts, experts, -4, 4);
    std::vector<float> bias = test::random_vec(experts, 2, -0.1f, 0.1f);
    // Exact ties on the first token: equal scores for experts 3, 5, 7, above every other expert.
    for (int e : {3, 5, 7}) logits[e] = 30.0f, bias[e] = 0.5f;  // σ(30) = 1 exactly in fp32
    DeviceBuffer dl = upload(logits), db = upload(bias);
    DeviceBuffer ids = test::poisoned(tokens * top_k * 4), w = test::poisoned(tokens * top_k * 4);
    RouterParams p{experts, top_k, renorm, 2.5f};
    router_topk(nullptr, dl.as<float>(), experts, db.as<float>(), tokens, p, ids.as<int32_t>(), w.as<float>());
    const auto gid = download<int32_t>(ids.data(), tokens * top_k);
    const auto gw = download<float>(w.data(), tokens * top_k);
    cpu::RouterConfig cfg{experts, top_k, 1, 1, renorm, 2.5f};
    constexpr float kNearTie = 1e-6f;
    int exact_rows = 0;
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<float> scores(experts), biased(experts);
      for (int e = 0; e < experts; ++e) {
        scores[e] = cpu::sigmoid(logits[t * experts + e]);
        biased[e] = scores[e] + bias[e];
      }
      std::vector<int32_t> rid(top_k);
      std::vector<float> rw(top_k);
      cpu::select_experts(cfg, scores.data(), bias.data(), rid.data(), rw.data());
      const int32_t* g = &gid[t * top_k];
      std::vector<bool> chosen(experts, false);
      float sum = 0.0f;
      for (int j = 0; j < top_k; ++j) {
        ASSERT_TRUE(g[j] >= 0 && g[j] < experts && !chosen[g[j]]) << "token " << t << " slot " << j << " id " << g[j];
        chosen[g[j]] = true;
        sum += scores[g[j]];
        if (j > 0) {
          ASSERT_GE(biased[g[j - 1]], biased[g[j]] - kNearTie) << "order, token " << t << " slot " << j;
        }
      }
      float min_in = INFINITY, max_out = -INFINITY;
      for (int e = 0; e < experts; ++e) {
        if (chosen[e]) {
          min_in = std::min(min_in, biased[e]);
        } else {
          max_out = std::max(max_out, biased[e]);
        }
      }
      ASSERT_GE(min_in, max_out - kNearTie) << "experts " << experts << " token " << t << ": not the top " << top_k;
      const bool same = std::equal(rid.begin(), rid.end(), g);
      exact_rows += same;
      for (int j = 0; j < top_k; ++j) {
        // Renormalized only over more than one expert (the CPU's rule, as the K3 reference).
        const float want = (renorm && top_k > 1 ? scores[g[j]] / (sum + 1e-20f) : scores[g[j]]) * 2.5f;
        ASSERT_NEAR(gw[t * top_k + j], want, 1e-6f * std::max(1.0f, std::fabs(want))) << "weight, token " << t;
        if (same) {
          ASSERT_NEAR(gw[t * top_k + j], rw[j], 1e-6f * std::max(1.0f, std::fabs(rw[j]))) << "vs the CPU";
        }
      }
    }
    // Near-ties may trade places on a row or two of a batch; a single token must match.
    EXPECT_GE(exact_rows, tokens == 1 ? 1 : tokens - 2) << "the GPU and CPU selections differ beyond near-ties";
    for (int j = 0; j < std::min(top_k, 3); ++j) EXPECT_EQ(gid[j], 3 + 2 * j) << "tie order";
  }
  EXPECT_THROW(router_topk(nullptr, nullptr, 2000, nullptr, 1, RouterParams{2000, 16, true, 1.0f}, nullptr, nullptr),
               Error);
}

// Without a correction bias (bias null): the selection by the scores alone, as the CPU's with a null bias. Logits
// a permutation of evenly spaced values, so that no two scores are near-tied.
TEST(Router, WithoutCorrectionBias) {
  KIMIRT_REQUIRE_GPU();
  constexpr int kExperts = 896, kTopK = 16, kTokens = 4;
  std::vector<float> logits(kTokens * kExperts);
  for (int t = 0; t < kTokens; ++t)
    for (int e = 0; e < kExperts; ++e)
      logits[t * kExperts + e] = -4.0f + 8.0f * static_cast<float>((e * 389 + t * 17) % kExperts) / kExperts;
  DeviceBuffer dl = upload(logits), ids = test::poisoned(kTokens * kTopK * 4), w = test::poisoned(kTokens * kTopK * 4);
  router_topk(nullptr, dl.as<float>(), kExperts, nullptr, kTokens, RouterParams{kExperts, kTopK, true, 2.5f},
              ids.as<int32_t>(), w.as<float>());
  const auto gid = download<int32_t>(ids.data(), kTokens * kTopK);
  const auto gw = download<float>(w.data(), kTokens * kTopK);
  for (int t = 0; t < kTokens; ++t) {
    std::vector<float> scores(kExperts);
    for (int e = 0; e < kExperts; ++e) scores[e] = cpu::sigmoid(logits[t * kExperts + e]);
    std::vector<int32_t> rid(kTopK);
    std::vector<float> rw(kTopK);
    cpu::select_experts(cpu::RouterConfig{kExperts, kTopK, 1, 1, true, 2.5f}, scores.data(), nullptr, rid.data(),
                        rw.data());
    for (int j = 0; j < kTopK; ++j) {
      EXPECT_EQ(gid[t * kTopK + j], rid[j]) << "token " << t << " slot " << j;
      EXPECT_NEAR(gw[t * kTopK + j], rw[j], 1e-6f * std::max(1.0f, std::fabs(rw[j]))) << "token " << t << " slot " << j;
    }
  }
}

// NaN scores rank below every number, -inf included, and ties (-inf with -inf, NaN with NaN) go to the lower id,
// on the GPU as on the CPU (cpu/router.cpp). Experts 0-7 finite, 8-15 with NaN logits (NaN biased scores),
// 16-23 with a -inf correction bias (an expert switched off), 24-31 with a NaN bias; top-16 must take the 8
// finite experts and then 16-23, not the lower ids 8-15.
TEST(Router, NanRanksBelowMinusInfinityAsOnTheCpu) {
  KIMIRT_REQUIRE_GPU();
  constexpr int kExperts = 32, kTopK = 16;
  std::vector<float> logits = test::random_vec(kExperts, 7, -4, 4), bias = test::random_vec(kExperts, 8, -0.1f, 0.1f);
  for (int e = 8; e < 16; ++e) logits[e] = std::numeric_limits<float>::quiet_NaN();
  for (int e = 16; e < 24; ++e) bias[e] = -INFINITY;
  for (int e = 24; e < 32; ++e) bias[e] = std::numeric_limits<float>::quiet_NaN();
  DeviceBuffer dl = upload(logits), db = upload(bias);
  DeviceBuffer ids = test::poisoned(kTopK * 4), w = test::poisoned(kTopK * 4);
  router_topk(nullptr, dl.as<float>(), kExperts, db.as<float>(), 1, RouterParams{kExperts, kTopK, true, 1.0f},
              ids.as<int32_t>(), w.as<float>());
  std::vector<float> scores(kExperts);
  for (int e = 0; e < kExperts; ++e) scores[e] = cpu::sigmoid(logits[e]);
  std::vector<int32_t> rid(kTopK);
  std::vector<float> rw(kTopK);
  cpu::select_experts(cpu::RouterConfig{kExperts, kTopK, 1, 1, true, 1.0f}, scores.data(), bias.data(), rid.data(),
                      rw.data());
  const auto gid = download<int32_t>(ids.data(), kTopK);
  EXPECT_EQ(gid, rid);
  for (int j = 8; j < kTopK; ++j) EXPECT_EQ(gid[j], 8 + j) << "slot " << j << ": the -inf experts in id order";
  const auto gw = download<float>(w.data(), kTopK);
  for (int j = 0; j < kTopK; ++j) EXPECT_NEAR(gw[j], rw[j], 1e-6f) << "weight of slot " << j;
}

TEST(AttnRes, MixAndNormMatchCpu) {
  KIMIRT_REQUIRE_GPU();
  // Both kernel versions; the pipelined one with more tokens than resident clusters (each cluster walks
  // several tokens through its ring, wrapping the slots), with three slots (9 x 7168), two (12 x 7168) and
  // one (12 x 16384).
  for (auto [count, hidden, tokens, kernel] :
       {std::tuple<int, int64_t, int64_t, AttnResKernel>{9, 7168, 6, AttnResKernel::kPerToken},
        {9, 7168, 6, AttnResKernel::kPipelined},
        {9, 7168, 1000, AttnResKernel::kPipelined},
        {12, 7168, 300, AttnResKernel::kPipelined},
        {12, 16384, 300, AttnResKernel::kPipelined},
        {12, 7168, 7, AttnResKernel::kAuto},
        {12, 7168, 6, AttnResKernel::kPerToken},
        {1, 7168, 6, AttnResKernel::kAuto},
        {3, 1032, 6, AttnResKernel::kPerToken},
        {3, 1032, 500, AttnResKernel::kPipelined},
        {2, 8, 3, AttnResKernel::kPipelined},
        {2, 8, 3, AttnResKernel::kPerToken},         // the second block of each token has no vector
        {11, 2056, 5, AttnResKernel::kPerToken}}) {  // 11 candidates (row 11 of the tensor-core tile), odd halves
    SCOPED_TRACE(::testing::Message() << count << " candidates, H " << hidden << ", " << tokens << " tokens, kernel "
                                      << static_cast<int>(kernel));
    std::vector<std::vector<float>> cand(count);
    std::vector<DeviceBuffer> dc;
    std::vector<const __nv_bfloat16*> ptrs;
    for (int i = 0; i < count; ++i) {
      cand[i] = test::random_vec(tokens * hidden, 100 + i, -1.0f - i, 1.0f + i);
      dc.push_back(upload(test::to_bf16(cand[i])));
      ptrs.push_back(dc.back().as<__nv_bfloat16>());
    }
    std::vector<float> nw = test::random_vec(hidden, 1, 0.5, 1.5), pw = test::random_vec(hidden, 2, -0.05f, 0.05f),
                       w = test::random_vec(hidden, 3, 0.5, 1.5);
    DeviceBuffer dnw = upload(test::to_bf16(nw)), dpw = upload(test::to_bf16(pw)), dw = upload(test::to_bf16(w));
    DeviceBuffer u = test::poisoned(hidden * 4);
    attn_res_pseudo_query(nullptr, dnw.as<__nv_bfloat16>(), dpw.as<__nv_bfloat16>(), u.as<float>(), hidden);
    DeviceBuffer mixed = test::poisoned(tokens * hidden * 2), normed = test::poisoned(tokens * hidden * 2);
    attn_res_mix_norm(nullptr, ptrs.data(), count, hidden, tokens, hidden, u.as<float>(), 1e-5f, dw.as<__nv_bfloat16>(),
                      1e-5f, mixed.as<__nv_bfloat16>(), normed.as<__nv_bfloat16>(), hidden, kernel);
    std::vector<const float*> cp;
    for (auto& c : cand) cp.push_back(c.data());
    std::vector<float> ref_mix(tokens * hidden), ref_norm(tokens * hidden);
    cpu::attn_res_mix(cp, tokens, hidden, cpu::AttnResWeights{nw.data(), pw.data()}, 1e-5f, ref_mix.data());
    EXPECT_LE(test::rel_err(dl_bf16(mixed, tokens * hidden), ref_mix), 4e-3) << count << " candidates, H " << hidden;
    std::vector<float> mix_b = dl_bf16(mixed, tokens * hidden);
    cpu::rms_norm(mix_b.data(), w.data(), ref_norm.data(), tokens, hidden, 1e-5f);
    EXPECT_LE(test::rel_err(dl_bf16(normed, tokens * hidden), ref_norm), 6e-3) << count << " candidates";
    // Without the mixed row (mixed null, as a layer that needs only the norm passes it): the same normed row.
    DeviceBuffer normed_only = test::poisoned(tokens * hidden * 2);
    attn_res_mix_norm(nullptr, ptrs.data(), count, hidden, tokens, hidden, u.as<float>(), 1e-5f, dw.as<__nv_bfloat16>(),
                      1e-5f, nullptr, normed_only.as<__nv_bfloat16>(), hidden, kernel);
    EXPECT_EQ(download<uint16_t>(normed_only.data(), tokens * hidden),
              download<uint16_t>(normed.data(), tokens * hidden))
        << "mixed = null";
  }
}

}  // namespace
}  // namespace kimirt::cuda

namespace kimirt::cuda {
namespace {

TEST(DenseOps, BadArgumentsAreErrorsNamingTheOp) {
  KIMIRT_REQUIRE_GPU();
  DeviceBuffer buf(1 << 20);
  auto* p = buf.as<__nv_bfloat16>();
  auto expect_error = [](const std::function<void()>& fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([&] { rms_norm(nullptr, p + 1, 64, p, p, 64, 2, 64, 1e-5f); }, "rms_norm");      // misaligned x
  expect_error([&] { rms_norm(nullptr, p, 64, p, p, 64, 2, 60, 1e-5f); }, "rms_norm: dim 60");  // dim % 8
  expect_error([&] { glu_fp8(nullptr, Glu{}, p, p + 64, 128, buf.as<uint8_t>(), buf.as<float>(), 2, 64); },
               "glu_fp8: width 64");
  expect_error(
      [&] {
        glu(nullptr, Glu{Glu::Kind::kSitu, 0.0f, 25.0f}, p, p + 64, 128, p, 64, 2, 64);
      },
      "activation_situ_beta");
  // Betas whose reciprocal (or, for the two together, whose product) is not a float: the kernels' 1 / beta would
  // turn a zero input into 0 · inf = NaN where the CPU gives 0.
  for (const auto& [beta, linear, needle] :
       {std::tuple<float, float, const char*>{1e-40f, 25.0f, "activation_situ_beta"},
        {4.0f, 1e-40f, "activation_situ_linear_beta"},
        {1e20f, 1e20f, "finite product with beta"},
        {4.0f, NAN, "activation_situ_linear_beta"}}) {
    expect_error([&] { glu(nullptr, Glu{Glu::Kind::kSitu, beta, linear}, p, p + 64, 128, p, 64, 2, 64); }, needle);
  }
  std::vector<const __nv_bfloat16*> cands(13, p);
  expect_error(
      [&] {
        attn_res_mix_norm(nullptr, cands.data(), 13, 64, 1, 64, buf.as<float>(), 1e-5f, p, 1e-5f, nullptr, p, 64);
      },
      "13 candidates");
  expect_error([&] { embedding_gather(nullptr, p, 10, 12, buf.as<int32_t>(), 1, p, 12); }, "hidden 12");
  expect_error([&] { rms_norm_gated(nullptr, p, 192, p, 192, buf.as<float>(), p, 192, 1, 2, 96, 1e-5f); },
               "head_dim 96");
  // An epsilon that is negative or not a number gives NaN rows where mean(x^2) is below it: refused, named.
  for (const float eps : {-1.0f, NAN, INFINITY}) {
    expect_error([&] { rms_norm(nullptr, p, 64, p, p, 64, 2, 64, eps); }, "rms_norm: eps ");
    expect_error([&] { add_rms_norm(nullptr, p, 64, p, 64, p, 64, p, p, 64, 2, 64, eps); }, "add_rms_norm: eps ");
    expect_error([&] { rms_norm_gated(nullptr, p, 256, p, 256, buf.as<float>(), p, 256, 1, 2, 128, eps); },
                 "rms_norm_gated: eps ");
    expect_error(
        [&] { attn_res_mix_norm(nullptr, cands.data(), 2, 64, 1, 64, buf.as<float>(), eps, p, 1e-5f, nullptr, p, 64); },
        "attn_res_mix_norm: res_eps ");
  }
}

}  // namespace
}  // namespace kimirt::cuda
