// Quantizers f32 -> each stored format, for the tiny-checkpoint generator and for tests. They follow the
// usual producers' rules so that generated checkpoints look like released ones:
//   MXFP4  scale = 2^(floor(log2(amax of 32)) - 2) (OCP: E2M1's largest exponent is 2), stored as E8M0;
//          elements round to nearest E2M1, saturating at +-6. An all-zero group gets scale 2^0.
//   FP8    scale = amax(128x128 block) / 448 (F32), elements round to nearest E4M3, saturating.
//   NVFP4  ModelOpt: weight_scale_2 = amax / (6 * 448); group scale = E4M3(amax16 / 6 / weight_scale_2).
//          compressed-tensors: weight_global_scale = 6 * 448 / amax; group scale = E4M3(amax16 / 6 * global).
#pragma once

#include <span>
#include <vector>

#include "kimirt/quant/weight_format.h"
#include "kimirt/tensor/tensor.h"

namespace kimirt::quant {

// A weight in stored form: its components in format_components order (an absent optional one is an empty
// Tensor), each in canonical shape.
struct QuantizedWeight {
  WeightFormat format = WeightFormat::kFloat;
  Shape shape;  // logical
  std::vector<Tensor> parts;

  // Views in format_components order (default views for absent parts), as dequantize takes them.
  std::vector<TensorView> views() const;
};

// Quantizes `values` (row-major, `shape`) into `format`. `float_dtype` is the dtype of a kFloat weight.
// Throws on a non-finite value or a shape the format cannot hold (odd FP4 column count, non-2-D).
QuantizedWeight quantize(WeightFormat format, std::span<const float> values, const Shape& shape,
                         DType float_dtype = DType::kBF16);

}  // namespace kimirt::quant
