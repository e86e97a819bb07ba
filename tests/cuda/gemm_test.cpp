// GEMMs: cuBLASLt BF16 (bf16 and fp32 out, batched), the skinny kernel, the dispatcher and the FP8
// block-scale paths (cuBLASLt and ours), against fp64 dot products of the same bf16 / e4m3 inputs on sampled outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "kimirt/base/error.h"
#include "kimirt/cuda/fp8_block_gemm.h"
#include "kimirt/cuda/gemm_dispatch.h"
#include "kimirt/cuda/gemm_lt.h"
#include "kimirt/cuda/gemv.h"
#include "kimirt/cuda/mla_cache.h"
#include "kimirt/cuda/quantize_fp8.h"
#include "kimirt/cuda/rms_norm.h"
#include "test_util.h"

namespace kimirt::cuda {
namespace {

using test::download;
using test::upload;

// Outputs off by more than one bf16 rounding step (2^-8 relative) plus 1e-3 of the references' rms (the fp32
// summation of near-cancelling sums): a misplaced or missing output (NaN poison) counts however few there are.
int64_t beyond_bf16_step(const std::vector<float>& got, const std::vector<float>& ref) {
  double ss = 0.0;
  for (float r : ref) ss += static_cast<double>(r) * r;
  const double floor = 1e-3 * std::sqrt(ss / std::max<size_t>(ref.size(), 1));
  int64_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    bad += !(std::fabs(static_cast<double>(got[i]) - ref[i]) <= std::ldexp(std::fabs(ref[i]), -8) + floor);
  }
  return bad;
}

struct Problem {
  int64_t m, n, k;
  std::vector<float> x, w;  // bf16-rounded values
  DeviceBuffer dx, dw;
  Problem(int64_t m_, int64_t n_, int64_t k_, uint32_t seed) : m(m_), n(n_), k(k_) {
    x = test::random_vec(m * k, seed);
    w = test::random_vec(n * k, seed + 1, -0.05f, 0.05f);
    dx = upload(test::to_bf16(x));
    dw = upload(test::to_bf16(w));
  }
  // (got, reference) on up to `max_samples` sampled outputs (all of them for small problems).
  std::pair<std::vector<float>, std::vector<float>> sampled(const std::vector<float>& y, int64_t ldy,
                                                            int64_t max_samples) const {
    std::vector<float> got, ref;
    std::mt19937 rng(11);
    const int64_t total = m * n;
    const int64_t samples = std::min<int64_t>(total, max_samples);
    for (int64_t s = 0; s < samples; ++s) {
      int64_t idx = total <= max_samples ? s : static_cast<int64_t>(rng() % total);
      // Sampled: the last row, the last column and the last output always among them (tails of tiles).
      if (total > max_samples && s < 3) {
        const int64_t i = s == 1 ? idx / n : m - 1, j = s == 0 ? idx % n : n - 1;
        idx = i * n + j;
      }
      const int64_t i = idx / n, j = idx % n;
      double acc = 0.0;
      for (int64_t kk = 0; kk < k; ++kk) acc += static_cast<double>(x[i * k + kk]) * w[j * k + kk];
      got.push_back(y[i * ldy + j]);
      ref.push_back(static_cast<float>(acc));
    }
    return {got, ref};
  }
  // Outputs left unwritten (still the NaN poison) or not finite, over the whole [m, n]: a sample can miss them.
  int64_t non_finite(const std::vector<float>& y, int64_t ldy) const {
    int64_t bad = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) bad += !std::isfinite(y[i * ldy + j]);
    return bad;
  }
  double error(const std::vector<float>& y, int64_t ldy, int64_t max_samples = 512) const {
    if (const int64_t bad = non_finite(y, ldy)) {
      ADD_FAILURE() << bad << " of the " << m * n << " outputs are not finite (unwritten?)";
      return INFINITY;
    }
    const auto [got, ref] = sampled(y, ldy, max_samples);
    return test::rel_err(got, ref);
  }
  // Outputs off by more than one bf16 step (beyond_bf16_step), among up to `max_samples` sampled ones.
  int64_t bad_outputs(const std::vector<float>& y, int64_t ldy, int64_t max_samples) const {
    if (const int64_t bad = non_finite(y, ldy)) return bad;
    const auto [got, ref] = sampled(y, ldy, max_samples);
    return beyond_bf16_step(got, ref);
  }
  // bad_outputs over every output, the fp64 reference computed once per problem: the sampled error alone sees
  // 512 fixed outputs, which a wrong tile or row group elsewhere would not touch.
  int64_t bad_anywhere(const std::vector<float>& y, int64_t ldy) const {
    if (full_ref.empty()) {
      full_ref.resize(m * n);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double acc = 0.0;
          for (int64_t kk = 0; kk < k; ++kk) acc += static_cast<double>(x[i * k + kk]) * w[j * k + kk];
          full_ref[i * n + j] = static_cast<float>(acc);
        }
    }
    std::vector<float> got(m * n);
    for (int64_t i = 0; i < m; ++i) std::copy_n(y.begin() + i * ldy, n, got.begin() + i * n);
    return beyond_bf16_step(got, full_ref);
  }
  mutable std::vector<float> full_ref;
};

std::vector<float> y_as_float(const DeviceBuffer& y, OutType t, int64_t count) {
  if (t == OutType::kF32) return download<float>(y.data(), count);
  return test::from_bf16(download<uint16_t>(y.data(), count));
}

// Skinny arguments for `batch` strided entries whose tokens' outputs are contiguous (the W_UV layout): x
// [m, batch, k], w [batch, n, k], bf16 y [m, batch · n].
SkinnyGemmArgs strided_args(const DeviceBuffer& x, const DeviceBuffer& w, DeviceBuffer& y, int64_t m, int64_t n,
                            int64_t k, int64_t batch) {
  SkinnyGemmArgs a{
      x.as<__nv_bfloat16>(), batch * k, w.as<__nv_bfloat16>(), k, y.data(), OutType::kBF16, batch * n, m, n, k, 0.0f};
  a.batch = batch, a.stride_x = k, a.stride_w = n * k, a.stride_y = n;
  return a;
}

class GemmShapes : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t>> {};

// bf16 output: one rounding (2^-9 relative) on top of fp32 accumulation → ≤ 4e-3. fp32 output: only the
// fp32 summation order differs from the fp64 reference; over K up to 12288 random-sign terms that is
// ~eps·√K ≈ 7e-6 relative, so the bound is 3e-5 (an indexing error is O(1)).
TEST_P(GemmShapes, SkinnyAndLtMatchReference) {
  KIMIRT_REQUIRE_GPU();
  const auto [m, n, k] = GetParam();
  const DeviceInfo info = query_device(0);
  Problem p(m, n, k, static_cast<uint32_t>(m * 7 + n + k));
  DeviceBuffer ws(64 << 20);
  GemmLt lt(ws.data(), ws.size());
  for (OutType t : {OutType::kBF16, OutType::kF32}) {
    const size_t esize = t == OutType::kF32 ? 4 : 2;
    const double tol = t == OutType::kF32 ? 3e-5 : 4e-3;
    DeviceBuffer y = test::poisoned(m * n * esize);
    lt.linear_bf16(nullptr, p.dx.as<__nv_bfloat16>(), k, p.dw.as<__nv_bfloat16>(), k, y.data(), t, n, m, n, k);
    EXPECT_LE(p.error(y_as_float(y, t, m * n), n), tol) << "cuBLASLt " << test::shape({m, n, k});
    EXPECT_EQ(p.bad_anywhere(y_as_float(y, t, m * n), n), 0) << "cuBLASLt " << test::shape({m, n, k});
    if (m <= kSkinnyMaxM) {
      DeviceBuffer y2 = test::poisoned(m * n * esize);
      DeviceBuffer sws = test::poisoned(skinny_gemm_workspace_bytes(m, n, k, info.sm_count));
      const SkinnyGemmArgs a{p.dx.as<__nv_bfloat16>(), k, p.dw.as<__nv_bfloat16>(), k, y2.data(), t, n, m, n, k, 0.0f};
      skinny_gemm(nullptr, a, sws.data(), sws.size(), info.sm_count);
      EXPECT_LE(p.error(y_as_float(y2, t, m * n), n), tol) << "skinny " << test::shape({m, n, k});
      EXPECT_EQ(p.bad_anywhere(y_as_float(y2, t, m * n), n), 0) << "skinny " << test::shape({m, n, k});
    }
  }
}

INSTANTIATE_TEST_SUITE_P(K3AndOdd, GemmShapes,
                         ::testing::Values(std::make_tuple(1, 7168, 7168), std::make_tuple(1, 576, 7168),
                                           std::make_tuple(3, 1536, 7168), std::make_tuple(8, 18432, 1536),
                                           std::make_tuple(16, 7168, 12288), std::make_tuple(13, 896, 7168),
                                           std::make_tuple(5, 100, 96), std::make_tuple(64, 2048, 7168),
                                           std::make_tuple(37, 24, 160)));

// The row-streaming kernel under every split it may take (odd N, K split into unequal parts, tokens 1..4,
// both output types, accumulation) and the automatic choice.
TEST(Gemm, SkinnyRowsKernelEveryConfig) {
  KIMIRT_REQUIRE_GPU();
  const DeviceInfo info = query_device(0);
  for (auto [m, n, k] :
       {std::make_tuple<int64_t, int64_t, int64_t>(1, 576, 7168), {2, 77, 7168}, {3, 130, 96}, {4, 33, 2080}}) {
    Problem p(m, n, k, static_cast<uint32_t>(m + n + k));
    for (OutType t : {OutType::kBF16, OutType::kF32}) {
      const size_t esize = t == OutType::kF32 ? 4 : 2;
      const double tol = t == OutType::kF32 ? 3e-5 : 4e-3;
      for (int rows : {1, 2}) {
        for (int splits : {1, 2, 4, 8}) {
          SkinnyConfig c;
          c.kernel = SkinnyConfig::Kernel::kRows;
          c.rows_per_warp = rows;
          c.splits = splits;
          // beta 1: y += x · wᵀ, in the kernel's own store (one split) or in the split-K reduction. y starts at
          // values a tenth of the product's size, so a bf16 y adds about one rounding of the sum (6e-3).
          for (const float beta : {0.0f, 1.0f}) {
            std::vector<float> y0 = test::random_vec(m * n, 70 + splits, -0.1f, 0.1f);
            DeviceBuffer y = beta == 0.0f         ? test::poisoned(m * n * esize)
                             : t == OutType::kF32 ? upload(y0)
                                                  : upload(test::to_bf16(y0));  // y0 holds the bf16 values then
            const SkinnyGemmArgs a{
                p.dx.as<__nv_bfloat16>(), k, p.dw.as<__nv_bfloat16>(), k, y.data(), t, n, m, n, k, beta};
            skinny_gemm(nullptr, a, nullptr, 0, info.sm_count, c);
            std::vector<float> got = y_as_float(y, t, m * n);
            if (beta != 0.0f) {
              for (int64_t i = 0; i < m * n; ++i) got[i] -= y0[i];
            }
            EXPECT_LE(p.error(got, n), beta == 0.0f         ? tol
                                       : t == OutType::kF32 ? 3e-5
                                                            : 6e-3)
                << "rows kernel " << test::shape({m, n, k}) << " rows/warp " << rows << " splits " << splits << " beta "
                << beta;
            // Every output, not 512 samples: a warp of one configuration that loses a partial would hide there.
            if (beta == 0.0f) {
              EXPECT_EQ(p.bad_anywhere(got, n), 0)
                  << "rows kernel " << test::shape({m, n, k}) << " rows/warp " << rows << " splits " << splits;
            }
          }
        }
      }
      const SkinnyGemmArgs probe{
          p.dx.as<__nv_bfloat16>(), k, p.dw.as<__nv_bfloat16>(), k, nullptr, t, n, m, n, k, 0.0f};
      EXPECT_EQ(skinny_gemm_config(probe, info.sm_count).kernel,
                m <= 2 && k > 2048 ? SkinnyConfig::Kernel::kRows : SkinnyConfig::Kernel::kMma);
    }
  }
  // m > 4 and strided batches take the MMA kernel; forcing the rows kernel there is an error.
  Problem p(8, 64, 64, 3);
  DeviceBuffer y(8 * 64 * 2);
  SkinnyGemmArgs a{
      p.dx.as<__nv_bfloat16>(), 64, p.dw.as<__nv_bfloat16>(), 64, y.data(), OutType::kBF16, 64, 8, 64, 64, 0.0f};
  EXPECT_EQ(skinny_gemm_config(a, info.sm_count).kernel, SkinnyConfig::Kernel::kMma);
  SkinnyConfig rows;
  rows.kernel = SkinnyConfig::Kernel::kRows;
  EXPECT_THROW(skinny_gemm(nullptr, a, nullptr, 0, info.sm_count, rows), Error);
}

// Linear::on_sms: the rows kernel's persistent grid (SkinnyConfig::max_blocks) strides its warps over the
// rows; each row is still one warp's sum in the same order, so the bits equal the uncapped grid's, for any
// cap (one block, a few, more than the rows need).
TEST(Gemm, RowsKernelOnFewSms) {
  KIMIRT_REQUIRE_GPU();
  const DeviceInfo info = query_device(0);
  DeviceBuffer ws(8 << 20), sws(8 << 20);
  GemmLt lt(ws.data(), ws.size());
  Linear linear(lt, sws.data(), sws.size(), info.sm_count);
  // Each block of the capped grid has an SM to itself, so the grid keeps exactly as many SMs as blocks.
  EXPECT_EQ(skinny_capped_blocks_per_sm(OutType::kBF16), 1);
  EXPECT_EQ(skinny_capped_blocks_per_sm(OutType::kF32), 1);
  for (auto [n, k] : {std::make_pair<int64_t, int64_t>(3001, 7168), {577, 4096}}) {
    Problem p(1, n, k, static_cast<uint32_t>(n + k));
    for (OutType t : {OutType::kBF16, OutType::kF32}) {
      const size_t esize = t == OutType::kF32 ? 4 : 2;
      DeviceBuffer plain = test::poisoned(n * esize);
      const SkinnyGemmArgs a{
          p.dx.as<__nv_bfloat16>(), k, p.dw.as<__nv_bfloat16>(), k, plain.data(), t, n, 1, n, k, 0.0f};
      SkinnyConfig rows;  // as on_sms runs it, on every SM
      rows.kernel = SkinnyConfig::Kernel::kRows;
      rows.rows_per_warp = 2;
      skinny_gemm(nullptr, a, nullptr, 0, info.sm_count, rows);
      const auto want = download<uint8_t>(plain.data(), n * esize);
      EXPECT_LE(p.error(y_as_float(plain, t, n), n), t == OutType::kF32 ? 3e-5 : 4e-3) << test::shape({1, n, k});
      // Every output of the baseline the capped grids are held to bit for bit.
      EXPECT_EQ(p.bad_anywhere(y_as_float(plain, t, n), n), 0) << test::shape({1, n, k});
      for (int sms : {1, 5, 40, 4000}) {
        DeviceBuffer y = test::poisoned(n * esize);
        EXPECT_TRUE(
            linear.on_sms(nullptr, p.dx.as<__nv_bfloat16>(), p.dw.as<__nv_bfloat16>(), y.data(), t, 1, n, k, sms));
        EXPECT_EQ(download<uint8_t>(y.data(), n * esize), want) << test::shape({1, n, k}) << " on " << sms << " SMs";
      }
    }
  }
  // More than one token, or short rows (the MMA kernel's shapes), are declined, launching nothing; bad caps
  // are errors.
  Problem p(2, 64, 4096, 5);
  DeviceBuffer y = test::poisoned(2 * 64 * 2);
  EXPECT_FALSE(linear.on_sms(nullptr, p.dx.as<__nv_bfloat16>(), p.dw.as<__nv_bfloat16>(), y.data(), OutType::kBF16, 2,
                             64, 4096, 8));
  EXPECT_FALSE(linear.on_sms(nullptr, p.dx.as<__nv_bfloat16>(), p.dw.as<__nv_bfloat16>(), y.data(), OutType::kBF16, 1,
                             64, 1024, 8));
  EXPECT_THROW(linear.on_sms(nullptr, p.dx.as<__nv_bfloat16>(), p.dw.as<__nv_bfloat16>(), y.data(), OutType::kBF16, 1,
                             64, 4096, 0),
               Error);
  const SkinnyGemmArgs a{
      p.dx.as<__nv_bfloat16>(), 4096, p.dw.as<__nv_bfloat16>(), 4096, y.data(), OutType::kBF16, 64, 1, 64, 4096, 0.0f};
  for (auto [rows, splits] : {std::pair{2, 2}, std::pair{1, 1}}) {
    SkinnyConfig capped;  // a capped grid takes two rows per warp and one split only
    capped.kernel = SkinnyConfig::Kernel::kRows;
    capped.rows_per_warp = rows;
    capped.splits = splits;
    capped.max_blocks = 4;
    EXPECT_THROW(skinny_gemm(nullptr, a, nullptr, 0, info.sm_count, capped), Error) << rows << " rows, " << splits;
  }
}

// The output gate fused into the skinny kernels' store (SkinnyGemmArgs::gate) gives the same bits as the
// plain product followed by sigmoid_gate_mul: the rows kernel (with and without a K split over warps), the
// MMA kernel on strided batches (the W_UV layout), with K split over blocks (the reduce kernel stores) and
// without. A gate with fp32 output or accumulation is refused.
TEST(Gemm, SkinnyGateMatchesSigmoidGateMulBitForBit) {
  KIMIRT_REQUIRE_GPU();
  const int sms = query_device(0).sm_count;
  struct Case {
    int64_t m, n, k, batch;
    SkinnyConfig config;
    uint64_t workspace;
  };
  SkinnyConfig rows1, rows2x4, mma;
  rows1.kernel = rows2x4.kernel = SkinnyConfig::Kernel::kRows;
  rows1.rows_per_warp = 1;
  rows2x4.splits = 4;
  mma.kernel = SkinnyConfig::Kernel::kMma;
  // rows kernel 1 row per warp / 2 rows and K over 4 warps (m up to 4); MMA kernel on strided batches with
  // long rows, short rows (K <= 256: the WIDE variant) and K split over blocks (with and without batches).
  for (const Case& c : {Case{1, 336, 2048, 1, rows1, 0}, Case{4, 96, 4096, 1, rows2x4, 0},
                        Case{1, 128, 512, 12, mma, 0}, Case{3, 128, 512, 12, mma, 0}, Case{2, 512, 128, 12, mma, 0},
                        Case{2, 64, 8192, 1, mma, 16 << 20}, Case{2, 64, 8192, 3, mma, 16 << 20}}) {
    const int64_t width = c.batch * c.n;  // each token's outputs, contiguous
    std::vector<float> x = test::random_vec(c.m * c.batch * c.k, 40 + c.n);
    std::vector<float> w = test::random_vec(c.batch * c.n * c.k, 41 + c.n);
    std::vector<float> g = test::random_vec(c.m * width, 42 + c.n, -4, 4);
    DeviceBuffer dx = upload(test::to_bf16(x)), dw = upload(test::to_bf16(w)), dg = upload(test::to_bf16(g));
    DeviceBuffer ws = test::poisoned(c.workspace);
    DeviceBuffer plain = test::poisoned(c.m * width * 2), gated = test::poisoned(c.m * width * 2);
    SkinnyGemmArgs a = strided_args(dx, dw, plain, c.m, c.n, c.k, c.batch);
    skinny_gemm(nullptr, a, c.workspace ? ws.data() : nullptr, c.workspace, sms, c.config);
    const auto product = download<uint16_t>(plain.data(), c.m * width);  // before the gate multiplies it in place
    sigmoid_gate_mul(nullptr, plain.as<__nv_bfloat16>(), width, dg.as<__nv_bfloat16>(), width, c.m, width);
    a.y = gated.data(), a.gate = dg.as<__nv_bfloat16>();
    poison(ws.data(), ws.size(), nullptr);  // the gated call's split-K partials are its own, not the plain call's
    skinny_gemm(nullptr, a, c.workspace ? ws.data() : nullptr, c.workspace, sms, c.config);
    const auto want = download<uint16_t>(plain.data(), c.m * width);
    const auto got = download<uint16_t>(gated.data(), c.m * width);
    // The product itself (before the gate) against fp64, every output: the only batched split-K product of the suite
    // (a reduce that read one batch entry's partials for all would give plain and gated the same wrong bits).
    std::vector<float> ref(static_cast<size_t>(c.m * width));
    for (int64_t i = 0; i < c.m; ++i) {
      for (int64_t b = 0; b < c.batch; ++b) {
        for (int64_t j = 0; j < c.n; ++j) {
          double acc = 0.0;
          for (int64_t kk = 0; kk < c.k; ++kk) {
            acc += static_cast<double>(x[(i * c.batch + b) * c.k + kk]) * w[(b * c.n + j) * c.k + kk];
          }
          ref[static_cast<size_t>(i * width + b * c.n + j)] = static_cast<float>(acc);
        }
      }
    }
    EXPECT_LE(test::rel_err(test::from_bf16(product), ref), 4e-3)
        << test::shape({c.m, c.n, c.k}) << " batch " << c.batch << " " << skinny_config_name(c.config);
    int64_t differ = 0;
    for (size_t i = 0; i < want.size(); ++i) differ += want[i] != got[i];
    EXPECT_EQ(differ, 0) << test::shape({c.m, c.n, c.k}) << " batch " << c.batch << " " << skinny_config_name(c.config);
    if (c.workspace) {
      EXPECT_GT(skinny_gemm_workspace_bytes(c.m, c.n, c.k, sms, c.batch), 0u) << "the split-K case splits K";
    }
  }
  DeviceBuffer p(1 << 16);
  const __nv_bfloat16* b = p.as<__nv_bfloat16>();
  SkinnyGemmArgs f32{b, 64, b, 64, p.data(), OutType::kF32, 64, 1, 64, 64, 0.0f};
  f32.gate = b;
  EXPECT_FALSE(skinny_gemm_supported(f32));
  EXPECT_THROW(skinny_gemm(nullptr, f32, nullptr, 0, sms), Error);
  SkinnyGemmArgs acc{b, 64, b, 64, p.data(), OutType::kBF16, 64, 1, 64, 64, 1.0f};
  acc.gate = b;
  EXPECT_FALSE(skinny_gemm_supported(acc));
}

// The RMSNorm fused into the MMA kernel (SkinnyGemmArgs::x_norm) against fp64 products of the exactly
// normed rows: one row (the q_b_proj shape), the WIDE variant (K <= 256), 16 tokens, a shape small enough
// that K would be split over blocks (a normed call must not be: given workspace, it still is not), and
// strided batches. The operand bf16(x ⊙ x_norm) and the bf16 output each round once (2^-9 relative), so the
// bound is that of the bf16 GEMMs, 4e-3. Linear::rms_normed fuses at decode sizes (x_normed untouched)
// and norms into x_normed before cuBLASLt at M = 64, where it must agree with rms_norm then the product.
TEST(Gemm, SkinnyFusedRmsNormAgainstReference) {
  KIMIRT_REQUIRE_GPU();
  const int sms = query_device(0).sm_count;
  const float eps = 1e-6f;
  struct Case {
    int64_t m, n, k, batch;
  };
  for (const Case& c : {Case{1, 1000, 1536, 1}, Case{4, 200, 256, 1}, Case{16, 130, 4096, 1}, Case{2, 64, 8192, 1},
                        Case{2, 128, 512, 3}}) {
    const int64_t width = c.batch * c.n;
    std::vector<float> x = test::random_vec(c.m * c.batch * c.k, 50 + c.n, -2, 2);
    std::vector<float> w = test::random_vec(c.batch * c.n * c.k, 51 + c.n, -0.05f, 0.05f);
    std::vector<float> nw = test::random_vec(c.k, 52 + c.n, 0.5f, 1.5f);
    DeviceBuffer dx = upload(test::to_bf16(x)), dw = upload(test::to_bf16(w)), dn = upload(test::to_bf16(nw));
    DeviceBuffer ws = test::poisoned(16 << 20), dy = test::poisoned(c.m * width * 2);
    SkinnyGemmArgs a = strided_args(dx, dw, dy, c.m, c.n, c.k, c.batch);
    a.x_norm = dn.as<__nv_bfloat16>(), a.x_norm_eps = eps;
    skinny_gemm(nullptr, a, ws.data(), ws.size(), sms);
    const std::vector<float> y = y_as_float(dy, OutType::kBF16, c.m * width);
    std::vector<float> ref(y.size());
    for (int64_t i = 0; i < c.m; ++i) {
      for (int64_t b = 0; b < c.batch; ++b) {
        const float* xr = x.data() + (i * c.batch + b) * c.k;
        double ss = 0.0;
        for (int64_t kk = 0; kk < c.k; ++kk) ss += static_cast<double>(xr[kk]) * xr[kk];
        const double r = 1.0 / std::sqrt(ss / static_cast<double>(c.k) + eps);
        for (int64_t j = 0; j < c.n; ++j) {
          const float* wr = w.data() + (b * c.n + j) * c.k;
          double acc = 0.0;
          for (int64_t kk = 0; kk < c.k; ++kk) acc += static_cast<double>(xr[kk]) * r * nw[kk] * wr[kk];
          ref[i * width + b * c.n + j] = static_cast<float>(acc);
        }
      }
    }
    EXPECT_LE(test::rel_err(y, ref), 4e-3) << test::shape({c.m, c.n, c.k}) << " batch " << c.batch;
  }

  // Through Linear: fused at M = 1 (x_normed keeps its poison), rms_norm + cuBLASLt at M = 64.
  DeviceBuffer lt_ws(32 << 20), sws = test::poisoned(16 << 20);
  GemmLt lt(lt_ws.data(), lt_ws.size());
  Linear linear(lt, sws.data(), sws.size(), sms);
  const int64_t n = 320, k = 1536;
  for (int64_t m : {int64_t{1}, int64_t{64}}) {
    Problem p(m, n, k, 60);
    std::vector<float> nw = test::random_vec(k, 62, 0.5f, 1.5f);
    DeviceBuffer dn = upload(test::to_bf16(nw));
    DeviceBuffer normed = test::poisoned(m * k * 2), y = test::poisoned(m * n * 2), y_ref = test::poisoned(m * n * 2);
    DeviceBuffer normed_ref = test::poisoned(m * k * 2);
    linear.rms_normed(nullptr, p.dx.as<__nv_bfloat16>(), dn.as<__nv_bfloat16>(), eps, normed.as<__nv_bfloat16>(),
                      p.dw.as<__nv_bfloat16>(), y.data(), OutType::kBF16, m, n, k);
    rms_norm(nullptr, p.dx.as<__nv_bfloat16>(), k, dn.as<__nv_bfloat16>(), normed_ref.as<__nv_bfloat16>(), k, m, k,
             eps);
    linear(nullptr, normed_ref.as<__nv_bfloat16>(), p.dw.as<__nv_bfloat16>(), y_ref.data(), OutType::kBF16, m, n, k);
    EXPECT_EQ(linear.uses_skinny(m, n, k), m == 1);
    EXPECT_LE(test::rel_err(y_as_float(y, OutType::kBF16, m * n), y_as_float(y_ref, OutType::kBF16, m * n)), 4e-3)
        << "m " << m;
    const auto normed_bits = download<uint16_t>(normed.data(), m * k);
    const auto poison_bits = download<uint16_t>(test::poisoned(m * k * 2).data(), m * k);
    if (m == 1) {
      EXPECT_EQ(normed_bits, poison_bits) << "the fused path leaves x_normed alone";
    } else {
      EXPECT_EQ(normed_bits, download<uint16_t>(normed_ref.data(), m * k)) << "the unfused path norms into x_normed";
    }
  }

  // Only the MMA kernel takes x_norm; a misaligned one is not supported.
  DeviceBuffer buf(1 << 16);
  const __nv_bfloat16* b = buf.as<__nv_bfloat16>();
  SkinnyGemmArgs normed{b, 64, b, 64, buf.data(), OutType::kBF16, 64, 1, 64, 64, 0.0f};
  normed.x_norm = b;
  SkinnyConfig rows;
  rows.kernel = SkinnyConfig::Kernel::kRows;
  EXPECT_THROW(skinny_gemm(nullptr, normed, nullptr, 0, sms, rows), Error);
  normed.x_norm = b + 1;
  EXPECT_FALSE(skinny_gemm_supported(normed));
}

// Autotuning keeps one plan per shape and reports it; a plan built inside a graph capture is the heuristic's.
TEST(Gemm, AutotunedPlansAreReported) {
  KIMIRT_REQUIRE_GPU();
  Problem p(64, 1024, 512, 21);
  DeviceBuffer ws(32 << 20), y = test::poisoned(64 * 1024 * 2);
  GemmLt lt(ws.data(), ws.size(), GemmLtOptions{true, 16, 0});  // tune even this small shape
  lt.linear_bf16(nullptr, p.dx.as<__nv_bfloat16>(), 512, p.dw.as<__nv_bfloat16>(), 512, y.data(), OutType::kBF16, 1024,
                 64, 1024, 512);
  EXPECT_LE(p.error(y_as_float(y, OutType::kBF16, 64 * 1024), 1024), 4e-3);
  EXPECT_EQ(lt.cached_plans(), 1u);
  EXPECT_NE(lt.plans_text().find("m=64 n=1024 k=512"), std::string::npos) << lt.plans_text();
  EXPECT_NE(lt.plans_text().find("autotuned"), std::string::npos) << lt.plans_text();
  GemmLt plain(ws.data(), ws.size(), GemmLtOptions{false, 1, 0});
  DeviceBuffer y2 = test::poisoned(64 * 1024 * 2);
  plain.linear_bf16(nullptr, p.dx.as<__nv_bfloat16>(), 512, p.dw.as<__nv_bfloat16>(), 512, y2.data(), OutType::kBF16,
                    1024, 64, 1024, 512);
  EXPECT_LE(p.error(y_as_float(y2, OutType::kBF16, 64 * 1024), 1024), 4e-3);
  EXPECT_EQ(plain.plans_text().find("autotuned"), std::string::npos) << plain.plans_text();

  // A tuned choice serves the other m of its bucket (100 and 90: both 128): no second tuning, the same results.
  Problem big(100, 1024, 512, 31);
  DeviceBuffer y3 = test::poisoned(100 * 1024 * 2);
  for (const int64_t m : {int64_t{100}, int64_t{90}}) {
    lt.linear_bf16(nullptr, big.dx.as<__nv_bfloat16>(), 512, big.dw.as<__nv_bfloat16>(), 512, y3.data(), OutType::kBF16,
                   1024, m, 1024, 512);
  }
  EXPECT_LE(big.error(y_as_float(y3, OutType::kBF16, 100 * 1024), 1024), 4e-3);
  const std::string text = lt.plans_text();
  EXPECT_NE(text.find("m=100 n=1024 k=512 batch=1 ldx=512 ldw=512 ldy=1024 (x·Wᵀ): algorithm "), std::string::npos)
      << text;
  EXPECT_NE(text.find("m=90 n=1024 k=512 batch=1 ldx=512 ldw=512 ldy=1024 (x·Wᵀ): the algorithm autotuned at m=100"),
            std::string::npos)
      << text;
  // Batch entries whose outputs overlap would race on them: refused, naming the strides.
  try {
    lt.batched_bf16(nullptr, big.dx.as<__nv_bfloat16>(), 512, 0, big.dw.as<__nv_bfloat16>(), 512, 0, true, y3.data(),
                    OutType::kBF16, 1024, 1024, 2, 1024, 512, 2);
    ADD_FAILURE() << "overlapping batch outputs were taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("y's entries must not overlap"), std::string::npos) << e.what();
  }
}

// The plan cache holds at most max_plans plans: a full one is emptied and rebuilt on use, keeping the tuned
// choices (the m after the clear takes the algorithm tuned at m = 100, not a tuning run of its own).
TEST(Gemm, PlanCacheIsBoundedAndKeepsItsTunedChoices) {
  KIMIRT_REQUIRE_GPU();
  DeviceBuffer ws(32 << 20);
  GemmLt lt(ws.data(), ws.size(), GemmLtOptions{true, 16, 0, 3});
  uint32_t seed = 41;
  for (const int64_t m : {100, 90, 80, 70, 100, 65}) {
    const Problem p(m, 1024, 512, seed += 2);
    DeviceBuffer y = test::poisoned(m * 1024 * 2);
    lt.linear_bf16(nullptr, p.dx.as<__nv_bfloat16>(), 512, p.dw.as<__nv_bfloat16>(), 512, y.data(), OutType::kBF16,
                   1024, m, 1024, 512);
    EXPECT_LE(p.error(y_as_float(y, OutType::kBF16, m * 1024), 1024), 4e-3) << "m=" << m;
    EXPECT_LE(lt.cached_plans(), 3u) << "m=" << m;
  }
  // 100, 90, 80, then full: 70 cleared them; 100 and 65 joined it.
  EXPECT_EQ(lt.cached_plans(), 3u);
  const std::string text = lt.plans_text();
  EXPECT_EQ(text.find("m=90 "), std::string::npos) << text;
  EXPECT_NE(text.find("m=65 n=1024 k=512 batch=1 ldx=512 ldw=512 ldy=1024 (x·Wᵀ): the algorithm autotuned at m=100"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("m=70 n=1024 k=512 batch=1 ldx=512 ldw=512 ldy=1024 (x·Wᵀ): the algorithm autotuned at m=100"),
            std::string::npos)
      << text;
  EXPECT_THROW(GemmLt(ws.data(), ws.size(), GemmLtOptions{true, 16, 0, 0}), Error);
}

TEST(Gemm, AccumulateIntoYAndDispatcher) {
  KIMIRT_REQUIRE_GPU();
  const DeviceInfo info = query_device(0);
  const int64_t m = 4, n = 1000, k = 512;
  Problem p(m, n, k, 5);
  DeviceBuffer ws(32 << 20), sws = test::poisoned(8 << 20);
  GemmLt lt(ws.data(), ws.size());
  for (int table_m : {0, 16}) {  // 0: always cuBLASLt, 16: always skinny
    GemmTable table;
    table.set_default(table_m);
    Linear linear(lt, sws.data(), sws.size(), info.sm_count, table);
    EXPECT_EQ(linear.uses_skinny(m, n, k), table_m > 0);
    std::vector<float> y0 = test::random_vec(m * n, 9);
    DeviceBuffer y = upload(y0);
    linear(nullptr, p.dx.as<__nv_bfloat16>(), p.dw.as<__nv_bfloat16>(), y.data(), OutType::kF32, m, n, k, 1.0f);
    std::vector<float> got = download<float>(y.data(), m * n);
    for (size_t i = 0; i < got.size(); ++i) got[i] -= y0[i];
    EXPECT_LE(p.error(got, n), 3e-5) << "beta = 1 with table max m " << table_m;
  }
}

// The MLA prefill's key expansion at K3's 96 heads per GPU, y [keys, 24576] = latent [keys, 576: first 512] ·
// kv_bᵀ, has more than 2^31 outputs from 87382 keys on (a context of 128k keys: 3.2e9): offsets past 2^31 must
// not wrap. The rows from the one holding output 2^31 on are checked whole for outputs left unwritten, and
// outputs there and before it sampled against fp64.
TEST(Gemm, LinearOutputPast2To31Elements) {
  KIMIRT_REQUIRE_GPU();
  const int64_t m = 87552, n = 96 * 256, k = 512, ldx = 576;
  ASSERT_GT(m * n, int64_t{1} << 31);
  std::vector<float> x = test::random_vec(m * ldx, 71), w = test::random_vec(n * k, 72, -0.05f, 0.05f);
  DeviceBuffer dx = upload(test::to_bf16(x)), dw = upload(test::to_bf16(w));  // x and w now bf16-rounded
  DeviceBuffer y = test::poisoned(m * n * 2), ws(32 << 20), sws = test::poisoned(8 << 20);
  GemmLt lt(ws.data(), ws.size());
  Linear linear(lt, sws.data(), sws.size(), query_device(0).sm_count);
  linear(nullptr, dx.as<__nv_bfloat16>(), ldx, dw.as<__nv_bfloat16>(), k, y.data(), OutType::kBF16, n, m, n, k);
  const int64_t first = (int64_t{1} << 31) / n, rows = m - first;
  const std::vector<float> tail = test::from_bf16(download<uint16_t>(y.as<uint16_t>() + first * n, rows * n));
  EXPECT_EQ(std::count_if(tail.begin(), tail.end(), [](float v) { return !std::isfinite(v); }), 0)
      << "outputs of rows " << first << ".." << m - 1 << " left unwritten";
  std::mt19937 rng(73);
  std::vector<float> got, ref;
  for (int s = 0; s < 3000; ++s) {
    // The last output first; then 2500 in the rows past 2^31, 500 before them.
    const int64_t i = s == 0 ? m - 1 : s <= 2500 ? first + rng() % rows : rng() % first;
    const int64_t j = s == 0 ? n - 1 : rng() % n;
    double acc = 0.0;
    for (int64_t kk = 0; kk < k; ++kk) acc += static_cast<double>(x[i * ldx + kk]) * w[j * k + kk];
    ref.push_back(static_cast<float>(acc));
    got.push_back(i >= first ? tail[(i - first) * n + j]
                             : test::from_bf16(download<uint16_t>(y.as<uint16_t>() + i * n + j, 1))[0]);
  }
  EXPECT_EQ(beyond_bf16_step(got, ref), 0);
}

TEST(Gemm, BatchedAbsorptionLayout) {
  KIMIRT_REQUIRE_GPU();
  // y_h[m, 512] = x_h[m, 128] · W_h[128, 512] for 5 heads, the MLA q absorption (W not transposed).
  const int64_t heads = 5, m = 3, kdim = 128, ndim = 512;
  std::vector<float> x = test::random_vec(m * heads * 192, 1), w = test::random_vec(heads * 256 * ndim, 2, -0.1f, 0.1f);
  DeviceBuffer dx = upload(test::to_bf16(x)), dw = upload(test::to_bf16(w));
  DeviceBuffer y = test::poisoned(m * heads * 576 * 2);
  DeviceBuffer ws(16 << 20);
  GemmLt lt(ws.data(), ws.size());
  lt.batched_bf16(nullptr, dx.as<__nv_bfloat16>(), heads * 192, 192, dw.as<__nv_bfloat16>(), ndim, 256 * ndim, false,
                  y.data(), OutType::kBF16, heads * 576, 576, m, ndim, kdim, heads);
  const auto got = test::from_bf16(download<uint16_t>(y.data(), m * heads * 576));
  std::vector<float> g, r;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < ndim; ++j) {
        double acc = 0;
        for (int64_t kk = 0; kk < kdim; ++kk)
          acc += double(x[i * heads * 192 + h * 192 + kk]) * w[(h * 256 + kk) * ndim + j];
        g.push_back(got[i * heads * 576 + h * 576 + j]);
        r.push_back(float(acc));
      }
  EXPECT_LE(test::rel_err(g, r), 4e-3);

  // The same product through the skinny kernel on the transposed layout (mla_transpose_uk), and the W_UV
  // product o_h[m, 128] = ō_h[m, 512] · W_UV_hᵀ through Linear::batched on both paths.
  DeviceBuffer wt(heads * 512 * 128 * 2);
  mla_transpose_uk(nullptr, dw.as<__nv_bfloat16>(), heads, wt.as<__nv_bfloat16>());
  const auto wt_h = test::from_bf16(download<uint16_t>(wt.data(), heads * 512 * 128));
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t n = 0; n < 512; ++n)
      for (int64_t kk = 0; kk < 128; ++kk)
        ASSERT_EQ(wt_h[(h * 512 + n) * 128 + kk], w[(h * 256 + kk) * 512 + n]) << h << "," << n << "," << kk;
  const int sms = query_device(0).sm_count;
  DeviceBuffer sws = test::poisoned(8 << 20);
  std::vector<float> ob = test::random_vec(m * heads * 512, 3);
  DeviceBuffer dob = upload(test::to_bf16(ob));
  for (int table_m : {0, 16}) {
    GemmTable table;
    table.set_default(table_m);
    Linear linear(lt, sws.data(), sws.size(), sms, table);
    DeviceBuffer y2 = test::poisoned(m * heads * 576 * 2);
    linear.batched(nullptr, dx.as<__nv_bfloat16>(), heads * 192, 192, wt.as<__nv_bfloat16>(), 128, 512 * 128, y2.data(),
                   OutType::kBF16, heads * 576, 576, m, 512, 128, heads);
    const auto got2 = test::from_bf16(download<uint16_t>(y2.data(), m * heads * 576));
    std::vector<float> g2;
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < ndim; ++j) g2.push_back(got2[i * heads * 576 + h * 576 + j]);
    EXPECT_LE(test::rel_err(g2, r), 4e-3) << "absorption via Linear::batched, table max m " << table_m;

    DeviceBuffer o = test::poisoned(m * heads * 128 * 2);
    linear.batched(nullptr, dob.as<__nv_bfloat16>(), heads * 512, 512, dw.as<__nv_bfloat16>() + 128 * 512, 512,
                   256 * 512, o.data(), OutType::kBF16, heads * 128, 128, m, 128, 512, heads);
    const auto og = test::from_bf16(download<uint16_t>(o.data(), m * heads * 128));
    std::vector<float> gg, rr;
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < 128; ++j) {
          double acc = 0;
          for (int64_t kk = 0; kk < 512; ++kk)
            acc += double(ob[i * heads * 512 + h * 512 + kk]) * w[(h * 256 + 128 + j) * 512 + kk];
          gg.push_back(og[i * heads * 128 + h * 128 + j]);
          rr.push_back(float(acc));
        }
    EXPECT_LE(test::rel_err(gg, rr), 4e-3) << "W_UV via Linear::batched, table max m " << table_m;

    // With the output gate: the same bits as the product above followed by sigmoid_gate_mul, on both paths.
    std::vector<float> gv = test::random_vec(m * heads * 128, 5, -4, 4);
    DeviceBuffer gate = upload(test::to_bf16(gv));
    DeviceBuffer o_gated = test::poisoned(m * heads * 128 * 2);
    linear.batched(nullptr, dob.as<__nv_bfloat16>(), heads * 512, 512, dw.as<__nv_bfloat16>() + 128 * 512, 512,
                   256 * 512, o_gated.data(), OutType::kBF16, heads * 128, 128, m, 128, 512, heads,
                   gate.as<__nv_bfloat16>());
    sigmoid_gate_mul(nullptr, o.as<__nv_bfloat16>(), heads * 128, gate.as<__nv_bfloat16>(), heads * 128, m,
                     heads * 128);
    EXPECT_EQ(download<uint16_t>(o_gated.data(), m * heads * 128), download<uint16_t>(o.data(), m * heads * 128))
        << "gated W_UV via Linear::batched, table max m " << table_m;
    // A gate needs each token's outputs contiguous; the error names the strides.
    try {
      linear.batched(nullptr, dob.as<__nv_bfloat16>(), heads * 512, 512, dw.as<__nv_bfloat16>() + 128 * 512, 512,
                     256 * 512, o_gated.data(), OutType::kBF16, heads * 256, 256, m, 128, 512, heads,
                     gate.as<__nv_bfloat16>());
      ADD_FAILURE() << "a gate with stride_y 256 != n 128 was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("stride_y 256 = n 128"), std::string::npos) << e.what();
    }
  }
}

// E4M3 operands quantized on the device from a bf16 Problem, and the Problem of their dequantized values
// (the exact reference of an FP8 block GEMM up to fp32 summation and the bf16 store).
struct Fp8Problem {
  Problem p, deq;
  int64_t mp;
  DeviceBuffer xq, xs, wq, wsc;
  std::vector<uint8_t> xq_h, wq_h;
  std::vector<float> xs_h, ws_h;
  Fp8Problem(int64_t m, int64_t n, int64_t k, uint32_t seed) : p(m, n, k, seed), deq(0, 0, 0, 0), mp(fp8_pad_m(m)) {
    // Each 128 x 128 weight block scaled by its own power of two (exact in bf16), so that the blocks' scales
    // differ: with one uniform range they all come out the same, and a wrong scale index would pass.
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < k; ++j)
        p.w[i * k + j] *= std::ldexp(1.0f, -static_cast<int>((i / 128 * 3 + j / 128) % 7));
    p.dw = upload(test::to_bf16(p.w));
    // The activations' (row, 128-group) scales too: U[-1, 1) gives every group an amax near 1, so that scales
    // read at a transposed index ([row][group] for [group][row]) would differ by about 1% only.
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < k; ++j) p.x[i * k + j] *= std::ldexp(1.0f, -static_cast<int>((i + 3 * (j / 128)) % 5));
    p.dx = upload(test::to_bf16(p.x));
    xq = test::poisoned(mp * k), xs = test::poisoned(fp8_x_scale_count(m, k) * 4);
    wq = test::poisoned(n * k), wsc = test::poisoned(fp8_w_scale_count(n, k) * 4);
    quantize_fp8_act(nullptr, p.dx.as<__nv_bfloat16>(), k, m, k, xq.as<uint8_t>(), xs.as<float>());
    quantize_fp8_weight(nullptr, p.dw.as<__nv_bfloat16>(), n, k, wq.as<uint8_t>(), wsc.as<float>());
    xq_h = download<uint8_t>(xq.data(), mp * k);
    xs_h = download<float>(xs.data(), fp8_x_scale_count(m, k));
    wq_h = download<uint8_t>(wq.data(), n * k);
    ws_h = download<float>(wsc.data(), fp8_w_scale_count(n, k));
    deq.m = m, deq.n = n, deq.k = k;
    deq.x.resize(m * k);
    deq.w.resize(n * k);
    const int64_t sc = fp8_w_scale_cols(k);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < k; ++j) deq.x[i * k + j] = e4m3_to_f32(xq_h[i * k + j]) * xs_h[(j / 128) * mp + i];
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < k; ++j) deq.w[i * k + j] = e4m3_to_f32(wq_h[i * k + j]) * ws_h[(i / 128) * sc + j / 128];
  }
};

TEST(Gemm, Fp8BlockScaleAgainstDequantizedReference) {
  KIMIRT_REQUIRE_GPU();
  DeviceBuffer ws(64 << 20);
  GemmLt lt(ws.data(), ws.size());
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{5, 576, 7168}, {64, 2048, 1536}, {4, 256, 128}}) {
    const Fp8Problem f(m, n, k, 21);
    const Problem& p = f.p;
    const int64_t mp = f.mp;
    // The quantizers match a host quantizer exactly.
    ASSERT_EQ(test::act_quant_mismatch(p.x, m, k, mp, f.xq_h, f.xs_h), "") << "activations";
    // And the weight quantizer: a scale per 128 x 128 block (they differ, see Fp8Problem), codes w / scale.
    const int64_t sc = fp8_w_scale_cols(k);
    for (int64_t bi = 0; bi < (n + 127) / 128; ++bi)
      for (int64_t bk = 0; bk < k / 128; ++bk) {
        float amax = 0;
        for (int64_t i = bi * 128; i < std::min(n, bi * 128 + 128); ++i)
          for (int64_t j = bk * 128; j < bk * 128 + 128; ++j) amax = std::max(amax, std::fabs(p.w[i * k + j]));
        const float s = amax > 0 ? amax / 448.0f : 1.0f;
        ASSERT_EQ(f.ws_h[bi * sc + bk], s) << "weight scale of block " << bi << "," << bk;
        for (int64_t i = bi * 128; i < std::min(n, bi * 128 + 128); ++i)
          for (int64_t j = bk * 128; j < bk * 128 + 128; ++j)
            ASSERT_EQ(f.wq_h[i * k + j], f32_to_e4m3(p.w[i * k + j] / s, Overflow::kSaturate))
                << "weight code " << i << "," << j;
      }
    // The scale rows' padding columns (fp8_w_scale_cols rounds the K blocks up to 4): 1, as quantize_fp8.h says.
    for (int64_t bi = 0; bi < (n + 127) / 128; ++bi)
      for (int64_t bk = k / 128; bk < sc; ++bk)
        ASSERT_EQ(f.ws_h[bi * sc + bk], 1.0f) << "padding scale " << bi << "," << bk;
    DeviceBuffer y = test::poisoned(m * n * 2);
    DeviceBuffer dscratch(fp8_d_scratch_bytes(m, n) + 16);
    lt.linear_fp8(nullptr, f.xq.as<uint8_t>(), f.xs.as<float>(), f.wq.as<uint8_t>(), f.wsc.as<float>(),
                  y.as<__nv_bfloat16>(), n, m, n, k, dscratch.data(), dscratch.size());
    EXPECT_LE(f.deq.error(test::from_bf16(download<uint16_t>(y.data(), m * n)), n), 4e-3)
        << "FP8 block GEMM " << test::shape({m, n, k});
    // And the quantized product stays near the bf16 product: E4M3's 3 mantissa bits give ~5% rms per term.
    EXPECT_LE(p.error(test::from_bf16(download<uint16_t>(y.data(), m * n)), n), 0.1);
  }
}

// The FP8 block-scale GEMM's plans under the same bound: a plan rebuilt after a clear takes the choice tuned for its
// bucket (m = 64 here), not a tuning run of its own.
TEST(Gemm, Fp8PlanCacheIsBoundedAndKeepsItsTunedChoices) {
  KIMIRT_REQUIRE_GPU();
  DeviceBuffer ws(64 << 20);
  GemmLt lt(ws.data(), ws.size(), GemmLtOptions{true, 16, 0, 2});
  uint32_t seed = 61;
  bool tuned = false;  // whether the heuristic offered more than one algorithm to time
  for (const int64_t m : {64, 60, 56, 64}) {
    const Fp8Problem f(m, 256, 512, seed += 2);
    DeviceBuffer y = test::poisoned(m * 256 * 2);
    lt.linear_fp8(nullptr, f.xq.as<uint8_t>(), f.xs.as<float>(), f.wq.as<uint8_t>(), f.wsc.as<float>(),
                  y.as<__nv_bfloat16>(), 256, m, 256, 512, nullptr, 0);
    EXPECT_LE(f.deq.error(test::from_bf16(download<uint16_t>(y.data(), m * 256)), 256), 4e-3) << "m=" << m;
    EXPECT_LE(lt.cached_plans(), 2u) << "m=" << m;
    if (seed == 63) tuned = lt.plans_text().find("(autotuned, ") != std::string::npos;
  }
  const std::string text = lt.plans_text();
  if (!tuned) {
    // One candidate: nothing was timed, so there is no choice to keep (the bound still held above).
    EXPECT_NE(text.find("algorithm 0 of 1"), std::string::npos) << text;
    std::printf("note: the heuristic offers one FP8 block-scale algorithm at this shape; no tuning to keep\n");
    return;
  }
  // 64 (tuned), 60, then full: 56 cleared them; 64 came back as a plan of its own.
  EXPECT_EQ(lt.cached_plans(), 2u) << text;
  EXPECT_EQ(text.find("m=60 "), std::string::npos) << text;
  EXPECT_NE(text.find("FP8 block-scale GEMM m=64 n=256 k=512 ldy=256: the algorithm autotuned at m=64"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("(autotuned, "), std::string::npos) << "a plan was tuned again after the clear:\n" << text;
}

// Groups whose largest magnitude is so small that 1/scale overflows (below about 1.3e-36: bf16 holds such
// values, normal and subnormal) quantize as the host does, v / scale, instead of to NaN codes; a zero group
// keeps scale 1. Row 2 holds two groups a little larger, each with a quotient v / scale on an e4m3 rounding tie
// or one float step above one, which the refined product (div_by) rounds to the other side of the tie when the
// scale is that small (fp8_group.cuh).
TEST(Gemm, Fp8ActQuantizerTinyGroups) {
  KIMIRT_REQUIRE_GPU();
  const int64_t m = 3, k = 384;
  std::vector<float> x = test::random_vec(m * k, 71, -1, 1);
  for (int64_t j = 0; j < 128; ++j) {
    x[j] *= 1e-37f;         // row 0, group 0: normal bf16 values, amax/448 below 2^-126
    x[128 + j] *= 1e-39f;   // row 0, group 1: subnormal
    x[k + 256 + j] = 0.0f;  // row 1, group 2: zeros
  }
  for (int g = 0; g < 2; ++g) {
    float* group = x.data() + 2 * k + g * 128;
    const float amax = g == 0 ? std::ldexp(23.0f, -122) : std::ldexp(31.0f, -121);
    const float tie = g == 0 ? std::ldexp(69.0f, -133) : std::ldexp(93.0f, -130);
    for (int64_t j = 0; j < 128; ++j) group[j] = j == 0 ? amax : (j % 2 ? tie : -tie);
  }
  std::vector<uint16_t> x16 = test::to_bf16(x);  // rounds x in place: the host sees the device's inputs
  const int64_t mp = fp8_pad_m(m);
  DeviceBuffer dx = upload(x16), xq = test::poisoned(mp * k), xs = test::poisoned(fp8_x_scale_count(m, k) * 4);
  quantize_fp8_act(nullptr, dx.as<__nv_bfloat16>(), k, m, k, xq.as<uint8_t>(), xs.as<float>());
  const auto q = download<uint8_t>(xq.data(), mp * k);
  const auto sc = download<float>(xs.data(), fp8_x_scale_count(m, k));
  EXPECT_EQ(test::act_quant_mismatch(x, m, k, mp, q, sc), "");
}

// Our kernel (fp8_block_gemm.h) on the same operands, alone and in clusters of two (activation tiles
// multicast), one or two K blocks in flight: bf16 output over fp32 accumulation → ≤ 4e-3 against the
// dequantized product in norm, and every checked output within one bf16 step (bad_outputs); on every
// output for the small shapes (tile edges, N and M tails, more than one group of 8 row blocks) and on samples for a K3
// shape. Nothing is written outside y[m, n]: the padding columns of ldy > n and the rows from m on (up to m_pad and one
// more) keep their poison. max_blocks below the tile count makes each block loop over tiles, so the ring's stages wrap
// across tiles.
TEST(Gemm, Fp8BlockKernelAgainstDequantizedReference) {
  KIMIRT_REQUIRE_GPU();
  const DeviceInfo info = query_device(0);
  struct Case {
    int64_t m, n, k, ldy;
    int max_blocks;
  };
  for (const Case c :
       {Case{5, 576, 7168, 576, 132}, Case{4, 256, 128, 264, 132}, Case{300, 1000, 1536, 1000, 3},
        Case{257, 384, 640, 392, 2}, Case{130, 136, 1152, 136, 1}, Case{200, 512, 384, 520, 4},
        Case{70, 104, 256, 112, 132}, Case{1300, 256, 256, 256, 5}, Case{1024, 1536, 7168, 1536, info.sm_count}}) {
    const Fp8Problem f(c.m, c.n, c.k, static_cast<uint32_t>(c.m + c.n));
    const int64_t rows = fp8_pad_m(c.m) + 1;  // y's buffer: m rows, then rows that must stay untouched
    for (const Fp8BlockGemmConfig cfg :
         {Fp8BlockGemmConfig{1, 1}, Fp8BlockGemmConfig{1, 2}, Fp8BlockGemmConfig{2, 1}, Fp8BlockGemmConfig{2, 2}}) {
      const int cluster = cfg.cluster;
      if (cluster == 2 && (c.n + 127) / 128 % 2 != 0) continue;
      const int max_blocks = std::max(c.max_blocks, cluster);
      DeviceBuffer y = test::poisoned(rows * c.ldy * 2);
      const auto before = download<uint16_t>(y.data(), rows * c.ldy);
      fp8_block_gemm(nullptr, f.xq.as<uint8_t>(), f.xs.as<float>(), f.wq.as<uint8_t>(), f.wsc.as<float>(),
                     y.as<__nv_bfloat16>(), c.ldy, c.m, c.n, c.k, max_blocks, cfg);
      const auto got = download<uint16_t>(y.data(), rows * c.ldy);
      const int64_t samples = c.m * c.n * c.k <= 600'000'000 ? c.m * c.n : 2048;
      const std::string what = test::shape({c.m, c.n, c.k}) + " ldy " + std::to_string(c.ldy) + " max_blocks " +
                               std::to_string(max_blocks) + " cluster " + std::to_string(cluster) + " in flight " +
                               std::to_string(cfg.in_flight);
      const std::vector<float> yf = test::from_bf16(got);
      EXPECT_LE(f.deq.error(yf, c.ldy, samples), 4e-3) << "fp8_block_gemm " << what;
      EXPECT_EQ(f.deq.bad_outputs(yf, c.ldy, samples), 0) << "fp8_block_gemm " << what;
      int64_t touched = 0;
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = i < c.m ? c.n : 0; j < c.ldy; ++j) touched += got[i * c.ldy + j] != before[i * c.ldy + j];
      EXPECT_EQ(touched, 0) << "written outside y[m, n], " << what;
    }
  }
}

// Linear::fp8 runs the path the table names, and our kernel where cuBLASLt cannot (m % 4 != 0 without
// scratch): every path's output within one bf16 step of the dequantized product.
// Linear::fp8 runs the table's path, or ours where cuBLASLt cannot take the call (m = 6 without scratch);
// which one ran is told by the GemmLt: a fresh one holds a plan only after cuBLASLt ran. A row stride that is
// not a multiple of 8 is refused by both paths with an error naming ldy.
TEST(Gemm, Fp8LinearTakesTheTablesPath) {
  KIMIRT_REQUIRE_GPU();
  const DeviceInfo info = query_device(0);
  DeviceBuffer ws(64 << 20), sws(16 << 20);
  // n = 136 (not a multiple of 16): cuBLASLt cannot take it, so ours runs whatever the table says.
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{64, 512, 1536}, {6, 384, 1024}, {64, 136, 1024}}) {
    const Fp8Problem f(m, n, k, 31);
    for (Fp8Path path : {Fp8Path::kOurs, Fp8Path::kCublasLt}) {
      GemmTable table;
      table.set_fp8(n, k, m, path);
      ASSERT_EQ(table.fp8_path(n, k, m), path);
      for (const bool scratch : {true, false}) {
        for (const int64_t ldy : {n, n + 8, n + 4}) {
          GemmLt lt(ws.data(), ws.size());
          Linear linear(lt, sws.data(), sws.size(), info.sm_count, table);
          DeviceBuffer y = test::poisoned(m * ldy * 2);
          DeviceBuffer d(fp8_d_scratch_bytes(m, n) + 16);
          const uint64_t d_bytes = scratch ? d.size() : 0;
          const std::string what = "Linear::fp8 " + test::shape({m, n, k}) + " ldy " + std::to_string(ldy) + " path " +
                                   fp8_path_name(path) + " scratch " + std::to_string(scratch);
          auto run = [&] {
            linear.fp8(nullptr, f.xq.as<uint8_t>(), f.xs.as<float>(), f.wq.as<uint8_t>(), f.wsc.as<float>(),
                       y.as<__nv_bfloat16>(), ldy, m, n, k, scratch ? d.data() : nullptr, d_bytes);
          };
          if (ldy % 8 != 0) {
            try {
              run();
              ADD_FAILURE() << what << " was accepted";
            } catch (const Error& e) {
              EXPECT_NE(std::string(e.what()).find("ldy " + std::to_string(ldy)), std::string::npos) << e.what();
            }
            continue;
          }
          run();
          const bool want_lt = path == Fp8Path::kCublasLt && d_bytes >= fp8_d_scratch_bytes(m, n) && n % 16 == 0;
          EXPECT_EQ(lt.cached_plans() > 0, want_lt) << what;
          EXPECT_EQ(f.deq.bad_outputs(test::from_bf16(download<uint16_t>(y.data(), m * ldy)), ldy, m * n), 0) << what;
        }
      }
    }
  }
}

TEST(Gemm, Fp8BlockKernelBadArgumentsAreErrors) {
  KIMIRT_REQUIRE_GPU();
  DeviceBuffer buf(1 << 20);
  auto* y = buf.as<__nv_bfloat16>();
  const auto* q = buf.as<uint8_t>();
  const auto* s = buf.as<float>();
  const auto message = [&](int64_t m, int64_t n, int64_t k, int64_t ldy, const uint8_t* xq,
                           Fp8BlockGemmConfig config = {1, 0}, int max_blocks = 132) {
    try {
      fp8_block_gemm(nullptr, xq, s, q, s, y, ldy, m, n, k, max_blocks, config);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message(4, 64, 100, 64, q).find("k 100 must be a positive multiple of 128"), std::string::npos);
  EXPECT_NE(message(4, 64, 128, 60, q).find("ldy 60 must be >= n"), std::string::npos);
  EXPECT_NE(message(4, 64, 128, 68, q).find("ldy 68 must be >= n and a multiple of 8"), std::string::npos);
  EXPECT_NE(message(4, 64, 128, 64, q + 1).find("xq must be 16-byte aligned"), std::string::npos);
  EXPECT_NE(message(4, 384, 128, 384, q, {2, 0})
                .find("cluster 2 must be 1, or 2 with an even number of 128-column blocks (3)"),
            std::string::npos);
  EXPECT_NE(message(4, 256, 128, 256, q, {3, 0}).find("cluster 3 must be 1"), std::string::npos);
  // y's tensor stores write whole 16-byte chunks, so n must be a multiple of 8.
  EXPECT_NE(message(4, 100, 128, 104, q).find("n 100 must be a positive multiple of 8"), std::string::npos);
  EXPECT_NE(message(4, 64, 128, 64, q, {1, 3}).find("in_flight 3 must be 1 or 2"), std::string::npos);
  EXPECT_NE(message(4, 64, 128, 64, nullptr).find("xq is null"), std::string::npos);
  EXPECT_NE(message(int64_t{1} << 31, 64, 128, 64, q).find("m 2147483648 outside 0..2^30"), std::string::npos);
  EXPECT_NE(message(4, 64, int64_t{1} << 31, 64, q).find("k 2147483648 must be a positive multiple of 128"),
            std::string::npos);
  EXPECT_NE(message(4, 256, 128, 256, q, {2, 0}, 1).find("max_blocks 1 must be at least the cluster 2"),
            std::string::npos);
  EXPECT_EQ(message(0, 64, 128, 64, q), "accepted");                       // nothing to do
  EXPECT_NE(message(0, 64, 100, 64, q).find("k 100"), std::string::npos);  // but checked
  EXPECT_EQ(message(0, 64, 128, 64, nullptr), "accepted");                 // no operand is read
}

TEST(Gemm, BadArgumentsAreErrors) {
  KIMIRT_REQUIRE_GPU();
  DeviceBuffer ws(1 << 20), buf(1 << 20);
  GemmLt lt(ws.data(), ws.size());
  auto* p = buf.as<__nv_bfloat16>();
  EXPECT_THROW(lt.linear_bf16(nullptr, p, 10, p, 64, p, OutType::kBF16, 64, 2, 64, 64), Error);  // ldx < k
  EXPECT_THROW(lt.linear_fp8(nullptr, buf.as<uint8_t>(), buf.as<float>(), buf.as<uint8_t>(), buf.as<float>(), p, 64, 4,
                             64, 100, nullptr, 0),
               Error);                                                               // k not a multiple of 128
  const SkinnyGemmArgs a{p + 1, 64, p, 64, p, OutType::kBF16, 64, 2, 64, 64, 0.0f};  // misaligned x
  EXPECT_FALSE(skinny_gemm_supported(a));
  EXPECT_THROW(skinny_gemm(nullptr, a, nullptr, 0, 132), Error);
  // The kernels index rows and K in 32 bits: n and k below 2^30, and n times the rows kernel's K splits too.
  const int64_t big = int64_t{1} << 30;
  EXPECT_FALSE(skinny_gemm_supported({p, 64, p, 64, p, OutType::kBF16, big, 1, big, 64, 0.0f}));
  EXPECT_TRUE(skinny_gemm_supported({p, 64, p, 64, p, OutType::kBF16, big - 8, 1, big - 8, 64, 0.0f}));
  EXPECT_FALSE(skinny_gemm_supported({p, big, p, big, p, OutType::kBF16, 64, 1, 64, big, 0.0f}));
  EXPECT_TRUE(skinny_gemm_supported({p, big - 32, p, big - 32, p, OutType::kBF16, 64, 1, 64, big - 32, 0.0f}));
  SkinnyConfig split8;
  split8.kernel = SkinnyConfig::Kernel::kRows;
  split8.rows_per_warp = 1;
  split8.splits = 8;
  try {
    skinny_gemm(nullptr, {p, 64, p, 64, p, OutType::kBF16, big / 8, 1, big / 8, 64, 0.0f}, nullptr, 0, 132, split8);
    ADD_FAILURE() << "n * splits = 2^30 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n 134217728, 1 rows, 8 splits"), std::string::npos) << e.what();
  }
}

TEST(GemmTable, KernelConfigsRoundTrip) {
  const GemmTable b = GemmTable::builtin();
  ASSERT_TRUE(b.config(12288, 7168).has_value());
  EXPECT_EQ(skinny_config_name(*b.config(12288, 7168)), "rows2x1");
  EXPECT_EQ(skinny_config_name(*b.config(18432, 1536)), "mma");
  EXPECT_FALSE(b.config(100, 200).has_value());
  EXPECT_EQ(b.fp8_path(18432, 1536, 4096), Fp8Path::kOurs);
  EXPECT_EQ(b.fp8_path(7168, 7168, 4096), Fp8Path::kCublasLt);
  EXPECT_EQ(b.fp8_path(18432, 1536, 16), Fp8Path::kCublasLt);  // the builtin rows hold several M
  EXPECT_EQ(b.fp8_path(100, 256, 4096), Fp8Path::kOurs);       // not listed
  const auto path = std::filesystem::path(::testing::TempDir()) / "kimirt_gemm_table_configs.txt";
  std::ofstream(path) << b.to_text();
  const GemmTable back = GemmTable::load(path.string());
  EXPECT_EQ(back.to_text(), b.to_text());
  EXPECT_THROW(parse_skinny_config("rows3x1"), Error);
  EXPECT_THROW(parse_skinny_config("rows1x3"), Error);
  // Exactly one digit each: no signs, leading zeros or overflowing numbers (sscanf's %d took them).
  for (const char* bad : {"rows+1x+2", "rows01x001", "rows99999999999x1", "rows1x2 ", "rows1x"}) {
    EXPECT_THROW(parse_skinny_config(bad), Error) << bad;
  }
  EXPECT_EQ(skinny_config_name(parse_skinny_config("rows2x8")), "rows2x8");
  std::ofstream(path) << "12288 7168 1 rows9x9\n";
  try {
    GemmTable::load(path.string());
    ADD_FAILURE() << "bad config accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(":1"), std::string::npos) << e.what();
  }
  for (const auto& [line, expected] :
       {std::pair<std::string, std::string>{"# x\nfp8 7168 7168 fast\n", ":2: FP8 GEMM path \"fast\": expected"},
        {"fp8 7168\n", ":1: expected \"fp8 n k m ours|cublaslt\", got 1 field(s) after fp8"},
        {"fp8 7168 7168 64 ours extra\n", ":1: unexpected \"extra\" after the path"},
        {"fp8 7168 7168 ours extra\n", ":1: m \"ours\" must be a positive integer"},
        {"fp8 7168 7168 0 ours\n", ":1: m \"0\" must be a positive integer"},
        {"fp8 7168 7168 64x ours\n", ":1: m \"64x\" must be a positive integer"},
        {"fp8 7168 7168 +64 ours\n", ":1: m \"+64\" must be a positive integer"},
        {"fp8 7168 7168 64 ours\nfp8 7168 7168 64 cublaslt\n", ":2: a second row for fp8 7168 7168 at M = 64 (line 1)"},
        {"fp8 7168 7168 ours\nfp8 7168 7168 4096 ours\n", ":2: a second row for fp8 7168 7168 at M = 4096 (line 1)"},
        {"fp8 7168 7168 64 fast\n", ":1: FP8 GEMM path \"fast\": expected"},
        {"fp8 -5 7168 ours\n", ":1: n \"-5\" and k \"7168\" must be positive integers"},
        {"fp8 +7168 7168 ours\n", ":1: n \"+7168\" and k \"7168\" must be positive integers"},
        {"7168 7168x 4\n", ":1: n \"7168\" and k \"7168x\" must be positive integers"},
        {"7168 7168 +4\n", ":1: max_skinny_m \"+4\" is not an integer in [0, 16]"},
        {"7168 7168 17\n", ":1: max_skinny_m \"17\" is not an integer in [0, 16]"},
        {"* * -1\n", ":1: max_skinny_m \"-1\" is not an integer in [0, 16]"},
        {"7168 7168 4\n7168 7168 12\n", ":2: a second row for 7168 7168 (line 1)"},
        {"* * 4\n# x\n* * 8\n", ":3: a second row for * * (line 1)"}}) {
    std::ofstream(path) << line;
    try {
      GemmTable::load(path.string());
      ADD_FAILURE() << "accepted: " << line;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  }
}

// A call takes the FP8 row of its shape measured at the nearest M by ratio (below the smallest measured M the
// smallest's, above the largest the largest's; a tie the larger M's); a row without an M, from a table written
// before rows had one, was measured at 4096.
TEST(GemmTable, Fp8RowsByNearestMeasuredM) {
  GemmTable t;
  t.set_fp8(7168, 7168, 64, Fp8Path::kCublasLt);
  t.set_fp8(7168, 7168, 1024, Fp8Path::kOurs);
  t.set_fp8(7168, 7168, 4096, Fp8Path::kCublasLt);
  for (const auto& [m, want] : std::initializer_list<std::pair<int64_t, Fp8Path>>{{1, Fp8Path::kCublasLt},
                                                                                  {64, Fp8Path::kCublasLt},
                                                                                  {255, Fp8Path::kCublasLt},
                                                                                  {256, Fp8Path::kOurs},  // a tie
                                                                                  {1024, Fp8Path::kOurs},
                                                                                  {2047, Fp8Path::kOurs},
                                                                                  {2048, Fp8Path::kCublasLt},
                                                                                  {1 << 20, Fp8Path::kCublasLt}}) {
    EXPECT_EQ(t.fp8_path(7168, 7168, m), want) << "m " << m;
  }
  EXPECT_EQ(t.fp8_path(7168, 7169, 64), Fp8Path::kOurs);  // another shape: not listed
  const auto path = std::filesystem::path(::testing::TempDir()) / "kimirt_gemm_table_fp8.txt";
  std::ofstream(path) << t.to_text() << "fp8 18432 1536 cublaslt\n";
  const GemmTable back = GemmTable::load(path.string());
  EXPECT_EQ(back.fp8_path(7168, 7168, 300), Fp8Path::kOurs);
  EXPECT_EQ(back.fp8_path(18432, 1536, 8), Fp8Path::kCublasLt);
  EXPECT_NE(back.to_text().find("fp8 18432 1536 4096 cublaslt\n"), std::string::npos) << back.to_text();
  EXPECT_NE(back.to_text().find("fp8 7168 7168 1024 ours\n"), std::string::npos) << back.to_text();
}

TEST(GemmTable, LoadsAndRejectsBadLines) {
  const std::string path = ::testing::TempDir() + "/gemm_table.txt";
  {
    FILE* f = fopen(path.c_str(), "w");
    fputs("# measured\n* * 4\n7168 7168 12\n", f);
    fclose(f);
  }
  const GemmTable t = GemmTable::load(path);
  EXPECT_EQ(t.max_skinny_m(7168, 7168), 12);
  EXPECT_EQ(t.max_skinny_m(1, 2), 4);
  {
    FILE* f = fopen(path.c_str(), "w");
    fputs("7168 7168 99\n", f);
    fclose(f);
  }
  EXPECT_THROW(GemmTable::load(path), Error);
}

}  // namespace
}  // namespace kimirt::cuda
