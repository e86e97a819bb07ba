// AttnRes mix + RMSNorm: one block per token. Each thread stages its own 16-byte slices of every candidate
// in shared memory while accumulating Σv² and ⟨v, u⟩, so the second pass (the mix) reads shared memory,
// not HBM; only the two small reductions need the whole block.
#include <vector>

#include "kimirt/cuda/attn_res.h"
#include "kimirt/cuda/check.h"
#include "kimirt/cuda/device_utils.cuh"
#include "kimirt/cuda/kernel_attr.h"

namespace kimirt::cuda {
namespace {

using detail::bf16;

constexpr int kThreads = 256;
constexpr int kMaxSmemBytes = 200 * 1024;

struct Candidates {
  const bf16* p[kAttnResMaxCandidates];
};

template <int VPT>
__global__ void __launch_bounds__(kThreads)
    attn_res_kernel(Candidates cand, int count, int64_t ld_in, int hidden, const float* __restrict__ u, float res_eps,
                    const bf16* __restrict__ norm_w, float norm_eps, bf16* mixed, bf16* normed, int64_t ld_out) {
  extern __shared__ uint4 stage[];  // [count][hidden / 8]
  __shared__ float partial[kThreads / 32][2 * kAttnResMaxCandidates];
  __shared__ float stats[2 * kAttnResMaxCandidates];
  __shared__ float scratch[32];
  const int64_t token = blockIdx.x;
  const int vectors = hidden / 8;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  float uf[VPT][8];
#pragma unroll
  for (int v = 0; v < VPT; ++v) {
    const int vi = threadIdx.x + v * kThreads;
    if (vi < vectors) {
      const float4 a = *reinterpret_cast<const float4*>(u + vi * 8);
      const float4 b = *reinterpret_cast<const float4*>(u + vi * 8 + 4);
      uf[v][0] = a.x, uf[v][1] = a.y, uf[v][2] = a.z, uf[v][3] = a.w;
      uf[v][4] = b.x, uf[v][5] = b.y, uf[v][6] = b.z, uf[v][7] = b.w;
    }
  }
  for (int i = 0; i < count; ++i) {
    float ss = 0.0f, dot = 0.0f;
    const bf16* row = cand.p[i] + token * ld_in;
#pragma unroll
    for (int v = 0; v < VPT; ++v) {
      const int vi = threadIdx.x + v * kThreads;
      if (vi < vectors) {
        const uint4 raw = detail::ldcs16(row + vi * 8);
        stage[i * vectors + vi] = raw;
        float f[8];
        detail::unpack8(raw, f);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          ss += f[j] * f[j];
          dot += f[j] * uf[v][j];
        }
      }
    }
    ss = detail::warp_sum(ss);
    dot = detail::warp_sum(dot);
    if (lane == 0) {
      partial[warp][2 * i] = ss;
      partial[warp][2 * i + 1] = dot;
    }
  }
  __syncthreads();
  if (threadIdx.x < 2 * count) {
    float s = 0.0f;
    for (int w = 0; w < kThreads / 32; ++w) s += partial[w][threadIdx.x];
    stats[threadIdx.x] = s;
  }
  __syncthreads();
  float alpha[kAttnResMaxCandidates];
  float smax = -INFINITY;
  for (int i = 0; i < count; ++i) {
    const float score = stats[2 * i + 1] / sqrtf(stats[2 * i] / static_cast<float>(hidden) + res_eps);
    alpha[i] = score;
    smax = fmaxf(smax, score);
  }
  float denom = 0.0f;
  for (int i = 0; i < count; ++i) {
    alpha[i] = expf(alpha[i] - smax);
    denom += alpha[i];
  }
  for (int i = 0; i < count; ++i) alpha[i] /= denom;

  float h[VPT][8];
  float ss = 0.0f;
#pragma unroll
  for (int v = 0; v < VPT; ++v) {
    const int vi = threadIdx.x + v * kThreads;
    if (vi < vectors) {
#pragma unroll
      for (int j = 0; j < 8; ++j) h[v][j] = 0.0f;
      for (int i = 0; i < count; ++i) {
        float f[8];
        detail::unpack8(stage[i * vectors + vi], f);
#pragma unroll
        for (int j = 0; j < 8; ++j) h[v][j] += alpha[i] * f[j];
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        h[v][j] = detail::round_bf16(h[v][j]);
        ss += h[v][j] * h[v][j];
      }
      if (mixed) detail::store16(mixed + token * ld_out + vi * 8, detail::pack8(h[v]));
    }
  }
  const float total = detail::block_sum(ss, scratch);
  const float rs = 1.0f / sqrtf(total / static_cast<float>(hidden) + norm_eps);
#pragma unroll
  for (int v = 0; v < VPT; ++v) {
    const int vi = threadIdx.x + v * kThreads;
    if (vi < vectors) {
      float wf[8], y[8];
      detail::unpack8(detail::load16(norm_w + vi * 8), wf);
#pragma unroll
      for (int j = 0; j < 8; ++j) y[j] = detail::round_bf16(h[v][j] * rs) * wf[j];
      detail::store16(normed + token * ld_out + vi * 8, detail::pack8(y));
    }
  }
}

__global__ void pseudo_query_kernel(const bf16* norm_w, const bf16* proj_w, float* u, int64_t hidden) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < hidden) u[i] = __bfloat162float(norm_w[i]) * __bfloat162float(proj_w[i]);
}

template <int VPT>
void launch(cudaStream_t stream, const Candidates& c, int count, int64_t ld_in, int64_t tokens, int hidden,
            const float* u, float res_eps, const bf16* norm_w, float norm_eps, bf16* mixed, bf16* normed,
            int64_t ld_out, int smem) {
  ensure_dynamic_smem(reinterpret_cast<const void*>(&attn_res_kernel<VPT>), smem);
  attn_res_kernel<VPT><<<static_cast<unsigned>(tokens), kThreads, smem, stream>>>(
      c, count, ld_in, hidden, u, res_eps, norm_w, norm_eps, mixed, normed, ld_out);
  KIMIRT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void attn_res_pseudo_query(cudaStream_t stream, const __nv_bfloat16* norm_w, const __nv_bfloat16* proj_w, float* u,
                           int64_t hidden) {
  KIMIRT_CUDA_REQUIRE(hidden > 0 && norm_w && proj_w && u, "attn_res_pseudo_query: hidden ", hidden,
                      " or a null pointer");
  pseudo_query_kernel<<<static_cast<unsigned>((hidden + 255) / 256), 256, 0, stream>>>(norm_w, proj_w, u, hidden);
  KIMIRT_CUDA_CHECK_LAUNCH();
}

void attn_res_mix_norm(cudaStream_t stream, const __nv_bfloat16* const* candidates, int count, int64_t ld_in,
                       int64_t tokens, int64_t hidden, const float* u, float res_eps, const __nv_bfloat16* norm_w,
                       float norm_eps, __nv_bfloat16* mixed, __nv_bfloat16* normed, int64_t ld_out) {
  KIMIRT_CUDA_REQUIRE(count >= 1 && count <= kAttnResMaxCandidates, "attn_res_mix_norm: ", count, " candidates (1..",
                      kAttnResMaxCandidates, " supported)");
  KIMIRT_CUDA_REQUIRE(hidden > 0 && hidden % 8 == 0 && hidden <= 8 * 8 * kThreads, "attn_res_mix_norm: hidden ", hidden,
                      " must be a multiple of 8 and at most ", 8 * 8 * kThreads);
  const int64_t smem = static_cast<int64_t>(count) * hidden * 2;
  KIMIRT_CUDA_REQUIRE(smem <= kMaxSmemBytes, "attn_res_mix_norm: ", count, " candidates of width ", hidden, " need ",
                      smem, " bytes of shared memory (at most ", kMaxSmemBytes, ")");
  KIMIRT_CUDA_REQUIRE(ld_in >= hidden && ld_in % 8 == 0 && ld_out >= hidden && ld_out % 8 == 0,
                      "attn_res_mix_norm: row strides (in ", ld_in, ", out ", ld_out,
                      ") must be >= hidden and multiples of 8");
  KIMIRT_CUDA_REQUIRE(tokens >= 0 && tokens < (1ll << 31), "attn_res_mix_norm: token count ", tokens);
  KIMIRT_CUDA_REQUIRE(candidates && u && norm_w && normed && detail::aligned16(u) && detail::aligned16(norm_w) &&
                          detail::aligned16(normed) && (!mixed || detail::aligned16(mixed)),
                      "attn_res_mix_norm: u, norm_w, normed (and mixed) must be non-null and 16-byte aligned");
  Candidates c{};
  for (int i = 0; i < count; ++i) {
    KIMIRT_CUDA_REQUIRE(candidates[i] && detail::aligned16(candidates[i]), "attn_res_mix_norm: candidate ", i,
                        " is null or not 16-byte aligned");
    c.p[i] = candidates[i];
  }
  if (tokens == 0) return;
  const int vectors = static_cast<int>(hidden / 8);
  const int vpt = (vectors + kThreads - 1) / kThreads;
  const int h = static_cast<int>(hidden);
  const int s = static_cast<int>(smem);
  if (vpt <= 1) {
    launch<1>(stream, c, count, ld_in, tokens, h, u, res_eps, norm_w, norm_eps, mixed, normed, ld_out, s);
  } else if (vpt <= 2) {
    launch<2>(stream, c, count, ld_in, tokens, h, u, res_eps, norm_w, norm_eps, mixed, normed, ld_out, s);
  } else if (vpt <= 4) {
    launch<4>(stream, c, count, ld_in, tokens, h, u, res_eps, norm_w, norm_eps, mixed, normed, ld_out, s);
  } else {
    launch<8>(stream, c, count, ld_in, tokens, h, u, res_eps, norm_w, norm_eps, mixed, normed, ld_out, s);
  }
}

}  // namespace kimirt::cuda
