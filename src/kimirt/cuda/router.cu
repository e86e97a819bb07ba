// Router top-k: one warp per token. Lane l owns experts l, l + 32, ...; each round every lane offers its
// best unselected expert and a shuffle reduction picks the winner (higher score, then lower id). Only the
// winning lane rescans its own experts for the next round.
#include "kimirt/cuda/check.h"
#include "kimirt/cuda/device_utils.cuh"
#include "kimirt/cuda/router.h"

namespace kimirt::cuda {
namespace {

constexpr int kPerLane = kRouterMaxExperts / 32;

__device__ __forceinline__ bool better(float a, int ia, float b, int ib) { return a > b || (a == b && ia < ib); }

__global__ void router_topk_kernel(const float* __restrict__ logits, int64_t ld, const float* __restrict__ bias,
                                   int64_t tokens, int num_experts, int top_k, bool renormalize, float scale,
                                   int32_t* __restrict__ ids, float* __restrict__ weights) {
  const int64_t token = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (token >= tokens) return;
  const float* row = logits + token * ld;
  float sel[kPerLane];  // biased selection scores; -inf once chosen or absent
  float raw[kPerLane];  // σ(logit)
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    if (e < num_experts) {
      const float s = detail::sigmoid(row[e]);
      const float c = s + (bias ? bias[e] : 0.0f);
      raw[i] = s;
      sel[i] = isnan(c) ? -INFINITY : c;
    } else {
      raw[i] = 0.0f;
      sel[i] = -INFINITY;
    }
  }
  uint32_t taken = 0;  // bit i: slot i of this lane already chosen
  auto best_of_lane = [&](float& v, int& slot) {
    v = -INFINITY;
    slot = -1;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + 32 * i;
      if (e < num_experts && !((taken >> i) & 1u) && (slot < 0 || sel[i] > v)) {
        v = sel[i];
        slot = i;
      }
    }
  };
  float my_v;
  int my_slot;
  best_of_lane(my_v, my_slot);
  float w_sum = 0.0f;
  int32_t* out_ids = ids + token * top_k;
  float* out_w = weights + token * top_k;
  for (int k = 0; k < top_k; ++k) {
    float v = my_v;
    int id = my_slot >= 0 ? lane + 32 * my_slot : 0x7fffffff;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, v, o);
      const int oid = __shfl_xor_sync(0xffffffffu, id, o);
      if (better(ov, oid, v, id)) {
        v = ov;
        id = oid;
      }
    }
    const int owner = id & 31;
    const int slot = id >> 5;
    float w = 0.0f;
    if (lane == owner) {
      taken |= 1u << slot;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        if (i == slot) w = raw[i];  // static indices keep raw[] in registers
      }
      best_of_lane(my_v, my_slot);
    }
    w = __shfl_sync(0xffffffffu, w, owner);
    w_sum += w;
    if (lane == 0) {
      out_ids[k] = id;
      out_w[k] = w;
    }
  }
  if (lane == 0) {
    const bool renorm = renormalize && top_k > 1;
    for (int k = 0; k < top_k; ++k) out_w[k] = (renorm ? out_w[k] / (w_sum + 1e-20f) : out_w[k]) * scale;
  }
}

}  // namespace

void router_topk(cudaStream_t stream, const float* logits, int64_t ld, const float* bias, int64_t tokens,
                 const RouterParams& p, int32_t* ids, float* weights) {
  KIMIRT_CUDA_REQUIRE(p.num_experts > 0 && p.num_experts <= kRouterMaxExperts, "router_topk: num_experts ",
                      p.num_experts, " must be in [1, ", kRouterMaxExperts, "]");
  KIMIRT_CUDA_REQUIRE(p.top_k > 0 && p.top_k <= kRouterMaxTopK && p.top_k <= p.num_experts,
                      "router_topk: num_experts_per_token ", p.top_k, " must be in [1, min(", kRouterMaxTopK,
                      ", num_experts ", p.num_experts, ")]");
  KIMIRT_CUDA_REQUIRE(ld >= p.num_experts, "router_topk: logits row stride ", ld, " < num_experts ", p.num_experts);
  KIMIRT_CUDA_REQUIRE(tokens >= 0, "router_topk: token count ", tokens);
  if (tokens == 0) return;
  KIMIRT_CUDA_REQUIRE(logits && ids && weights, "router_topk: null pointer");
  const int threads = 128;
  const int64_t blocks = (tokens * 32 + threads - 1) / threads;
  KIMIRT_CUDA_REQUIRE(blocks < (1ll << 31), "router_topk: too many tokens");
  router_topk_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
      logits, ld, bias, tokens, p.num_experts, p.top_k, p.renormalize, p.scale, ids, weights);
  KIMIRT_CUDA_CHECK_LAUNCH();
}

}  // namespace kimirt::cuda
