#include "kimirt/runtime/forward.h"

#include <vector>

#include "kimirt/base/error.h"

namespace kimirt::runtime {
namespace {

// end_step() on every way out of the forward, so a failed step never leaves a batch bound.
class StepScope {
 public:
  StepScope(Backend& backend, const StepBatch& batch) : backend_(backend) { backend_.begin_step(batch); }
  ~StepScope() { backend_.end_step(); }
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;

 private:
  Backend& backend_;
};

}  // namespace

std::string_view tap_name(Tap tap) {
  switch (tap) {
    case Tap::kEmbedding:
      return "embedding";
    case Tap::kMixerIn:
      return "mixer_in";
    case Tap::kMixerOut:
      return "mixer_out";
    case Tap::kFfnIn:
      return "ffn_in";
    case Tap::kFfnOut:
      return "ffn_out";
    case Tap::kResidual:
      return "residual";
    case Tap::kFinalNorm:
      return "final_norm";
  }
  return "?";
}

ActBuffer Forward::run(const StepBatch& batch, ForwardObserver* observer) {
  Backend& be = backend_;
  const model::ModelConfig& c = be.config();
  // T may be 0: under attention-DP a rank without work still runs the step, to join the other ranks'
  // collectives (MoE exchange, LM-head gather).
  const int64_t T = batch.num_tokens(), H = c.hidden_size;
  StepScope scope(be, batch);

  std::vector<float> host;
  auto tap = [&](Tap t, int layer, Act a) {
    if (!observer || !observer->wants(t, layer)) return;
    host.resize(static_cast<size_t>(T * H));
    be.to_host(a, 0, T, host);
    observer->on_activation(t, layer, host, T, H);
  };

  // P, the running prefix of the residual stream; with AttnRes also the bank of block snapshots.
  ActBuffer prefix(be, T, H);
  be.embed(prefix.get());
  tap(Tap::kEmbedding, -1, prefix.get());
  const bool attn_res = c.has_attn_res();
  std::vector<ActBuffer> bank;
  bool prefix_empty = false;
  auto candidates = [&] {
    std::vector<Act> v;
    for (const auto& b : bank) v.push_back(b.get());
    v.push_back(prefix.get());
    return v;
  };

  ActBuffer mixed(be, T, H), normed(be, T, H), out(be, T, H);
  RouteTrace trace;
  for (int l = 0; l < static_cast<int>(c.num_layers); ++l) {
    Act src = prefix.get();
    if (attn_res && !bank.empty()) {
      be.attn_res_mix(l, ResSite::kMixer, candidates(), mixed.get());
      src = mixed.get();
    }
    be.rms_norm(l, NormSite::kInput, src, normed.get());
    // A block boundary freezes the incoming prefix after the pre-mixer mix has read it; P restarts at ∅.
    if (attn_res && l % c.attn_res_block_size == 0) {
      bank.push_back(std::move(prefix));
      prefix_empty = true;
    }
    tap(Tap::kMixerIn, l, normed.get());
    if (c.is_kda_layer(l)) {
      be.kda_mixer(l, normed.get(), out.get());
    } else {
      be.mla_mixer(l, normed.get(), out.get());
    }
    tap(Tap::kMixerOut, l, out.get());
    if (prefix_empty) {
      prefix = std::move(out);
      out = ActBuffer(be, T, H);
      prefix_empty = false;
    } else {
      be.add(prefix.get(), out.get(), prefix.get());
    }

    src = prefix.get();
    if (attn_res) {
      be.attn_res_mix(l, ResSite::kFfn, candidates(), mixed.get());
      src = mixed.get();
    }
    be.rms_norm(l, NormSite::kPostAttention, src, normed.get());
    tap(Tap::kFfnIn, l, normed.get());
    if (c.is_moe_layer(l)) {
      const bool want_routes = observer && observer->wants_routes(l);
      be.moe_block(l, normed.get(), out.get(), want_routes ? &trace : nullptr);
      if (want_routes) observer->on_routes(l, trace);
    } else {
      be.dense_mlp(l, normed.get(), out.get());
    }
    tap(Tap::kFfnOut, l, out.get());
    be.add(prefix.get(), out.get(), prefix.get());
    tap(Tap::kResidual, l, prefix.get());
  }

  Act src = prefix.get();
  if (attn_res) {
    be.attn_res_mix(-1, ResSite::kOutput, candidates(), mixed.get());
    src = mixed.get();
  }
  be.rms_norm(-1, NormSite::kFinal, src, normed.get());
  tap(Tap::kFinalNorm, -1, normed.get());

  // The LM head runs even for no rows: it can be a collective that every rank must join.
  const std::vector<int64_t> rows = batch.logit_token_rows();
  const auto n = static_cast<int64_t>(rows.size());
  ActBuffer logits(be, n, c.vocab_size);
  if (n == T) {
    be.lm_head(normed.get(), logits.get());  // every token wants its row, in order
  } else {
    ActBuffer selected(be, n, H);
    be.gather_rows(normed.get(), rows, selected.get());
    be.lm_head(selected.get(), logits.get());
  }
  if (n == 0) return {};
  return logits;
}

}  // namespace kimirt::runtime
