// AttnRes mix + RMSNorm: a cluster of two blocks per token, each owning half of the hidden dimension.
// A block first issues cp.async copies of its half of every candidate into shared memory (all of the
// token's bytes in flight at once), then reduces Σv² and ⟨v, u⟩ per candidate; the two blocks add their
// partial sums through distributed shared memory, so each needs only 9 x 7 KiB of shared memory for K3
// and three clusters' worth of tokens stay resident per SM, overlapping one token's loads with another's
// arithmetic.
#include <cooperative_groups.h>

#include <vector>

#include "kimirt/cuda/attn_res.h"
#include "kimirt/cuda/check.h"
#include "kimirt/cuda/device_utils.cuh"
#include "kimirt/cuda/kernel_attr.h"

namespace kimirt::cuda {
namespace {

namespace cg = cooperative_groups;
using detail::bf16;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxSmemBytes = 200 * 1024;
constexpr int kStats = 2 * kAttnResMaxCandidates;

struct Candidates {
  const bf16* p[kAttnResMaxCandidates];
};

// Sums v over the block; every thread gets the result. `red` holds kWarps x n floats.
template <int N>
__device__ __forceinline__ void block_sums(float (&v)[N], int n, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if (i < n) {
      v[i] = detail::warp_sum(v[i]);
      if (lane == 0) red[warp * N + i] = v[i];
    }
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if (i < n) {
      float s = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) s += red[w * N + i];
      v[i] = s;
    }
  }
  __syncthreads();
}

template <int VPT>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads)
    attn_res_kernel(Candidates cand, int count, int64_t ld_in, int hidden, const float* __restrict__ u, float res_eps,
                    const bf16* __restrict__ norm_w, float norm_eps, bf16* mixed, bf16* normed, int64_t ld_out) {
  extern __shared__ uint4 stage[];  // [count][my vectors]
  __shared__ float red[kWarps * kStats];
  __shared__ float stats[kStats];  // this block's partial sums, read by the other block
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank();
  const int64_t token = blockIdx.x >> 1;
  const int vectors = hidden / 8;
  const int first = rank == 0 ? 0 : (vectors + 1) / 2;
  const int mine = rank == 0 ? (vectors + 1) / 2 : vectors / 2;

  // One thread hands the copies to the bulk-copy engine (one contiguous slice per candidate, each on its
  // own barrier): the block's threads never wait on issuing loads, the whole token is in flight at once,
  // and the statistics of candidate i are computed while the later ones are still arriving.
  __shared__ __align__(8) uint64_t bars[kAttnResMaxCandidates];
  if (threadIdx.x == 0) {
    for (int i = 0; i < count; ++i) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(detail::smem_addr(&bars[i])) : "memory");
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#pragma unroll
    for (int i = 0; i < kAttnResMaxCandidates; ++i) {
      if (i < count) {
        const uint32_t bar = detail::smem_addr(&bars[i]);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
                     "r"(static_cast<uint32_t>(mine * 16))
                     : "memory");
        if (mine > 0) {
          const bf16* row = cand.p[i] + token * ld_in + static_cast<int64_t>(first) * 8;
          asm volatile(
              "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                  detail::smem_addr(stage + i * mine)),
              "l"(row), "r"(static_cast<uint32_t>(mine * 16)), "r"(bar)
              : "memory");
        }
      }
    }
  }
  float uf[VPT][8];
#pragma unroll
  for (int v = 0; v < VPT; ++v) {
    const int vi = threadIdx.x + v * kThreads;
    if (vi < mine) {
      const float4 a = __ldg(reinterpret_cast<const float4*>(u + (first + vi) * 8));
      const float4 b = __ldg(reinterpret_cast<const float4*>(u + (first + vi) * 8 + 4));
      uf[v][0] = a.x, uf[v][1] = a.y, uf[v][2] = a.z, uf[v][3] = a.w;
      uf[v][4] = b.x, uf[v][5] = b.y, uf[v][6] = b.z, uf[v][7] = b.w;
    }
  }
  __syncthreads();  // the barriers are initialized

  float part[kStats];
#pragma unroll
  for (int i = 0; i < kStats; ++i) part[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < kAttnResMaxCandidates; ++i) {
    if (i < count) {
      asm volatile(
          "{\n.reg .pred p;\nWAIT:\n"
          "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0;\n"
          "@p bra DONE;\nbra WAIT;\nDONE:\n}\n" ::"r"(detail::smem_addr(&bars[i]))
          : "memory");
      // Two partial sums per statistic: half the length of the dependent FMA chains.
      float ss[2] = {0.0f, 0.0f}, dot[2] = {0.0f, 0.0f};
#pragma unroll
      for (int v = 0; v < VPT; ++v) {
        const int vi = threadIdx.x + v * kThreads;
        if (vi < mine) {
          float f[8];
          detail::unpack8(stage[i * mine + vi], f);
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            ss[j & 1] = fmaf(f[j], f[j], ss[j & 1]);
            dot[j & 1] = fmaf(f[j], uf[v][j], dot[j & 1]);
          }
        }
      }
      part[2 * i] = ss[0] + ss[1];
      part[2 * i + 1] = dot[0] + dot[1];
    }
  }
  block_sums(part, 2 * count, red);
  if (threadIdx.x == 0) {
#pragma unroll
    for (int i = 0; i < kStats; ++i) stats[i] = part[i];
  }
  cluster.sync();
  const float* other = cluster.map_shared_rank(stats, rank ^ 1);
  float alpha[kAttnResMaxCandidates] = {};
  float smax = -INFINITY;
#pragma unroll
  for (int i = 0; i < kAttnResMaxCandidates; ++i) {
    if (i < count) {
      // Both blocks add in rank order, so they compute bit-identical weights.
      const float ss = rank == 0 ? part[2 * i] + other[2 * i] : other[2 * i] + part[2 * i];
      const float dot = rank == 0 ? part[2 * i + 1] + other[2 * i + 1] : other[2 * i + 1] + part[2 * i + 1];
      alpha[i] = dot / sqrtf(ss / static_cast<float>(hidden) + res_eps);
      smax = fmaxf(smax, alpha[i]);
    }
  }
  float denom = 0.0f;
#pragma unroll
  for (int i = 0; i < kAttnResMaxCandidates; ++i) {
    if (i < count) {
      alpha[i] = expf(alpha[i] - smax);
      denom += alpha[i];
    }
  }
#pragma unroll
  for (int i = 0; i < kAttnResMaxCandidates; ++i) alpha[i] /= denom;  // zeros past `count`

  float h[VPT][8];
  float ss[1] = {0.0f};
#pragma unroll
  for (int v = 0; v < VPT; ++v) {
    const int vi = threadIdx.x + v * kThreads;
    if (vi < mine) {
#pragma unroll
      for (int j = 0; j < 8; ++j) h[v][j] = 0.0f;
#pragma unroll
      for (int i = 0; i < kAttnResMaxCandidates; ++i) {
        if (i < count) {
          float f[8];
          detail::unpack8(stage[i * mine + vi], f);
#pragma unroll
          for (int j = 0; j < 8; ++j) h[v][j] += alpha[i] * f[j];
        }
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        h[v][j] = detail::round_bf16(h[v][j]);
        ss[0] += h[v][j] * h[v][j];
      }
      if (mixed) detail::store16(mixed + token * ld_out + (first + vi) * 8, detail::pack8(h[v]));
    }
  }
  block_sums(ss, 1, red);
  // The other block has read our stats (it passed the first cluster barrier and read before the second):
  // reuse the slot for the norm's partial sum.
  cluster.sync();
  if (threadIdx.x == 0) stats[0] = ss[0];
  cluster.sync();
  const float total = rank == 0 ? ss[0] + other[0] : other[0] + ss[0];
  const float rs = 1.0f / sqrtf(total / static_cast<float>(hidden) + norm_eps);
#pragma unroll
  for (int v = 0; v < VPT; ++v) {
    const int vi = threadIdx.x + v * kThreads;
    if (vi < mine) {
      float wf[8], y[8];
      detail::unpack8(detail::ldg16(norm_w + (first + vi) * 8), wf);
#pragma unroll
      for (int j = 0; j < 8; ++j) y[j] = detail::round_bf16(h[v][j] * rs) * wf[j];
      detail::store16(normed + token * ld_out + (first + vi) * 8, detail::pack8(y));
    }
  }
  cluster.sync();  // keep our shared memory alive until the other block has read it
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
  attn_res_kernel<VPT><<<static_cast<unsigned>(2 * tokens), kThreads, smem, stream>>>(
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
  const int64_t half = (hidden / 8 + 1) / 2;  // vectors of the first block of a token's cluster
  const int64_t smem = static_cast<int64_t>(count) * half * 16;
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
  const int vpt = static_cast<int>((half + kThreads - 1) / kThreads);
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
