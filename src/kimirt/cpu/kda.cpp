#include "kimirt/cpu/kda.h"

#include <cmath>

#include "kimirt/base/error.h"
#include "kimirt/cpu/kda_conv.h"
#include "kimirt/cpu/kda_gate.h"
#include "kimirt/cpu/kda_recurrence.h"
#include "kimirt/cpu/matmul.h"
#include "kimirt/cpu/norm.h"

namespace kimirt::cpu {
namespace {

// FLA's l2norm epsilon for q and k (inside the sum: x · (Σx² + 1e-6)^-½).
constexpr float kQkL2Eps = 1e-6f;

std::vector<float> buffer(int64_t n) { return std::vector<float>(static_cast<size_t>(n)); }

void check_weights(const KdaDims& dims, const KdaWeights& w) {
  auto need = [](const float* p, const char* name) { KIMIRT_CHECK(p != nullptr, "KDA: weight {} is missing", name); };
  need(w.q_proj, "q_proj");
  need(w.k_proj, "k_proj");
  need(w.v_proj, "v_proj");
  need(w.q_conv, "q_conv1d");
  need(w.k_conv, "k_conv1d");
  need(w.v_conv, "v_conv1d");
  need(w.f_a_proj, "f_a_proj");
  need(w.f_b_proj, "f_b_proj");
  need(w.b_proj, "b_proj");
  need(w.a_log, "A_log");
  need(w.dt_bias, "dt_bias");
  if (dims.full_rank_output_gate) {
    need(w.g_proj, "g_proj");
  } else {
    need(w.g_a_proj, "g_a_proj");
    need(w.g_b_proj, "g_b_proj");
  }
  need(w.o_norm, "o_norm");
  need(w.o_proj, "o_proj");
}

void check_state(const KdaDims& dims, const KdaState& s) {
  const auto conv = static_cast<size_t>(dims.channels() * (dims.conv_width - 1));
  const auto rec = static_cast<size_t>(dims.num_heads * dims.head_dim * dims.head_dim);
  KIMIRT_CHECK(s.conv_q.size() == conv && s.conv_k.size() == conv && s.conv_v.size() == conv,
               "KDA state: conv windows hold {}/{}/{} values, expected {} (channels × (conv width − 1))",
               s.conv_q.size(), s.conv_k.size(), s.conv_v.size(), conv);
  KIMIRT_CHECK(s.recurrent.size() == rec, "KDA state: recurrent state holds {} values, expected {} (heads × K × V)",
               s.recurrent.size(), rec);
}

}  // namespace

void validate(const KdaDims& dims) {
  KIMIRT_CHECK(dims.hidden > 0, "KDA: hidden_size must be positive, got {}", dims.hidden);
  KIMIRT_CHECK(dims.num_heads > 0, "KDA: linear_attn_config.num_heads must be positive, got {}", dims.num_heads);
  KIMIRT_CHECK(dims.head_dim > 0, "KDA: linear_attn_config.head_dim must be positive, got {}", dims.head_dim);
  KIMIRT_CHECK(dims.conv_width >= 1, "KDA: linear_attn_config.short_conv_kernel_size must be at least 1, got {}",
               dims.conv_width);
  KIMIRT_CHECK(!dims.gate_lower_bound || (std::isfinite(*dims.gate_lower_bound) && *dims.gate_lower_bound < 0.0f),
               "KDA: linear_attn_config.gate_lower_bound must be finite and negative, got {}",
               dims.gate_lower_bound.value_or(0.0f));
  KIMIRT_CHECK(dims.rms_norm_eps > 0.0f, "KDA: rms_norm_eps must be positive, got {}", dims.rms_norm_eps);
  KIMIRT_CHECK(dims.chunk_size > 0, "KDA: chunk size must be positive, got {}", dims.chunk_size);
}

KdaState KdaState::zeros(const KdaDims& dims) {
  validate(dims);
  const auto conv = static_cast<size_t>(dims.channels() * (dims.conv_width - 1));
  KdaState s;
  s.conv_q.assign(conv, 0.0f);
  s.conv_k.assign(conv, 0.0f);
  s.conv_v.assign(conv, 0.0f);
  s.recurrent.assign(static_cast<size_t>(dims.num_heads * dims.head_dim * dims.head_dim), 0.0f);
  return s;
}

void kda_forward(const KdaDims& dims, const KdaWeights& w, const float* x, int64_t tokens, KdaState& state, float* out,
                 KdaMode mode) {
  validate(dims);
  check_weights(dims, w);
  check_state(dims, state);
  KIMIRT_CHECK(tokens >= 0, "KDA: negative token count {}", tokens);
  if (tokens == 0) return;
  const int64_t H = dims.hidden;
  const int64_t D = dims.channels();
  const int64_t heads = dims.num_heads;
  const int64_t dk = dims.head_dim;

  // 1. Projections.
  auto q_in = buffer(tokens * D), k_in = buffer(tokens * D), v_in = buffer(tokens * D);
  matmul(x, w.q_proj, q_in.data(), tokens, D, H);
  matmul(x, w.k_proj, k_in.data(), tokens, D, H);
  matmul(x, w.v_proj, v_in.data(), tokens, D, H);
  auto low = buffer(tokens * dk), f = buffer(tokens * D), b = buffer(tokens * heads), gate_out = buffer(tokens * D);
  matmul(x, w.f_a_proj, low.data(), tokens, dk, H);
  matmul(low.data(), w.f_b_proj, f.data(), tokens, D, dk);
  matmul(x, w.b_proj, b.data(), tokens, heads, H);
  if (dims.full_rank_output_gate) {
    matmul(x, w.g_proj, gate_out.data(), tokens, D, H);
  } else {
    // g_a first (H → head_dim), then g_b (head_dim → D): the order HF-TF reverses (§9.2).
    matmul(x, w.g_a_proj, low.data(), tokens, dk, H);
    matmul(low.data(), w.g_b_proj, gate_out.data(), tokens, D, dk);
  }

  // 2. Short causal conv + SiLU, each with its own carried window.
  auto q = buffer(tokens * D), k = buffer(tokens * D), v = buffer(tokens * D);
  short_conv_silu(q_in.data(), w.q_conv, state.conv_q.data(), tokens, D, dims.conv_width, q.data());
  short_conv_silu(k_in.data(), w.k_conv, state.conv_k.data(), tokens, D, dims.conv_width, k.data());
  short_conv_silu(v_in.data(), w.v_conv, state.conv_v.data(), tokens, D, dims.conv_width, v.data());

  // 3. Per-head L2 norm of q and k; q also scaled by K^-½.
  l2_normalize(q.data(), q.data(), tokens * heads, dk, kQkL2Eps, 1.0f / std::sqrt(static_cast<float>(dk)));
  l2_normalize(k.data(), k.data(), tokens * heads, dk, kQkL2Eps);

  // 4-5. Log-decay and β.
  kda_forget_gate(f.data(), w.a_log, w.dt_bias, dims.gate_lower_bound, tokens, heads, dk, f.data());
  kda_beta(b.data(), tokens * heads, b.data());

  // 6-7. Delta rule.
  const KdaSequence seq{q.data(), k.data(), v.data(), f.data(), b.data(), tokens, heads, dk};
  auto o = buffer(tokens * D);
  const bool recurrent = mode == KdaMode::kRecurrent || (mode == KdaMode::kAuto && tokens == 1);
  if (recurrent) {
    kda_recurrent(seq, state.recurrent.data(), o.data());
  } else {
    kda_chunked(seq, state.recurrent.data(), o.data(), dims.chunk_size);
  }

  // 8-9. Gated output norm, o_proj.
  rms_norm_gated(o.data(), gate_out.data(), w.o_norm, o.data(), tokens, heads, dk, dims.rms_norm_eps);
  matmul(o.data(), w.o_proj, out, tokens, H, D);
}

}  // namespace kimirt::cpu
