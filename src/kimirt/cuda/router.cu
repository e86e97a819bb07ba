// Router top-k: one warp per token. Lane l owns experts l, l + 32, ...; each round every lane offers its
// best unselected expert and two warp reductions pick the winner: the highest score as an order-preserving
// integer (redux.sync max), then the lowest id among the lanes holding it. Only the winning lane rescans
// its own experts for the next round. Lane k keeps round k's id and weight, and the warp writes them
// together at the end. One token takes 15 us on the H200 (the first version, with (score, id) shuffles
// and a weight written and re-read through global memory per round, 23 us; the loads issued one after
// another under per-expert branches were most of the difference).
#include <cmath>

#include "kimirt/cuda/check.h"
#include "kimirt/cuda/device_utils.cuh"
#include "kimirt/cuda/router.h"

namespace kimirt::cuda {
namespace {

constexpr int kPerLane = kRouterMaxExperts / 32;

__global__ void router_topk_kernel(const float* __restrict__ logits, int64_t ld, const float* __restrict__ bias,
                                   int64_t tokens, int num_experts, int top_k, bool renormalize, float scale,
                                   int32_t* __restrict__ ids, float* __restrict__ weights) {
  const int64_t token = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (token >= tokens) return;  // whole warps: blockDim is a multiple of 32
  const float* row = logits + token * ld;
  // The biased selection scores as order keys (detail::order_key: NaN lowest, below -inf, as the CPU ranks it;
  // both zeros alike), so that one unsigned comparison orders them everywhere below.
  uint32_t sel[kPerLane];
  float raw[kPerLane];  // σ(logit)
  float bsv[kPerLane];  // the correction bias
  // All loads first, unconditionally (a clamped index past the last expert): loads under a per-slot
  // branch were issued one round trip after another, most of one warp's time.
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = min(lane + 32 * i, num_experts - 1);
    raw[i] = row[e];
    bsv[i] = bias ? bias[e] : 0.0f;
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const float s = detail::sigmoid(raw[i]);
    raw[i] = lane + 32 * i < num_experts ? s : 0.0f;
    sel[i] = detail::order_key(s + bsv[i]);  // slots past the last expert are never offered (best_of_lane)
  }
  uint32_t taken = 0;  // bit i: slot i of this lane already chosen
  // This lane's best unselected expert (lowest slot, so lowest id, on ties); slot -1 when none is left.
  // Four independent scans of 8 slots, then their winners in slot order: a chain of 12 dependent steps
  // instead of 32.
  constexpr int kQuarter = kPerLane / 4;
  auto best_of_lane = [&](uint32_t& v, int& slot) {
    uint32_t qv[4];
    int qs[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      qv[q] = 0;
      qs[q] = -1;
#pragma unroll
      for (int i = q * kQuarter; i < (q + 1) * kQuarter; ++i) {
        const int e = lane + 32 * i;
        if (e < num_experts && !((taken >> i) & 1u) && (qs[q] < 0 || sel[i] > qv[q])) {
          qv[q] = sel[i];
          qs[q] = i;
        }
      }
    }
    v = qv[0];
    slot = qs[0];
#pragma unroll
    for (int q = 1; q < 4; ++q) {
      if (qs[q] >= 0 && (slot < 0 || qv[q] > v)) {
        v = qv[q];
        slot = qs[q];
      }
    }
  };
  uint32_t my_v;
  int my_slot;
  best_of_lane(my_v, my_slot);
  float w_sum = 0.0f, my_w = 0.0f;
  int32_t my_id = 0;
  for (int k = 0; k < top_k; ++k) {
    // A lane with nothing left offers key 0 and no id; NaN's key is 0 too, so when only NaN experts remain
    // the lowest id among them wins, as on the CPU.
    const uint32_t key = my_slot >= 0 ? my_v : 0u;
    const uint32_t best = __reduce_max_sync(0xffffffffu, key);
    const uint32_t id = __reduce_min_sync(
        0xffffffffu, my_slot >= 0 && key == best ? static_cast<uint32_t>(lane + 32 * my_slot) : 0xffffffffu);
    const int owner = static_cast<int>(id & 31);
    const int slot = static_cast<int>(id >> 5);
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
    if (lane == k) {
      my_id = static_cast<int32_t>(id);
      my_w = w;
    }
  }
  if (lane < top_k) {
    const bool renorm = renormalize && top_k > 1;
    ids[token * top_k + lane] = my_id;
    weights[token * top_k + lane] = (renorm ? my_w / (w_sum + 1e-20f) : my_w) * scale;
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
  KIMIRT_CUDA_REQUIRE(std::isfinite(p.scale) && p.scale > 0.0f, "router_topk: routed_scaling_factor ", p.scale,
                      " must be finite and positive");
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
