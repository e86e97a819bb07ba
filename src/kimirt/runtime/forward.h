// The forward pass over one step's batch, written once as the model's structure and run on any Backend:
//   embed → per layer (AttnRes mix → input norm → KDA/MLA → AttnRes mix → post-attention norm → FFN)
//   → final AttnRes mix → norm → LM head.
// Kimi Linear (no AttnRes) is the same with the plain residual stream in place of the mixes (§2 of the spec).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "kimirt/runtime/backend.h"
#include "kimirt/runtime/batch.h"

namespace kimirt::runtime {

// Where the forward can show an activation [tokens, hidden] of the whole packed batch.
enum class Tap : uint8_t {
  kEmbedding,  // embedding output (layer -1)
  kMixerIn,    // after the pre-mixer AttnRes mix and input_layernorm
  kMixerOut,   // KDA/MLA output
  kFfnIn,      // after the pre-FFN AttnRes mix and post_attention_layernorm
  kFfnOut,     // dense MLP / MoE output
  kResidual,   // the running residual prefix after the layer (the whole residual stream without AttnRes)
  kFinalNorm,  // after the final mix and norm (layer -1)
};

std::string_view tap_name(Tap tap);

// A hook for tests and debugging: the forward asks before copying anything to the host, so an observer
// that wants nothing costs nothing.
class ForwardObserver {
 public:
  virtual ~ForwardObserver() = default;
  virtual bool wants(Tap tap, int layer) const = 0;
  // data [rows, cols], valid during the call.
  virtual void on_activation(Tap tap, int layer, std::span<const float> data, int64_t rows, int64_t cols) = 0;
  virtual bool wants_routes(int /*layer*/) const { return false; }
  virtual void on_routes(int /*layer*/, const RouteTrace& /*trace*/) {}
};

class Forward {
 public:
  explicit Forward(Backend& backend) : backend_(backend) {}

  // Runs the model over the batch; every sequence's cache advances by its tokens. Returns the logits
  // [batch.logit_rows, vocab] in backend memory (an empty buffer when the batch asks for none). A batch of no
  // sequences runs every op on zero tokens, collectives included (a rank without work under attention-DP).
  ActBuffer run(const StepBatch& batch, ForwardObserver* observer = nullptr);

  Backend& backend() { return backend_; }

 private:
  Backend& backend_;
};

}  // namespace kimirt::runtime
