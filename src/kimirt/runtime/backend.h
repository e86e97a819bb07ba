// The interface between the forward (the model's structure, written once) and a backend (the CPU reference
// or CUDA). Ops are coarse, one per block of the model, and run over every token of the current step;
// activations live in backend memory behind opaque handles, weights are bound inside the backend at
// construction and addressed by layer, never by name. Collectives across tensor/expert/data-parallel ranks
// happen inside the ops that need them, so the forward does not know how the model is sharded; it only calls
// every op on every rank in the same order, also on a step with no tokens.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "kimirt/model/config.h"
#include "kimirt/runtime/batch.h"
#include "kimirt/runtime/cache_manager.h"
#include "kimirt/runtime/sampler.h"

namespace kimirt::runtime {

// An activation [rows, cols] in backend memory (fp32 on the CPU).
struct Act {
  int32_t id = -1;
  bool valid() const { return id >= 0; }
};

enum class NormSite : uint8_t { kInput, kPostAttention, kFinal };  // input_layernorm, post_attention_layernorm, norm
enum class ResSite : uint8_t { kMixer, kFfn, kOutput };            // self_attention_res_*, mlp_res_*, output_attn_res_*

// The router's choice for every token of a MoE block, on the host: [tokens, top_k], ordered by decreasing
// biased score.
struct RouteTrace {
  int64_t top_k = 0;
  std::vector<int32_t> expert_ids;
  std::vector<float> weights;
};

// What Backend::sample gives for a row that holds no number to draw from.
inline constexpr int32_t kNoToken = -1;

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string_view name() const = 0;
  virtual const model::ModelConfig& config() const = 0;
  // The cache geometry the backend allocated; the engine's CacheManager hands out exactly these slots/blocks.
  virtual const CacheConfig& cache_config() const = 0;

  // Activations. release() of an invalid handle is a no-op.
  virtual Act alloc(int64_t rows, int64_t cols) = 0;
  virtual void release(Act a) = 0;
  virtual int64_t rows(Act a) const = 0;
  virtual int64_t cols(Act a) const = 0;

  // Binds the step's batch for the ops that follow until end_step(). Checks it first (token ids, slots,
  // block tables), throwing an Error that names the sequence, before any state changes.
  virtual void begin_step(const StepBatch& batch) = 0;
  virtual void end_step() = 0;

  // out[T, H] = embedding rows of the step's tokens.
  virtual void embed(Act out) = 0;
  // out = a + b (out may be a or b).
  virtual void add(Act a, Act b, Act out) = 0;
  // Block Attention Residuals: softmax mix over depth of the candidates (snapshots first, prefix last).
  // `layer` is ignored for ResSite::kOutput.
  virtual void attn_res_mix(int layer, ResSite site, std::span<const Act> candidates, Act out) = 0;
  // `layer` is ignored for NormSite::kFinal. out may be x.
  virtual void rms_norm(int layer, NormSite site, Act x, Act out) = 0;
  // Mixers over the packed sequences, each continuing from and advancing its cache. out must not be x.
  virtual void kda_mixer(int layer, Act x, Act out) = 0;
  virtual void mla_mixer(int layer, Act x, Act out) = 0;
  // FFNs. out must not be x. trace (optional) receives the router's choices.
  virtual void dense_mlp(int layer, Act x, Act out) = 0;
  virtual void moe_block(int layer, Act x, Act out, RouteTrace* trace) = 0;
  // out[n, cols] = x[rows[i], :].
  virtual void gather_rows(Act x, std::span<const int64_t> rows, Act out) = 0;
  // logits[n, vocab] = x[n, H] · lm_headᵀ, the whole vocabulary on every rank. Called on every step, with
  // n = 0 when the step wants no logits: with the vocabulary sharded it may be a collective.
  virtual void lm_head(Act x, Act logits) = 0;
  // tokens[i] = samplers[i]->sample(logits row rows[i]) (the row is not modified). When the ranks of a group
  // share the logits (attention-DP off), every rank returns the same tokens and records them in its samplers.
  // A row with no logit above -inf (NaN or -inf everywhere: a NaN weight, an overflow) gives kNoToken and is
  // not sampled: the engine ends its request with an error rather than emit a token drawn from nothing.
  virtual void sample(Act logits, std::span<const int64_t> rows, std::span<Sampler* const> samplers,
                      std::span<int32_t> tokens) = 0;
  // Copies rows [first_row, first_row + n) of a to the host (n × cols floats).
  virtual void to_host(Act a, int64_t first_row, int64_t n, std::span<float> out) const = 0;
};

// Owns an activation for a scope: released when it goes away.
class ActBuffer {
 public:
  ActBuffer() = default;
  ActBuffer(Backend& backend, int64_t rows, int64_t cols) : backend_(&backend), act_(backend.alloc(rows, cols)) {}
  ~ActBuffer() { reset(); }
  ActBuffer(ActBuffer&& o) noexcept : backend_(o.backend_), act_(std::exchange(o.act_, Act{})) {}
  ActBuffer& operator=(ActBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      backend_ = o.backend_;
      act_ = std::exchange(o.act_, Act{});
    }
    return *this;
  }
  ActBuffer(const ActBuffer&) = delete;
  ActBuffer& operator=(const ActBuffer&) = delete;

  Act get() const { return act_; }
  bool valid() const { return act_.valid(); }
  void reset() {
    if (backend_ && act_.valid()) backend_->release(act_);
    act_ = Act{};
  }
  void swap(ActBuffer& o) noexcept {
    std::swap(backend_, o.backend_);
    std::swap(act_, o.act_);
  }

 private:
  Backend* backend_ = nullptr;
  Act act_;
};

}  // namespace kimirt::runtime
