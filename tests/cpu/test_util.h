// Helpers of the cpu tests: seeded random data, relative error, and naive double-precision loops that
// serve as independent references (they never call the code under test).
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace kimirt::cpu::testing {

inline std::vector<float> random_normal(int64_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

inline std::vector<float> random_uniform(int64_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

// ‖out − ref‖ / ‖ref‖.
template <typename A, typename B>
double rel_error(const std::vector<A>& out, const std::vector<B>& ref) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(out[i]) - static_cast<double>(ref[i]);
    num += d * d;
    den += static_cast<double>(ref[i]) * static_cast<double>(ref[i]);
  }
  return std::sqrt(num / den);
}

inline std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// y[m, n] = x[m, k] · w[n, k]ᵀ in double.
template <typename X, typename W>
std::vector<double> ref_matmul(const std::vector<X>& x, const std::vector<W>& w, int64_t m, int64_t n, int64_t k) {
  std::vector<double> y(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t p = 0; p < k; ++p) s += static_cast<double>(x[i * k + p]) * static_cast<double>(w[j * k + p]);
      y[i * n + j] = s;
    }
  }
  return y;
}

inline double ref_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double ref_silu(double x) { return x * ref_sigmoid(x); }

// RMSNorm of each row in double: x · (mean(x²) + eps)^-½ ⊙ w (w may be empty: no weight).
inline std::vector<double> ref_rms_norm(const std::vector<double>& x, const std::vector<float>& w, int64_t rows,
                                        int64_t dim, double eps) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double sq = 0.0;
    for (int64_t i = 0; i < dim; ++i) sq += x[r * dim + i] * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(sq / static_cast<double>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) y[r * dim + i] = x[r * dim + i] * inv * (w.empty() ? 1.0 : w[i]);
  }
  return y;
}

}  // namespace kimirt::cpu::testing
