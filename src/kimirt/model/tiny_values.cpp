#include "kimirt/model/tiny_values.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "kimirt/base/error.h"
#include "kimirt/quant/quantize.h"
#include "kimirt/tensor/float_convert.h"

namespace kimirt::model {
namespace {

constexpr size_t kChunk = size_t{1} << 16;  // values per chunk

// splitmix64: small, fast, and good enough for test weights; one stream per tensor.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>(next() >> 40) * 0x1p-24f; }  // [0, 1)

 private:
  uint64_t state_;
};

// Box-Muller, both values of each pair used in turn, so the stream does not depend on chunk sizes.
class Gaussian {
 public:
  explicit Gaussian(uint64_t seed) : rng_(seed) {}
  float next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const float u1 = static_cast<float>((rng_.next() >> 40) + 1) * 0x1p-24f;  // (0, 1]: log stays finite
    const float u2 = rng_.uniform();
    const float r = std::sqrt(-2.0f * std::log(u1));
    const float a = 2.0f * std::numbers::pi_v<float> * u2;
    spare_ = r * std::sin(a);
    has_spare_ = true;
    return r * std::cos(a);
  }

 private:
  Rng rng_;
  bool has_spare_ = false;
  float spare_ = 0.0f;
};

uint64_t seed_for(uint64_t seed, std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  Rng mix(seed ^ h);
  return mix.next();
}

bool is_norm(ParamRole role) {
  switch (role) {
    case ParamRole::kFinalNorm:
    case ParamRole::kOutputResNorm:
    case ParamRole::kInputNorm:
    case ParamRole::kPostAttnNorm:
    case ParamRole::kAttnResNorm:
    case ParamRole::kMlpResNorm:
    case ParamRole::kKdaONorm:
    case ParamRole::kMlaQANorm:
    case ParamRole::kMlaKvANorm:
    case ParamRole::kLatentNorm:
      return true;
    default:
      return false;
  }
}

void float_tensor(const TinyTensor& t, uint64_t seed, const std::function<void(const void*, size_t)>& out) {
  const ParamRole role = t.spec->role;
  const Shape& logical = t.spec->sources[t.source].shape;
  const int64_t n = shape_numel(t.shape);
  Rng rng(seed_for(seed, t.key));
  Gaussian gauss(seed_for(seed, t.key));
  float sigma = 1.0f;
  if (role == ParamRole::kKdaDtBias) {
    sigma = 0.5f;
  } else if (role == ParamRole::kKdaQConv || role == ParamRole::kKdaKConv || role == ParamRole::kKdaVConv) {
    sigma = 0.3f;
  } else if (role == ParamRole::kRouterBias) {
    sigma = 0.1f;
  } else {
    sigma = 1.0f / std::sqrt(static_cast<float>(logical.back()));  // linear weights: N(0, 1/fan_in)
  }
  const int64_t heads = logical[0];  // A_log: values past the heads are the zero padding
  std::vector<float> values(kChunk);
  std::vector<uint8_t> bytes(kChunk * 8);
  for (int64_t first = 0; first < n; first += static_cast<int64_t>(kChunk)) {
    const int64_t count = std::min<int64_t>(static_cast<int64_t>(kChunk), n - first);
    for (int64_t i = 0; i < count; ++i) {
      float& v = values[static_cast<size_t>(i)];
      if (role == ParamRole::kKdaALog) {
        v = first + i < heads ? std::log(0.5f + 15.5f * rng.uniform()) : 0.0f;
      } else if (is_norm(role)) {
        v = 0.8f + 0.4f * rng.uniform();
      } else {
        v = sigma * gauss.next();
      }
    }
    convert_from_f32(t.dtype, values.data(), bytes.data(), count);
    out(bytes.data(), static_cast<size_t>(count * dtype_bits(t.dtype) / 8));
  }
}

// Random E2M1 codes (every byte value is two valid codes) and E8M0 scales 2^-3..2^-6 (codes 124..121), so
// that dequantization is exact and the weights stay small.
void mxfp4_tensor(const TinyTensor& t, uint64_t seed, const std::function<void(const void*, size_t)>& out) {
  Rng rng(seed_for(seed, t.key));
  const uint64_t n = *dtype_bytes(t.dtype, static_cast<uint64_t>(shape_numel(t.shape)));
  std::vector<uint8_t> chunk(kChunk);
  for (uint64_t first = 0; first < n; first += kChunk) {
    const size_t count = static_cast<size_t>(std::min<uint64_t>(kChunk, n - first));
    for (size_t i = 0; i < count; i += 8) {
      uint64_t bits = rng.next();
      for (size_t k = i; k < std::min(count, i + 8); ++k, bits >>= 8) {
        chunk[k] = t.component == 0 ? static_cast<uint8_t>(bits) : static_cast<uint8_t>(121 + (bits & 3));
      }
    }
    out(chunk.data(), count);
  }
}

// FP8 block weights from N(0, 1/fan_in) values, quantized 128 rows at a time (scale = amax / 448). The data
// and the scale tensor regenerate the same values (one stream per weight), so either can be written first.
void fp8_tensor(const TinyTensor& t, uint64_t seed, const std::function<void(const void*, size_t)>& out) {
  const ParamSource& src = t.spec->sources[t.source];
  const int64_t rows = src.shape[0], cols = src.shape[1];
  const auto comps = quant::format_components(src.format);
  const int64_t band = comps[1].tile_rows;
  Gaussian gauss(seed_for(seed, src.base + "/fp8"));
  const float sigma = 1.0f / std::sqrt(static_cast<float>(cols));
  std::vector<float> values;
  for (int64_t r0 = 0; r0 < rows; r0 += band) {
    const int64_t r = std::min(band, rows - r0);
    values.resize(static_cast<size_t>(r * cols));
    for (auto& v : values) v = sigma * gauss.next();
    const quant::QuantizedWeight q = quant::quantize(src.format, values, {r, cols});
    const Tensor& part = q.parts[static_cast<size_t>(t.component)];
    out(part.data(), part.nbytes());
  }
}

}  // namespace

void generate_tiny_tensor(const TinyTensor& tensor, uint64_t seed,
                          const std::function<void(const void*, size_t)>& out) {
  switch (tensor.spec->sources[tensor.source].format) {
    case quant::WeightFormat::kFloat:
      float_tensor(tensor, seed, out);
      return;
    case quant::WeightFormat::kMxfp4:
      mxfp4_tensor(tensor, seed, out);
      return;
    case quant::WeightFormat::kFp8BlockScale:
    case quant::WeightFormat::kFp8BlockScaleInv:
      fp8_tensor(tensor, seed, out);
      return;
    default:
      fail("{}: make-tiny does not generate {} weights", tensor.key,
           quant::format_name(tensor.spec->sources[tensor.source].format));
  }
}

}  // namespace kimirt::model
