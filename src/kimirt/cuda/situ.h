// Gated linear units of the FFNs (§3.6), fp32 math on BF16 inputs:
//   SiTU (Kimi K3):     out = β₁·tanh(g/β₁)·σ(g) · β₂·tanh(u/β₂)   (· u when β₂ is absent)
//   SiLU (Kimi Linear): out = g·σ(g) · u
// The output is BF16, or E4M3 with 1×128 scales for the FP8 GEMM that follows (gemm_lt.h layouts); the
// FP8 output is the quantization of the BF16 output, so fused and unfused paths agree bit for bit.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kimirt::cuda {

struct Glu {
  enum class Kind { kSilu, kSitu };
  Kind kind = Kind::kSitu;
  float beta = 4.0f;          // β₁ (SiTU)
  float linear_beta = 25.0f;  // β₂ (SiTU); <= 0 means absent (u passes through)
};

// gate and up: [rows, width] with row stride ld_in (a packed [gate | up] GEMM output passes up = gate +
// width and ld_in = 2·width). width and strides multiples of 8, pointers 16-byte aligned.
void glu(cudaStream_t stream, const Glu& act, const __nv_bfloat16* gate, const __nv_bfloat16* up, int64_t ld_in,
         __nv_bfloat16* out, int64_t ld_out, int64_t rows, int64_t width);

// Same, quantized: out_q [round_up(rows, 4), width] E4M3, scales [width / 128][round_up(rows, 4)];
// width must be a multiple of 128.
void glu_fp8(cudaStream_t stream, const Glu& act, const __nv_bfloat16* gate, const __nv_bfloat16* up, int64_t ld_in,
             uint8_t* out_q, float* out_scales, int64_t rows, int64_t width);

}  // namespace kimirt::cuda
