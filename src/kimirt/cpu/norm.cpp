#include "kimirt/cpu/norm.h"

#include <cmath>

#include "kimirt/base/error.h"
#include "kimirt/cpu/activation.h"

namespace kimirt::cpu {
namespace {

double sum_of_squares(const float* x, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

// (mean(x²) + eps)^-½ of one vector.
float inverse_rms(const float* x, int64_t n, float eps) {
  return static_cast<float>(1.0 / std::sqrt(sum_of_squares(x, n) / static_cast<double>(n) + eps));
}

}  // namespace

void check_norm_eps(const char* op, float eps) {
  KIMIRT_CHECK(std::isfinite(eps) && eps >= 0.0f,
               "{}: eps {} must be a finite number >= 0 (rows with mean(x^2) below a negative one would be NaN)", op,
               eps);
}

void rms_norm(const float* x, const float* w, float* out, int64_t rows, int64_t dim, float eps) {
  check_norm_eps("rms_norm", eps);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* o = out + r * dim;
    const float inv = inverse_rms(xr, dim, eps);
    for (int64_t i = 0; i < dim; ++i) o[i] = (xr[i] * inv) * w[i];
  }
}

void rms_normalize(const float* x, float* out, int64_t rows, int64_t dim, float eps) {
  check_norm_eps("rms_normalize", eps);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* o = out + r * dim;
    const float inv = inverse_rms(xr, dim, eps);
    for (int64_t i = 0; i < dim; ++i) o[i] = xr[i] * inv;
  }
}

void rms_norm_gated(const float* x, const float* gate, const float* w, float* out, int64_t rows, int64_t heads,
                    int64_t head_dim, float eps) {
  check_norm_eps("rms_norm_gated", eps);
  for (int64_t r = 0; r < rows * heads; ++r) {
    const float* xr = x + r * head_dim;
    const float* gr = gate + r * head_dim;
    float* o = out + r * head_dim;
    const float inv = inverse_rms(xr, head_dim, eps);
    for (int64_t i = 0; i < head_dim; ++i) o[i] = (xr[i] * inv) * w[i] * sigmoid(gr[i]);
  }
}

void l2_normalize(const float* x, float* out, int64_t rows, int64_t dim, float eps, float scale) {
  check_norm_eps("l2_normalize", eps);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* o = out + r * dim;
    const float inv = static_cast<float>(1.0 / std::sqrt(sum_of_squares(xr, dim) + eps));
    for (int64_t i = 0; i < dim; ++i) o[i] = xr[i] * inv * scale;
  }
}

}  // namespace kimirt::cpu
