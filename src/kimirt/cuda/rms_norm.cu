// RMSNorm kernels: one block per row with the row held in registers (VPT vectors of 8 per thread), and
// one warp per (row, head) for the gated per-head norm.
#include "kimirt/cuda/check.h"
#include "kimirt/cuda/device_utils.cuh"
#include "kimirt/cuda/rms_norm.h"

namespace kimirt::cuda {
namespace {

using detail::bf16;

template <int VPT>
__global__ void rms_norm_kernel(const bf16* __restrict__ x, int64_t ldx, const bf16* __restrict__ res, int64_t ld_res,
                                bf16* sum_out, int64_t ld_sum, const bf16* __restrict__ w, bf16* out, int64_t ld_out,
                                int dim, float eps) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int vectors = dim / 8;
  float v[VPT][8];
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int vi = threadIdx.x + i * blockDim.x;
    if (vi < vectors) {
      detail::unpack8(detail::load16(x + row * ldx + vi * 8), v[i]);
      if (res) {
        float r[8];
        detail::unpack8(detail::load16(res + row * ld_res + vi * 8), r);
#pragma unroll
        for (int j = 0; j < 8; ++j) v[i][j] = detail::round_bf16(v[i][j] + r[j]);
        if (sum_out) detail::store16(sum_out + row * ld_sum + vi * 8, detail::pack8(v[i]));
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) ss += v[i][j] * v[i][j];
    }
  }
  const float total = detail::block_sum(ss, scratch);
  const float rs = 1.0f / sqrtf(total / static_cast<float>(dim) + eps);
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int vi = threadIdx.x + i * blockDim.x;
    if (vi < vectors) {
      float wf[8], y[8];
      detail::unpack8(detail::load16(w + vi * 8), wf);
#pragma unroll
      for (int j = 0; j < 8; ++j) y[j] = detail::round_bf16(v[i][j] * rs) * wf[j];
      detail::store16(out + row * ld_out + vi * 8, detail::pack8(y));
    }
  }
}

__device__ __forceinline__ void load4(const bf16* p, float (&f)[4]) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
  const float2 a = __bfloat1622float2(h[0]);
  const float2 b = __bfloat1622float2(h[1]);
  f[0] = a.x;
  f[1] = a.y;
  f[2] = b.x;
  f[3] = b.y;
}
__device__ __forceinline__ void load4(const float* p, float (&f)[4]) {
  const float4 a = *reinterpret_cast<const float4*>(p);
  f[0] = a.x;
  f[1] = a.y;
  f[2] = a.z;
  f[3] = a.w;
}

// Lane l holds elements 128·i + 4l .. 4l+3 of its head for i < NV.
template <int NV, typename InT>
__global__ void rms_norm_gated_kernel(const InT* __restrict__ x, int64_t ldx, const bf16* __restrict__ gate,
                                      int64_t ld_gate, const float* __restrict__ w, bf16* out, int64_t ld_out,
                                      int64_t rows, int heads, float eps) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (warp >= rows * heads) return;
  const int64_t row = warp / heads;
  const int head = static_cast<int>(warp % heads);
  constexpr int kHeadDim = 128 * NV;
  float v[NV][4];
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    load4(x + row * ldx + head * kHeadDim + i * 128 + lane * 4, v[i]);
#pragma unroll
    for (int j = 0; j < 4; ++j) ss += v[i][j] * v[i][j];
  }
  ss = detail::warp_sum(ss);
  const float rs = 1.0f / sqrtf(ss / static_cast<float>(kHeadDim) + eps);
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c = i * 128 + lane * 4;
    float g[4];
    load4(gate + row * ld_gate + head * kHeadDim + c, g);
    const float4 wv = *reinterpret_cast<const float4*>(w + c);
    const float wf[4] = {wv.x, wv.y, wv.z, wv.w};
    __nv_bfloat162 o[2];
    float y[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) y[j] = v[i][j] * rs * wf[j] * detail::sigmoid(g[j]);
    o[0] = __floats2bfloat162_rn(y[0], y[1]);
    o[1] = __floats2bfloat162_rn(y[2], y[3]);
    *reinterpret_cast<uint2*>(out + row * ld_out + head * kHeadDim + c) = *reinterpret_cast<const uint2*>(o);
  }
}

void check_rows(const char* op, const void* x, int64_t ldx, const void* res, int64_t ld_res, const void* sum,
                int64_t ld_sum, const void* w, const void* out, int64_t ld_out, int64_t rows, int64_t dim) {
  KIMIRT_CUDA_REQUIRE(rows >= 0 && rows < (1ll << 31), op, ": row count ", rows);
  KIMIRT_CUDA_REQUIRE(dim > 0 && dim % 8 == 0 && dim <= 16384, op, ": dim ", dim,
                      " must be a multiple of 8 in [8, 16384]");
  KIMIRT_CUDA_REQUIRE(ldx >= dim && ldx % 8 == 0 && ld_out >= dim && ld_out % 8 == 0, op, ": row strides (x ", ldx,
                      ", out ", ld_out, ") must be >= dim ", dim, " and multiples of 8");
  KIMIRT_CUDA_REQUIRE(x && w && out && detail::aligned16(x) && detail::aligned16(w) && detail::aligned16(out), op,
                      ": x, w and out must be non-null and 16-byte aligned");
  if (res) {
    KIMIRT_CUDA_REQUIRE(ld_res >= dim && ld_res % 8 == 0 && detail::aligned16(res), op, ": residual stride ", ld_res,
                        " must be >= dim and a multiple of 8, residual 16-byte aligned");
  }
  if (sum) {
    KIMIRT_CUDA_REQUIRE(ld_sum >= dim && ld_sum % 8 == 0 && detail::aligned16(sum), op, ": sum stride ", ld_sum,
                        " must be >= dim and a multiple of 8, sum_out 16-byte aligned");
  }
}

void launch_rms(cudaStream_t stream, const bf16* x, int64_t ldx, const bf16* res, int64_t ld_res, bf16* sum,
                int64_t ld_sum, const bf16* w, bf16* out, int64_t ld_out, int64_t rows, int64_t dim, float eps) {
  if (rows == 0) return;
  const int vectors = static_cast<int>(dim / 8);
  const int threads = vectors >= 1024 ? 256 : (vectors >= 256 ? 128 : (vectors >= 64 ? 64 : 32));
  const int vpt = (vectors + threads - 1) / threads;
  const dim3 grid(static_cast<unsigned>(rows));
  const int d = static_cast<int>(dim);
  if (vpt <= 1) {
    rms_norm_kernel<1><<<grid, threads, 0, stream>>>(x, ldx, res, ld_res, sum, ld_sum, w, out, ld_out, d, eps);
  } else if (vpt <= 2) {
    rms_norm_kernel<2><<<grid, threads, 0, stream>>>(x, ldx, res, ld_res, sum, ld_sum, w, out, ld_out, d, eps);
  } else if (vpt <= 4) {
    rms_norm_kernel<4><<<grid, threads, 0, stream>>>(x, ldx, res, ld_res, sum, ld_sum, w, out, ld_out, d, eps);
  } else {
    rms_norm_kernel<8><<<grid, threads, 0, stream>>>(x, ldx, res, ld_res, sum, ld_sum, w, out, ld_out, d, eps);
  }
  KIMIRT_CUDA_CHECK_LAUNCH();
}

template <typename InT>
void launch_gated(cudaStream_t stream, const InT* x, int64_t ldx, const bf16* gate, int64_t ld_gate, const float* w,
                  bf16* out, int64_t ld_out, int64_t rows, int64_t heads, int64_t head_dim, float eps) {
  KIMIRT_CUDA_REQUIRE(rows >= 0 && heads > 0, "rms_norm_gated: rows ", rows, ", heads ", heads);
  KIMIRT_CUDA_REQUIRE(head_dim == 128 || head_dim == 256 || head_dim == 512, "rms_norm_gated: head_dim ", head_dim,
                      " must be 128, 256 or 512");
  const int64_t width = heads * head_dim;
  KIMIRT_CUDA_REQUIRE(
      ldx >= width && ld_gate >= width && ld_out >= width && ldx % 8 == 0 && ld_gate % 8 == 0 && ld_out % 8 == 0,
      "rms_norm_gated: row strides (x ", ldx, ", gate ", ld_gate, ", out ", ld_out, ") must be >= heads*head_dim ",
      width, " and multiples of 8");
  KIMIRT_CUDA_REQUIRE(x && gate && w && out && detail::aligned16(x) && detail::aligned16(gate) &&
                          detail::aligned16(w) && detail::aligned16(out),
                      "rms_norm_gated: pointers must be non-null and 16-byte aligned");
  if (rows == 0) return;
  const int64_t warps = rows * heads;
  const int threads = 256;
  const int64_t blocks = (warps * 32 + threads - 1) / threads;
  KIMIRT_CUDA_REQUIRE(blocks < (1ll << 31), "rms_norm_gated: too many rows ", rows);
  const unsigned b = static_cast<unsigned>(blocks);
  const int h = static_cast<int>(heads);
  if (head_dim == 128) {
    rms_norm_gated_kernel<1, InT><<<b, threads, 0, stream>>>(x, ldx, gate, ld_gate, w, out, ld_out, rows, h, eps);
  } else if (head_dim == 256) {
    rms_norm_gated_kernel<2, InT><<<b, threads, 0, stream>>>(x, ldx, gate, ld_gate, w, out, ld_out, rows, h, eps);
  } else {
    rms_norm_gated_kernel<4, InT><<<b, threads, 0, stream>>>(x, ldx, gate, ld_gate, w, out, ld_out, rows, h, eps);
  }
  KIMIRT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void rms_norm(cudaStream_t stream, const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w, __nv_bfloat16* out,
              int64_t ld_out, int64_t rows, int64_t dim, float eps) {
  check_rows("rms_norm", x, ldx, nullptr, 0, nullptr, 0, w, out, ld_out, rows, dim);
  launch_rms(stream, x, ldx, nullptr, 0, nullptr, 0, w, out, ld_out, rows, dim, eps);
}

void add_rms_norm(cudaStream_t stream, const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* residual,
                  int64_t ld_res, __nv_bfloat16* sum_out, int64_t ld_sum, const __nv_bfloat16* w, __nv_bfloat16* out,
                  int64_t ld_out, int64_t rows, int64_t dim, float eps) {
  KIMIRT_CUDA_REQUIRE(residual, "add_rms_norm: residual is null");
  check_rows("add_rms_norm", x, ldx, residual, ld_res, sum_out, ld_sum, w, out, ld_out, rows, dim);
  launch_rms(stream, x, ldx, residual, ld_res, sum_out, ld_sum, w, out, ld_out, rows, dim, eps);
}

void rms_norm_gated(cudaStream_t stream, const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* gate,
                    int64_t ld_gate, const float* w, __nv_bfloat16* out, int64_t ld_out, int64_t rows, int64_t heads,
                    int64_t head_dim, float eps) {
  launch_gated(stream, x, ldx, gate, ld_gate, w, out, ld_out, rows, heads, head_dim, eps);
}

void rms_norm_gated(cudaStream_t stream, const float* x, int64_t ldx, const __nv_bfloat16* gate, int64_t ld_gate,
                    const float* w, __nv_bfloat16* out, int64_t ld_out, int64_t rows, int64_t heads, int64_t head_dim,
                    float eps) {
  launch_gated(stream, x, ldx, gate, ld_gate, w, out, ld_out, rows, heads, head_dim, eps);
}

}  // namespace kimirt::cuda
