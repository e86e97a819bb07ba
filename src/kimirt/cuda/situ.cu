// SiTU-GLU / SiLU-GLU kernels.
#include "kimirt/cuda/check.h"
#include "kimirt/cuda/device_utils.cuh"
#include "kimirt/cuda/fp8_group.cuh"
#include "kimirt/cuda/situ.h"

namespace kimirt::cuda {
namespace {

using detail::bf16;

struct Act {
  bool situ;
  float beta, inv_beta, linear_beta, inv_linear_beta;
};

__device__ __forceinline__ float glu_value(const Act& a, float g, float u) {
  if (!a.situ) return g * detail::sigmoid(g) * u;
  const float gp = a.beta * tanhf(g / a.beta) * detail::sigmoid(g);
  const float up = a.linear_beta > 0.0f ? a.linear_beta * tanhf(u / a.linear_beta) : u;
  return gp * up;
}

__global__ void glu_kernel(Act a, const bf16* __restrict__ gate, const bf16* __restrict__ up, int64_t ld_in,
                           bf16* __restrict__ out, int64_t ld_out, int64_t rows, int64_t width) {
  const int64_t per_row = width / 8;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * per_row) return;
  const int64_t r = idx / per_row;
  const int64_t c = (idx % per_row) * 8;
  float g[8], u[8], y[8];
  detail::unpack8(detail::load16(gate + r * ld_in + c), g);
  detail::unpack8(detail::load16(up + r * ld_in + c), u);
#pragma unroll
  for (int j = 0; j < 8; ++j) y[j] = glu_value(a, g[j], u[j]);
  detail::store16(out + r * ld_out + c, detail::pack8(y));
}

// One warp per (row, 128-wide group); lane l holds columns 4l..4l+3.
__global__ void glu_fp8_kernel(Act a, const bf16* __restrict__ gate, const bf16* __restrict__ up, int64_t ld_in,
                               uint8_t* __restrict__ out_q, float* __restrict__ scales, int64_t rows, int64_t rows_pad,
                               int64_t width) {
  const int64_t groups = width / 128;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (warp >= rows_pad * groups) return;
  const int64_t r = warp / groups;
  const int64_t gi = warp % groups;
  const int64_t c = gi * 128 + lane * 4;
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (r < rows) {
    const uint2 graw = *reinterpret_cast<const uint2*>(gate + r * ld_in + c);
    const uint2 uraw = *reinterpret_cast<const uint2*>(up + r * ld_in + c);
    const __nv_bfloat162* gh = reinterpret_cast<const __nv_bfloat162*>(&graw);
    const __nv_bfloat162* uh = reinterpret_cast<const __nv_bfloat162*>(&uraw);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float2 gf = __bfloat1622float2(gh[h]);
      const float2 uf = __bfloat1622float2(uh[h]);
      v[2 * h] = detail::round_bf16(glu_value(a, gf.x, uf.x));
      v[2 * h + 1] = detail::round_bf16(glu_value(a, gf.y, uf.y));
    }
  }
  float scale;
  const uint32_t codes = detail::quantize_group4(v, &scale);
  *reinterpret_cast<uint32_t*>(out_q + r * width + c) = codes;
  if (lane == 0) scales[gi * rows_pad + r] = scale;
}

Act make_act(const Glu& g) {
  if (g.kind == Glu::Kind::kSitu) {
    KIMIRT_CUDA_REQUIRE(g.beta > 0.0f && g.beta < 1e30f, "glu: SiTU beta (activation_situ_beta) ", g.beta,
                        " must be finite and positive");
  }
  Act a{g.kind == Glu::Kind::kSitu, g.beta, 1.0f / g.beta, g.linear_beta,
        g.linear_beta > 0.0f ? 1.0f / g.linear_beta : 0.0f};
  return a;
}

void check_inputs(const char* op, const void* gate, const void* up, int64_t ld_in, int64_t rows, int64_t width) {
  KIMIRT_CUDA_REQUIRE(rows >= 0 && width > 0 && width % 8 == 0, op, ": width ", width,
                      " must be a positive multiple of 8 (rows ", rows, ")");
  KIMIRT_CUDA_REQUIRE(ld_in >= width && ld_in % 8 == 0, op, ": input row stride ", ld_in,
                      " must be >= width and a multiple of 8");
  KIMIRT_CUDA_REQUIRE(gate && up && detail::aligned16(gate) && detail::aligned16(up), op,
                      ": gate and up must be non-null and 16-byte aligned");
}

}  // namespace

void glu(cudaStream_t stream, const Glu& act, const __nv_bfloat16* gate, const __nv_bfloat16* up, int64_t ld_in,
         __nv_bfloat16* out, int64_t ld_out, int64_t rows, int64_t width) {
  check_inputs("glu", gate, up, ld_in, rows, width);
  KIMIRT_CUDA_REQUIRE(out && detail::aligned16(out) && ld_out >= width && ld_out % 8 == 0,
                      "glu: out must be 16-byte aligned with a row stride >= width and a multiple of 8 (got ", ld_out,
                      ")");
  const Act a = make_act(act);
  if (rows == 0) return;
  const int64_t total = rows * (width / 8);
  const int threads = 256;
  const int64_t blocks = (total + threads - 1) / threads;
  KIMIRT_CUDA_REQUIRE(blocks < (1ll << 31), "glu: too many elements");
  glu_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(a, gate, up, ld_in, out, ld_out, rows, width);
  KIMIRT_CUDA_CHECK_LAUNCH();
}

void glu_fp8(cudaStream_t stream, const Glu& act, const __nv_bfloat16* gate, const __nv_bfloat16* up, int64_t ld_in,
             uint8_t* out_q, float* out_scales, int64_t rows, int64_t width) {
  check_inputs("glu_fp8", gate, up, ld_in, rows, width);
  KIMIRT_CUDA_REQUIRE(width % 128 == 0, "glu_fp8: width ", width, " must be a multiple of 128");
  KIMIRT_CUDA_REQUIRE(out_q && out_scales && (reinterpret_cast<uintptr_t>(out_q) & 3u) == 0,
                      "glu_fp8: out_q (4-byte aligned) and out_scales must be non-null");
  const Act a = make_act(act);
  if (rows == 0) return;
  const int64_t rows_pad = (rows + 3) / 4 * 4;
  const int64_t warps = rows_pad * (width / 128);
  const int threads = 256;
  const int64_t blocks = (warps * 32 + threads - 1) / threads;
  KIMIRT_CUDA_REQUIRE(blocks < (1ll << 31), "glu_fp8: too many elements");
  glu_fp8_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(a, gate, up, ld_in, out_q, out_scales, rows,
                                                                        rows_pad, width);
  KIMIRT_CUDA_CHECK_LAUNCH();
}

}  // namespace kimirt::cuda
