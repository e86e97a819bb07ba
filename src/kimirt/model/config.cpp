// ModelConfig validation and the released presets. JSON reading and writing live in config_json.cpp.
#include "kimirt/model/config.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "kimirt/base/error.h"

namespace kimirt::model {
namespace {

// The float fields are read as double but used as float: a value float cannot hold (1e39 becomes inf, 1e-46
// becomes 0) would pass a double check and then make every output NaN or zero.
bool float_finite(double v) { return std::isfinite(v) && std::isfinite(static_cast<float>(v)); }
bool positive_finite(double v) { return float_finite(v) && v > 0 && static_cast<float>(v) > 0; }

// Field-naming checks for one config: every message reads "<source>: <field> ...".
class Checker {
 public:
  Checker(const std::string& source, std::string prefix) : source_(source), prefix_(std::move(prefix)) {}

  std::string f(std::string_view key) const { return prefix_ + std::string(key); }

  template <typename... Args>
  void check(bool ok, fmt::format_string<Args...> format, Args&&... args) const {
    if (!ok) fail("{}: {}", source_, fmt::format(format, std::forward<Args>(args)...));
  }
  void positive(int64_t v, std::string_view key) const { check(v > 0, "{} must be positive, got {}", f(key), v); }
  void at_least(int64_t v, int64_t lo, std::string_view key) const {
    check(v >= lo, "{} must be at least {}, got {}", f(key), lo, v);
  }
  void at_most(int64_t v, int64_t hi, std::string_view key) const {
    check(v <= hi, "{} is {}, over the sanity bound {}", f(key), v, hi);
  }

 private:
  const std::string& source_;
  std::string prefix_;
};

std::vector<LayerMixer> k3_layer_mixers(int64_t layers, int64_t period) {
  // MLA every `period`-th layer (1-based) plus the last one: the release's "double global tail".
  std::vector<LayerMixer> m(static_cast<size_t>(layers), LayerMixer::kKda);
  for (int64_t l = period; l <= layers; l += period) m[static_cast<size_t>(l - 1)] = LayerMixer::kMla;
  m.back() = LayerMixer::kMla;
  return m;
}

// Upper bounds first: the checks after these may walk every layer, and the schema built from a valid config
// holds a parameter per routed expert.
void check_bounds(const ModelConfig& m, const Checker& c) {
  const std::string lac = "linear_attn_config.";
  c.at_most(m.vocab_size, kMaxVocab, "vocab_size");
  c.at_most(m.num_layers, kMaxLayers, "num_hidden_layers");
  c.at_most(m.num_experts, kMaxExperts, "num_experts");
  const std::pair<int64_t, std::string> widths[] = {
      {m.hidden_size, "hidden_size"},
      {m.intermediate_size, "intermediate_size"},
      {m.mla_num_heads, "num_attention_heads"},
      {m.q_lora_rank.value_or(0), "q_lora_rank"},
      {m.kv_lora_rank, "kv_lora_rank"},
      {m.qk_nope_head_dim, "qk_nope_head_dim"},
      {m.qk_rope_head_dim, "qk_rope_head_dim"},
      {m.v_head_dim, "v_head_dim"},
      {m.kda_num_heads, lac + "num_heads"},
      {m.kda_head_dim, lac + "head_dim"},
      {m.kda_conv_kernel, lac + "short_conv_kernel_size"},
      {m.num_shared_experts, "num_shared_experts"},
      {m.moe_intermediate_size, "moe_intermediate_size"},
      {m.routed_expert_hidden_size.value_or(0), "routed_expert_hidden_size"},
  };
  for (const auto& [v, key] : widths) c.at_most(v, kMaxWidth, key);
  // Every factor is at most 2^24 now, and negative ones (refused below) count as 0: no product overflows.
  auto nn = [](int64_t v) { return std::max<int64_t>(v, 0); };
  c.check(nn(m.kda_num_heads) * nn(m.kda_head_dim) <= kMaxWidth, "{} x {} ({} x {}) is over the sanity bound {}",
          c.f(lac + "num_heads"), c.f(lac + "head_dim"), m.kda_num_heads, m.kda_head_dim, kMaxWidth);
  const int64_t mla_head = std::max(nn(m.qk_nope_head_dim) + nn(m.qk_rope_head_dim), nn(m.v_head_dim));
  c.check(nn(m.mla_num_heads) * mla_head <= kMaxWidth, "{} x the head dim ({} x {}) is over the sanity bound {}",
          c.f("num_attention_heads"), m.mla_num_heads, mla_head, kMaxWidth);
  c.check(nn(m.num_shared_experts) * nn(m.moe_intermediate_size) <= kMaxWidth,
          "{} x {} ({} x {}) is over the sanity bound {}", c.f("num_shared_experts"), c.f("moe_intermediate_size"),
          m.num_shared_experts, m.moe_intermediate_size, kMaxWidth);
  c.check(nn(m.num_experts) * nn(m.num_layers) <= kMaxRoutedExperts,
          "{} x {} ({} x {}) routed experts in all is over the sanity bound {}", c.f("num_experts"),
          c.f("num_hidden_layers"), m.num_experts, m.num_layers, kMaxRoutedExperts);
  if (m.max_position_embeddings) {
    c.at_most(*m.max_position_embeddings, kMaxPositions,
              m.family == ModelFamily::kKimiLinear ? "model_max_length" : "max_position_embeddings");
    c.positive(*m.max_position_embeddings,
               m.family == ModelFamily::kKimiLinear ? "model_max_length" : "max_position_embeddings");
  }
}

}  // namespace

std::string_view family_name(ModelFamily family) { return family == ModelFamily::kKimiK3 ? "kimi_k3" : "kimi_linear"; }

void ModelConfig::validate(const std::string& source) const {
  const Checker c(source, field_prefix());
  const std::string lac = "linear_attn_config.";

  check_bounds(*this, c);

  c.positive(vocab_size, "vocab_size");
  c.positive(hidden_size, "hidden_size");
  c.positive(num_layers, "num_hidden_layers");
  c.check(static_cast<int64_t>(layer_mixers.size()) == num_layers,
          "{}kda_layers / full_attn_layers describe {} layers but num_hidden_layers is {}", c.f(lac),
          layer_mixers.size(), num_layers);
  c.check(positive_finite(rms_norm_eps), "{} must be a positive number that a float can hold, got {}",
          c.f("rms_norm_eps"), rms_norm_eps);

  // Checked before anything calls is_moe_layer, which divides by it.
  c.positive(moe_layer_freq, "moe_layer_freq");
  bool any_kda = false, any_mla = false, any_dense = false, any_moe = false;
  for (int64_t l = 0; l < num_layers; ++l) {
    (layer_mixers[static_cast<size_t>(l)] == LayerMixer::kKda ? any_kda : any_mla) = true;
    (is_moe_layer(l) ? any_moe : any_dense) = true;
  }

  if (any_mla) {
    c.positive(mla_num_heads, "num_attention_heads");
    c.positive(kv_lora_rank, "kv_lora_rank");
    c.positive(qk_nope_head_dim, "qk_nope_head_dim");
    c.at_least(qk_rope_head_dim, 0, "qk_rope_head_dim");
    c.positive(v_head_dim, "v_head_dim");
    if (q_lora_rank) c.positive(*q_lora_rank, "q_lora_rank");
  }
  if (any_kda) {
    c.positive(kda_num_heads, lac + "num_heads");
    c.positive(kda_head_dim, lac + "head_dim");
    c.positive(kda_conv_kernel, lac + "short_conv_kernel_size");
    if (kda_gate_lower_bound) {
      // g = lb * sigmoid(...) is a log-decay only for lb < 0; lb >= 0 would grow the state without bound.
      c.check(positive_finite(-*kda_gate_lower_bound), "{} must be a negative number that a float can hold, got {}",
              c.f(lac + "gate_lower_bound"), *kda_gate_lower_bound);
    }
  }

  c.check(first_k_dense_replace >= 0 && first_k_dense_replace <= num_layers,
          "{} ({}) must lie in [0, num_hidden_layers ({})]", c.f("first_k_dense_replace"), first_k_dense_replace,
          num_layers);
  if (any_dense) c.positive(intermediate_size, "intermediate_size");

  c.at_least(num_experts, 0, "num_experts");
  if (num_experts > 0) {
    c.positive(num_experts_per_token, "num_experts_per_token");
    c.check(num_experts_per_token <= num_experts, "{} ({}) > num_experts ({})", c.f("num_experts_per_token"),
            num_experts_per_token, num_experts);
    c.positive(moe_intermediate_size, "moe_intermediate_size");
    c.at_least(num_shared_experts, 0, "num_shared_experts");
    c.positive(num_expert_group, "num_expert_group");
    c.check(num_experts % num_expert_group == 0, "{} ({}) is not divisible by num_expert_group ({})",
            c.f("num_experts"), num_experts, num_expert_group);
    c.check(topk_group >= 1 && topk_group <= num_expert_group, "{} ({}) must lie in [1, num_expert_group ({})]",
            c.f("topk_group"), topk_group, num_expert_group);
    c.check(topk_group * (num_experts / num_expert_group) >= num_experts_per_token,
            "{} ({}) groups of {} experts cannot supply num_experts_per_token ({})", c.f("topk_group"), topk_group,
            num_experts / num_expert_group, num_experts_per_token);
    c.check(use_grouped_topk || num_expert_group == 1,
            "{} is false with num_expert_group {}: ungrouped selection over grouped experts is not implemented",
            c.f("use_grouped_topk"), num_expert_group);
    c.check(positive_finite(routed_scaling_factor), "{} must be a positive number that a float can hold, got {}",
            c.f("routed_scaling_factor"), routed_scaling_factor);
    // Grouped selection scores a group by its two best experts (cpu/router.cpp): it applies when fewer groups
    // are kept than there are.
    c.check(num_expert_group <= 1 || topk_group >= num_expert_group || num_experts / num_expert_group >= 2,
            "{} ({}) leaves {} expert per group; grouped routing (topk_group {} of the groups) needs at least 2",
            c.f("num_expert_group"), num_expert_group, num_experts / num_expert_group, topk_group);
    if (routed_expert_hidden_size) {
      c.positive(*routed_expert_hidden_size, "routed_expert_hidden_size");
      // The latent MoE sums expert outputs in the latent and normalizes before the up-projection; the
      // un-normalized variant has no reference to check against.
      c.check(latent_moe_use_norm, "{} is false with a latent MoE (routed_expert_hidden_size {}): not implemented",
              c.f("latent_moe_use_norm"), *routed_expert_hidden_size);
    }
    if (quantization.method == QuantMethod::kMxfp4 || quantization.method == QuantMethod::kNvfp4) {
      c.check(expert_hidden_size() % 2 == 0 && moe_intermediate_size % 2 == 0,
              "{}: packed FP4 experts need even widths, got expert input {} and moe_intermediate_size {}",
              c.f("quantization_config"), expert_hidden_size(), moe_intermediate_size);
    }
  }
  c.check(!latent_moe_use_norm || routed_expert_hidden_size.has_value(),
          "{} is true but routed_expert_hidden_size is missing (there is no latent to normalize)",
          c.f("latent_moe_use_norm"));

  if (hidden_act == HiddenAct::kSitu) {
    c.check(situ_beta.has_value() && positive_finite(*situ_beta),
            "{} must be a positive number that a float can hold when hidden_act is \"situ\"",
            c.f("activation_situ_beta"));
    c.check(!situ_linear_beta || positive_finite(*situ_linear_beta),
            "{} must be a positive number that a float can hold, got {}", c.f("activation_situ_linear_beta"),
            situ_linear_beta.value_or(0));
  }
  c.check(attn_res_block_size >= 0 && attn_res_block_size <= num_layers,
          "{} ({}) must lie in [0, num_hidden_layers ({})]", c.f("attn_res_block_size"), attn_res_block_size,
          num_layers);

  const std::pair<const std::optional<int64_t>*, const char*> ids[] = {
      {&bos_token_id, "bos_token_id"}, {&eos_token_id, "eos_token_id"}, {&pad_token_id, "pad_token_id"}};
  for (const auto& [id, key] : ids) {
    c.check(!*id || (**id >= 0 && **id < vocab_size), "{} ({}) is outside the vocabulary [0, {})", c.f(key),
            id->value_or(0), vocab_size);
  }
}

ModelConfig ModelConfig::kimi_k3() {
  ModelConfig c;
  c.family = ModelFamily::kKimiK3;
  c.vocab_size = 163840;
  c.hidden_size = 7168;
  c.num_layers = 93;
  c.intermediate_size = 33792;
  c.first_k_dense_replace = 1;
  c.moe_layer_freq = 1;
  c.rms_norm_eps = 1e-5;
  c.layer_mixers = k3_layer_mixers(93, 4);
  c.mla_num_heads = 96;
  c.q_lora_rank = 1536;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.mla_use_output_gate = true;
  c.kda_num_heads = 96;
  c.kda_head_dim = 128;
  c.kda_conv_kernel = 4;
  c.kda_gate_lower_bound = -5.0;
  c.kda_use_full_rank_gate = true;
  c.num_experts = 896;
  c.num_experts_per_token = 16;
  c.num_shared_experts = 2;
  c.moe_intermediate_size = 3072;
  c.routed_expert_hidden_size = 3584;
  c.latent_moe_use_norm = true;
  c.routed_scaling_factor = 1.0;
  c.hidden_act = HiddenAct::kSitu;
  c.situ_beta = 4.0;
  c.situ_linear_beta = 25.0;
  c.attn_res_block_size = 12;
  c.bos_token_id = 163584;
  c.eos_token_id = 163586;
  c.pad_token_id = 163839;
  c.media_placeholder_token_id = 163605;
  c.max_position_embeddings = 1048576;
  c.quantization = QuantizationConfig::kimi_k3_mxfp4();
  return c;
}

ModelConfig ModelConfig::kimi_linear_48b() {
  ModelConfig c;
  c.family = ModelFamily::kKimiLinear;
  c.vocab_size = 163840;
  c.hidden_size = 2304;
  c.num_layers = 27;
  c.intermediate_size = 9216;
  c.first_k_dense_replace = 1;
  c.moe_layer_freq = 1;
  c.rms_norm_eps = 1e-5;
  c.layer_mixers = k3_layer_mixers(27, 4);
  c.mla_num_heads = 32;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.kda_num_heads = 32;
  c.kda_head_dim = 128;
  c.kda_conv_kernel = 4;
  c.num_experts = 256;
  c.num_experts_per_token = 8;
  c.num_shared_experts = 1;
  c.moe_intermediate_size = 1024;
  c.routed_scaling_factor = 2.446;
  c.hidden_act = HiddenAct::kSilu;
  c.bos_token_id = 163584;
  c.eos_token_id = 163586;
  c.pad_token_id = 163839;
  c.max_position_embeddings = 1048576;
  return c;
}

}  // namespace kimirt::model
