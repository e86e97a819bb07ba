#include "kimirt/runtime/cpu_moe.h"

#include <algorithm>
#include <vector>

#include "kimirt/base/error.h"
#include "kimirt/cpu/matmul.h"
#include "kimirt/cpu/mlp.h"
#include "kimirt/cpu/moe.h"
#include "kimirt/cpu/norm.h"
#include "kimirt/cpu/router.h"

namespace kimirt::runtime {
namespace {

void add_into(float* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

// Ranks r < g hold the g distinct shards of the shared experts (shard = r mod g); the rest hold copies.
bool contributes_shared(const model::ModelConfig& c, const CpuLocalDims& dims, const model::ParallelMapping& m) {
  if (dims.shared_intermediate == 0 || m.attention_dp) return true;
  const int64_t g = c.shared_intermediate_size() / dims.shared_intermediate;
  return m.tp_rank < g;
}

}  // namespace

CpuMoe::CpuMoe(const model::ModelConfig& config, const CpuLocalDims& dims, const model::ParallelMapping& mapping,
               MoeComm mode, Comm& comm)
    : config_(config),
      dims_(dims),
      mode_(mapping.attention_dp ? MoeComm::kAllToAll : mode),
      attention_dp_(mapping.attention_dp),
      shared_contributor_(contributes_shared(config, dims, mapping)),
      comm_(comm) {
  if (mode_ == MoeComm::kAllToAll && config.num_experts > 0) {
    KIMIRT_CHECK(mapping.ep_size == mapping.tp_size,
                 "MoE: the all-to-all path needs whole experts on every rank (ep == tp), got {}", mapping.str());
    exchange_.emplace(comm, config.num_experts);
  }
}

void CpuMoe::forward(int layer, const CpuLayerWeights& w, const float* x, int64_t tokens, float* out, RouteTrace* trace,
                     OpTracer* tracer) {
  const int64_t H = config_.hidden_size, k = dims_.router.top_k;
  if (tracer) tracer->on_point(TracePoint::kMoeBegin, layer, {x, static_cast<size_t>(tokens * H)}, tokens, H);
  // The router is replicated: every rank picks the same experts for the same token.
  ids_.resize(static_cast<size_t>(tokens * k));
  weights_.resize(ids_.size());
  if (tokens > 0) cpu::route(dims_.router, w.router, x, tokens, H, ids_.data(), weights_.data());
  if (trace) {
    trace->top_k = k;
    trace->expert_ids = ids_;
    trace->weights = weights_;
  }
  if (mode_ == MoeComm::kDirect) {
    direct(layer, w, x, tokens, out, tracer);
  } else {
    exchanged(layer, w, x, tokens, out, tracer);
  }
  if (tracer) tracer->on_point(TracePoint::kMoeEnd, layer, {out, static_cast<size_t>(tokens * H)}, tokens, H);
}

void CpuMoe::shared_partial(const CpuLayerWeights& w, const float* x, int64_t tokens, float* dst) {
  const int64_t H = config_.hidden_size;
  if (shared_contributor_) {
    cpu::gated_mlp({H, dims_.shared_intermediate}, w.shared, dims_.act, x, tokens, dst);
  } else {
    std::fill(dst, dst + tokens * H, 0.0f);  // a copy of a shard that a lower rank already adds
  }
}

void CpuMoe::finish_latent(int layer, const CpuLayerWeights& w, float* latent, int64_t rows, float* out,
                           OpTracer* tracer) {
  const int64_t H = config_.hidden_size, width = dims_.expert_width;
  if (config_.latent_moe_use_norm) {
    if (tracer) {
      tracer->on_point(TracePoint::kLatentNorm, layer, {latent, static_cast<size_t>(rows * width)}, rows, width);
    }
    cpu::rms_norm(latent, w.latent_norm, latent, rows, width, dims_.rms_norm_eps);
  }
  cpu::matmul(latent, w.latent_up, out, rows, H, width);
}

void CpuMoe::direct(int layer, const CpuLayerWeights& w, const float* x, int64_t tokens, float* out, OpTracer* tracer) {
  const int64_t H = config_.hidden_size, width = dims_.expert_width;
  const bool shared = dims_.shared_intermediate > 0;

  if (!config_.latent_moe()) {
    // Both branches are in model space: summed locally, then one reduction.
    cpu::routed_experts(shard(w), H, dims_.expert_intermediate, dims_.act, x, tokens, ids_.data(), weights_.data(),
                        dims_.router.top_k, out);
    if (shared) {
      shared_.resize(static_cast<size_t>(tokens * H));
      shared_partial(w, x, tokens, shared_.data());
      add_into(out, shared_.data(), tokens * H);
    }
    comm_.all_reduce_sum(out, static_cast<size_t>(tokens * H), DType::kF32);
    return;
  }

  // [shared partial (tokens × H) | routed latent partial (tokens × width)] in one buffer, one all-reduce.
  const int64_t shared_size = shared ? tokens * H : 0;
  partial_.resize(static_cast<size_t>(shared_size + tokens * width));
  float* routed = partial_.data() + shared_size;
  z_.resize(static_cast<size_t>(tokens * width));
  cpu::matmul(x, w.latent_down, z_.data(), tokens, width, H);
  cpu::routed_experts(shard(w), width, dims_.expert_intermediate, dims_.act, z_.data(), tokens, ids_.data(),
                      weights_.data(), dims_.router.top_k, routed);
  if (shared) shared_partial(w, x, tokens, partial_.data());
  comm_.all_reduce_sum(partial_.data(), partial_.size(), DType::kF32);

  // The latent is complete only now: normalize, project up, add the shared result.
  finish_latent(layer, w, routed, tokens, out, tracer);
  if (shared) add_into(out, partial_.data(), tokens * H);
}

cpu::ExpertShard CpuMoe::shard(const CpuLayerWeights& w) const {
  return {w.experts, w.first_expert, config_.num_experts};
}

void CpuMoe::run_received(const CpuLayerWeights& w) {
  const int64_t n = exchange_->received(), width = dims_.expert_width;
  const float* in = exchange_->received_rows();
  float* res = exchange_->results();
  const int64_t ran = cpu::run_expert_rows(
      shard(w), {width, dims_.expert_intermediate}, dims_.act, exchange_->received_experts(), n,
      [&](int64_t i) { return in + i * width; },
      [&](int64_t i, const float* out) { std::copy_n(out, width, res + i * width); });
  KIMIRT_ASSERT(ran == n);  // the exchange delivers only this rank's experts' rows
}

void CpuMoe::exchanged(int layer, const CpuLayerWeights& w, const float* x, int64_t tokens, float* out,
                       OpTracer* tracer) {
  const int64_t H = config_.hidden_size, width = dims_.expert_width, k = dims_.router.top_k;
  const bool shared = dims_.shared_intermediate > 0;
  KIMIRT_ASSERT(exchange_.has_value());
  // Under attention-DP the rank's tokens are its own; otherwise every rank has all of them and takes a share.
  const TokenShare share = attention_dp_ ? TokenShare{0, tokens} : token_share(tokens, comm_.size(), comm_.rank());
  const int64_t n = share.size();
  const float* xs = x + share.begin * H;
  const int32_t* ids = ids_.data() + share.begin * k;
  const float* wts = weights_.data() + share.begin * k;

  if (shared) {
    // The shared experts' own reduction (none when they are replicated under attention-DP).
    shared_.resize(static_cast<size_t>(tokens * H));
    shared_partial(w, x, tokens, shared_.data());
    if (!attention_dp_) comm_.all_reduce_sum(shared_.data(), shared_.size(), DType::kF32);
  }

  const float* rows = xs;  // what travels: the latent (K3) or the token itself (Kimi Linear)
  if (config_.latent_moe()) {
    z_.resize(static_cast<size_t>(n * width));
    cpu::matmul(xs, w.latent_down, z_.data(), n, width, H);
    rows = z_.data();
  }
  exchange_->dispatch(rows, n, width, ids, k);
  run_received(w);
  pairs_.resize(static_cast<size_t>(n * k * width));
  exchange_->combine(pairs_.data());

  // Each token's weighted sum over its experts in id order, the order of the unsharded block.
  latent_.assign(static_cast<size_t>(n * width), 0.0f);
  slots_.resize(static_cast<size_t>(k));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < k; ++j) slots_[static_cast<size_t>(j)] = j;
    std::sort(slots_.begin(), slots_.end(), [&](int64_t a, int64_t b) { return ids[t * k + a] < ids[t * k + b]; });
    float* dst = latent_.data() + t * width;
    for (int64_t j : slots_) {
      const float wgt = wts[t * k + j];
      const float* src = pairs_.data() + (t * k + j) * width;
      for (int64_t i = 0; i < width; ++i) dst[i] += wgt * src[i];
    }
  }

  // The routed result of the share lands in its rows of the step's output.
  float* routed_out = out;
  if (!attention_dp_) {
    full_.assign(static_cast<size_t>(tokens * H), 0.0f);
    routed_out = full_.data() + share.begin * H;
  }
  if (config_.latent_moe()) {
    finish_latent(layer, w, latent_.data(), n, routed_out, tracer);
  } else {
    std::copy_n(latent_.data(), n * H, routed_out);
  }
  if (!attention_dp_) {
    // Token shares reassembled: each element has exactly one non-zero term, so the sum is exact.
    comm_.all_reduce_sum(full_.data(), full_.size(), DType::kF32);
    std::copy(full_.begin(), full_.end(), out);
  }
  if (shared) add_into(out, shared_.data(), tokens * H);
}

}  // namespace kimirt::runtime
