#include "kimirt/cpu/activation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kimirt/base/error.h"
#include "test_util.h"

namespace kimirt::cpu {
namespace {

using testing::ref_sigmoid;
using testing::ref_silu;

double ref_situ(double g, double u, double b1, std::optional<double> b2) {
  const double gp = b1 * std::tanh(g / b1) * ref_sigmoid(g);
  const double up = b2 ? *b2 * std::tanh(u / *b2) : u;
  return gp * up;
}

TEST(CpuActivation, SigmoidIsStableAtExtremes) {
  EXPECT_EQ(sigmoid(0.0f), 0.5f);
  EXPECT_EQ(sigmoid(200.0f), 1.0f);
  EXPECT_EQ(sigmoid(-200.0f), 0.0f);
  EXPECT_FALSE(std::isnan(sigmoid(-std::numeric_limits<float>::infinity())));
  EXPECT_NEAR(sigmoid(-30.0f), ref_sigmoid(-30.0), 1e-19);
}

TEST(CpuActivation, SoftplusFollowsPytorchThreshold) {
  EXPECT_NEAR(softplus(0.0f), std::log(2.0), 1e-7);
  EXPECT_EQ(softplus(25.0f), 25.0f);
  EXPECT_NEAR(softplus(-30.0f), std::exp(-30.0), 1e-18);
}

TEST(CpuActivation, SiluGlu) {
  const std::vector<float> g = {-3.0f, 0.0f, 1.5f};
  const std::vector<float> u = {2.0f, 5.0f, -4.0f};
  std::vector<float> out(3);
  glu(GluActivation::silu(), g.data(), u.data(), out.data(), 3);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(out[i], ref_silu(g[i]) * u[i], 1e-6);
}

TEST(CpuActivation, SituMatchesFormulaAcrossEdgeValues) {
  const auto act = GluActivation::situ(4.0f, 25.0f);
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> values = {-inf,   -1e6f, -100.0f, -25.0f, -4.0f,  -1.0f, -1e-30f, 0.0f,
                                     1e-30f, 1.0f,  4.0f,    25.0f,  100.0f, 1e6f,  inf};
  for (float g : values) {
    for (float u : values) {
      const float got = glu(act, g, u);
      const double want = ref_situ(g, u, 4.0, 25.0);
      ASSERT_FALSE(std::isnan(got)) << "g=" << g << " u=" << u;
      EXPECT_NEAR(got, want, 1e-6 * std::max(1.0, std::abs(want))) << "g=" << g << " u=" << u;
      EXPECT_LE(std::abs(got), 100.0f);  // |out| ≤ β₁β₂
    }
  }
  // Saturation: large positive gate and up give β₁·β₂.
  EXPECT_NEAR(glu(act, 1e6f, 1e6f), 100.0f, 1e-4);
}

TEST(CpuActivation, SituWithoutLinearBetaPassesUpThrough) {
  const auto act = GluActivation::situ(4.0f, std::nullopt);
  EXPECT_NEAR(glu(act, 2.0f, 1000.0f), ref_situ(2.0, 1000.0, 4.0, std::nullopt), 1e-3);
  EXPECT_NEAR(glu(act, -0.5f, -3.0f), ref_situ(-0.5, -3.0, 4.0, std::nullopt), 1e-6);
}

TEST(CpuActivation, InvalidBetaIsAnErrorNamingTheField) {
  EXPECT_THROW(validate(GluActivation::situ(0.0f, 25.0f)), Error);
  EXPECT_THROW(validate(GluActivation::situ(4.0f, -1.0f)), Error);
  try {
    validate(GluActivation::situ(std::numeric_limits<float>::quiet_NaN(), 25.0f));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("activation_situ_beta"), std::string::npos);
  }
  EXPECT_NO_THROW(validate(GluActivation::situ(4.0f, 25.0f)));
}

}  // namespace
}  // namespace kimirt::cpu
