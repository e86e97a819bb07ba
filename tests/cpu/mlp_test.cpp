#include "kimirt/cpu/mlp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kimirt/base/error.h"
#include "test_util.h"

namespace kimirt::cpu {
namespace {

using testing::random_normal;
using testing::ref_matmul;
using testing::ref_sigmoid;
using testing::rel_error;

TEST(CpuGatedMlp, SituAndSiluMatchDoubleReference) {
  const int64_t rows = 6, in = 24, inter = 40;
  const auto x = random_normal(rows * in, 11);
  const auto wg = random_normal(inter * in, 12, 0.3f);
  const auto wu = random_normal(inter * in, 13, 0.3f);
  const auto wd = random_normal(in * inter, 14, 0.2f);
  const auto g = ref_matmul(x, wg, rows, inter, in);
  const auto u = ref_matmul(x, wu, rows, inter, in);
  for (const bool situ : {false, true}) {
    std::vector<double> a(g.size());
    for (size_t i = 0; i < a.size(); ++i) {
      a[i] = situ ? 4.0 * std::tanh(g[i] / 4.0) * ref_sigmoid(g[i]) * 25.0 * std::tanh(u[i] / 25.0)
                  : g[i] * ref_sigmoid(g[i]) * u[i];
    }
    const auto ref = ref_matmul(a, wd, rows, in, inter);
    std::vector<float> out(static_cast<size_t>(rows * in));
    const auto act = situ ? GluActivation::situ(4.0f, 25.0f) : GluActivation::silu();
    gated_mlp({in, inter}, {wg.data(), wu.data(), wd.data()}, act, x.data(), rows, out.data());
    EXPECT_LE(rel_error(out, ref), 2e-6) << (situ ? "situ" : "silu");
  }
}

TEST(CpuGatedMlp, MissingWeightIsAnError) {
  std::vector<float> x(4), out(4);
  EXPECT_THROW(gated_mlp({2, 2}, {x.data(), nullptr, x.data()}, GluActivation::silu(), x.data(), 2, out.data()), Error);
}

}  // namespace
}  // namespace kimirt::cpu
