// Sampling kernel: one block of 1024 threads per row; every pass re-reads the row (it stays in L2).
#include "kimirt/cuda/check.h"
#include "kimirt/cuda/device_utils.cuh"
#include "kimirt/cuda/philox.cuh"
#include "kimirt/cuda/sampling.h"

namespace kimirt::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;

// Order-preserving map of floats to unsigned keys (larger float, larger key); NaN sorts lowest.
__device__ __forceinline__ uint32_t order_key(float f) {
  if (isnan(f)) return 0u;
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ bool pair_better(float a, int ia, float b, int ib) { return a > b || (a == b && ia < ib); }

// Block-wide (value, id) argmax, ties to the lower id; result valid in every thread.
__device__ void block_argmax(float& v, int& id, float* sv, int* si) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, id, o);
    if (pair_better(ov, oi, v, id)) v = ov, id = oi;
  }
  if (lane == 0) sv[warp] = v, si[warp] = id;
  __syncthreads();
  v = sv[lane];
  id = si[lane];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, id, o);
    if (pair_better(ov, oi, v, id)) v = ov, id = oi;
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads, 1)
    sample_kernel(const float* __restrict__ logits, int64_t ld, int vocab, int64_t vocab_offset,
                  const SamplingParams* __restrict__ params, int32_t* __restrict__ out_ids, float* out_scores) {
  __shared__ float sv[kWarps];
  __shared__ int si[kWarps];
  __shared__ unsigned long long hist[256];
  __shared__ uint32_t sel_bin;
  __shared__ unsigned long long sel_rest;
  const int64_t row = blockIdx.x;
  const float* z = logits + row * ld;
  const SamplingParams p = params[row];
  const bool greedy = !(p.temperature > 0.0f) || p.top_k == 1;
  const float inv_t = greedy ? 1.0f : 1.0f / p.temperature;

  // Pass 1: max (and argmax for greedy).
  float best = -INFINITY;
  int best_id = 0x7fffffff;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = isnan(z[i]) ? -INFINITY : z[i];
    if (pair_better(v, i, best, best_id)) best = v, best_id = i;
  }
  block_argmax(best, best_id, sv, si);
  if (greedy) {
    if (threadIdx.x == 0) {
      out_ids[row] = static_cast<int32_t>(vocab_offset + (best_id == 0x7fffffff ? 0 : best_id));
      if (out_scores) out_scores[row] = best;
    }
    return;
  }
  const float zmax = best * inv_t;

  // Top-k threshold on keys of z (the order of z/T equals the order of z for T > 0).
  uint32_t tau = 0;  // keep key >= tau
  if (p.top_k > 0 && p.top_k < vocab) {
    uint32_t prefix = 0, mask = 0;
    unsigned long long remaining = static_cast<unsigned long long>(p.top_k);
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int b = threadIdx.x; b < 256; b += kThreads) hist[b] = 0;
      __syncthreads();
      for (int i = threadIdx.x; i < vocab; i += kThreads) {
        const uint32_t key = order_key(z[i]);
        if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1ull);
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        unsigned long long cum = 0;
        int b = 255;
        for (; b > 0; --b) {
          if (cum + hist[b] >= remaining) break;
          cum += hist[b];
        }
        sel_bin = static_cast<uint32_t>(b);
        sel_rest = remaining - cum;
      }
      __syncthreads();
      prefix |= sel_bin << shift;
      mask |= 255u << shift;
      remaining = sel_rest;
      __syncthreads();
    }
    tau = prefix;
  }

  // Top-p threshold on the mass of the top-k survivors, in 2^-32 fixed point.
  if (p.top_p < 1.0f) {
    unsigned long long part = 0;
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      const uint32_t key = order_key(z[i]);
      if (key >= tau) part += __float2ull_rn(exp2f((z[i] * inv_t - zmax) * 1.4426950408889634f) * 4294967296.0f);
    }
    for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
    if (threadIdx.x == 0) hist[0] = 0;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) atomicAdd(&hist[0], part);
    __syncthreads();
    const unsigned long long total = hist[0];
    const unsigned long long target =
        static_cast<unsigned long long>(ceil(static_cast<double>(p.top_p) * static_cast<double>(total)));
    __syncthreads();
    uint32_t prefix = 0, mask = 0;
    unsigned long long above = 0;  // mass of keys strictly above the current prefix range
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int b = threadIdx.x; b < 256; b += kThreads) hist[b] = 0;
      __syncthreads();
      for (int i = threadIdx.x; i < vocab; i += kThreads) {
        const uint32_t key = order_key(z[i]);
        if (key >= tau && (key & mask) == prefix) {
          atomicAdd(&hist[(key >> shift) & 255u],
                    __float2ull_rn(exp2f((z[i] * inv_t - zmax) * 1.4426950408889634f) * 4294967296.0f));
        }
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        unsigned long long cum = above;
        int b = 255;
        for (; b > 0; --b) {
          if (cum + hist[b] >= target) break;
          cum += hist[b];
        }
        sel_bin = static_cast<uint32_t>(b);
        sel_rest = cum;
      }
      __syncthreads();
      prefix |= sel_bin << shift;
      mask |= 255u << shift;
      above = sel_rest;
      __syncthreads();
    }
    tau = max(tau, prefix);
  }
  const float zmin = p.min_p > 0.0f ? zmax + logf(p.min_p) : -INFINITY;

  // Gumbel-max over the kept set.
  float win = -INFINITY;
  int win_id = 0x7fffffff;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const float zi = z[i] * inv_t;
    if (order_key(z[i]) < tau || !(zi >= zmin)) continue;
    const detail::Philox4 r =
        detail::philox4x32_10(detail::Philox4{static_cast<uint32_t>(vocab_offset + i), static_cast<uint32_t>(p.step),
                                              static_cast<uint32_t>(p.step >> 32), 0x53414d50u},
                              p.seed);
    const float u = detail::uniform_open01(r.x);
    const float score = zi - logf(-logf(u));
    if (pair_better(score, i, win, win_id)) win = score, win_id = i;
  }
  block_argmax(win, win_id, sv, si);
  if (threadIdx.x == 0) {
    out_ids[row] = static_cast<int32_t>(vocab_offset + (win_id == 0x7fffffff ? best_id : win_id));
    if (out_scores) out_scores[row] = win;
  }
}

}  // namespace

void validate(const SamplingParams& p) {
  KIMIRT_CUDA_REQUIRE(p.temperature >= 0.0f && p.temperature < 1e30f, "sampling: temperature ", p.temperature,
                      " must be finite and >= 0");
  KIMIRT_CUDA_REQUIRE(p.top_k >= 0, "sampling: top_k ", p.top_k, " must be >= 0");
  KIMIRT_CUDA_REQUIRE(p.top_p > 0.0f && p.top_p <= 1.0f, "sampling: top_p ", p.top_p, " must be in (0, 1]");
  KIMIRT_CUDA_REQUIRE(p.min_p >= 0.0f && p.min_p < 1.0f, "sampling: min_p ", p.min_p, " must be in [0, 1)");
}

void sample(cudaStream_t stream, const float* logits, int64_t ld, int64_t rows, int64_t vocab, int64_t vocab_offset,
            const SamplingParams* params, int32_t* out_ids, float* out_scores) {
  KIMIRT_CUDA_REQUIRE(rows >= 0 && rows < (1ll << 31) && vocab > 0 && vocab < (1ll << 31) && ld >= vocab,
                      "sample: rows ", rows, ", vocab ", vocab, ", row stride ", ld);
  if (rows == 0) return;
  KIMIRT_CUDA_REQUIRE(logits && params && out_ids, "sample: null pointer");
  sample_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, ld, static_cast<int>(vocab), vocab_offset,
                                                                      params, out_ids, out_scores);
  KIMIRT_CUDA_CHECK_LAUNCH();
}

}  // namespace kimirt::cuda
