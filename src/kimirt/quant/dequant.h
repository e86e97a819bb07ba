// CPU dequantizers: stored weight -> f32 in its logical [out, in] shape. They define what the bytes mean
// (the GPU kernels are tested against them):
//   float   W = value (BF16/F16/F32/F64)
//   MXFP4   W[o, i] = e2m1(code[o, i]) * 2^(scale[o, i / 32] - 127)        (low nibble = even element)
//   FP8     W[r, c] = e4m3(w[r, c]) * scale[r / 128, c / 128]             (both scale namings multiply)
//   NVFP4   ModelOpt:           W = e2m1 * (e4m3(scale[o, i / 16]) * weight_scale_2)
//           compressed-tensors: W = e2m1 * (e4m3(scale[o, i / 16]) / weight_global_scale)
#pragma once

#include <span>
#include <string_view>

#include "kimirt/quant/weight_format.h"
#include "kimirt/tensor/tensor.h"

namespace kimirt::quant {

// `parts` are the weight's components in format_components order, each in canonical form
// (normalize_component); an absent optional component is a default-constructed view. Returns an F32 tensor of
// shape `logical`. `name` prefixes errors.
Tensor dequantize(WeightFormat format, std::span<const TensorView> parts, std::span<const int64_t> logical,
                  std::string_view name);

// The kernels behind dequantize, on raw row-major buffers; out is [rows, cols].
void dequantize_mxfp4(const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t cols, float* out);
void dequantize_fp8_block(const uint8_t* weight, const float* scales, int64_t rows, int64_t cols, int64_t block_rows,
                          int64_t block_cols, float* out);
// ModelOpt's weight_scale_2 multiplies the group scale; compressed-tensors' weight_global_scale divides it.
enum class GlobalScale { kMultiply, kDivide };
void dequantize_nvfp4(const uint8_t* packed, const uint8_t* scales, float global_scale, GlobalScale mode, int64_t rows,
                      int64_t cols, float* out);

}  // namespace kimirt::quant
