// The model configuration of both families, validated: Kimi K3 (config.json model_type "kimi_k3", text fields
// under text_config, quantization_config inside it) and Kimi Linear (flat "kimi_linear"). Every feature is a
// flag or value here, so the schema, the forward and the kernels never look at JSON.
//
// Validation follows spec model-architecture §5: rules about meaning are enforced (top-k within the experts,
// layer maps that cover every layer once, ...); rules that only pin the release's numbers are not, so tiny
// test models pass. What the engine does not implement is refused rather than guessed (a router other than
// sigmoid, MTP layers, RoPE MLA, ...). Errors name the file and the field.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kimirt/model/quant_config.h"

namespace kimirt::model {

enum class ModelFamily : uint8_t { kKimiLinear, kKimiK3 };
enum class LayerMixer : uint8_t { kKda, kMla };
enum class HiddenAct : uint8_t { kSilu, kSitu };

std::string_view family_name(ModelFamily family);  // "kimi_linear" / "kimi_k3" (the model_type)

// Sanity bounds of validate(): far above any released model (K3: 93 layers, 896 experts, hidden 7168,
// vocabulary 163,840, a million positions), low enough that nothing derived from a config (layer and
// parameter tables, shapes, byte counts) overflows or exhausts memory before a checkpoint byte is read. The
// one exception is the routed experts in all, num_experts x num_hidden_layers (K3: 83,328), which size the
// load plan's key tables: 2^17 (1.6x K3) lets a config over a tiny checkpoint take 1.0 GB and 2.6 s to be
// refused for its missing keys (2^20 took 6.9 GB and 47 s).
inline constexpr int64_t kMaxLayers = int64_t{1} << 16;
inline constexpr int64_t kMaxExperts = (int64_t{1} << 24) - 1;
inline constexpr int64_t kMaxRoutedExperts = int64_t{1} << 17;  // num_hidden_layers x num_experts
inline constexpr int64_t kMaxWidth = int64_t{1} << 24;          // any width, heads x head_dim included
inline constexpr int64_t kMaxVocab = int64_t{1} << 31;          // token ids are int32
inline constexpr int64_t kMaxPositions = int64_t{1} << 31;      // positions are int32 in the caches

struct ModelConfig {
  ModelFamily family = ModelFamily::kKimiK3;

  // Trunk.
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t intermediate_size = 0;  // dense MLP width (layers before first_k_dense_replace, or not MoE)
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  std::vector<LayerMixer> layer_mixers;  // one per layer, from linear_attn_config (1-based lists)

  // MLA (gated NoPE multi-head latent attention).
  int64_t mla_num_heads = 0;
  std::optional<int64_t> q_lora_rank;  // absent (Kimi Linear): a single q_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;  // "rope" dims are used unrotated (NoPE)
  int64_t v_head_dim = 0;
  bool mla_use_output_gate = false;       // sigmoid(g_proj(x)) gate before o_proj
  std::optional<int64_t> head_dim_field;  // the top-level "head_dim" as written; unused by the model

  // KDA (Kimi Delta Attention).
  int64_t kda_num_heads = 0;
  int64_t kda_head_dim = 0;  // K = V
  int64_t kda_conv_kernel = 4;
  std::optional<double> kda_gate_lower_bound;  // set: g = lb * sigmoid(exp(A) * z); absent: -exp(A) * softplus(z)
  bool kda_use_full_rank_gate = false;         // g_proj [D, H]; else low-rank g_a [head_dim, H] -> g_b [D, head_dim]

  // MoE.
  int64_t num_experts = 0;  // 0: no MoE layers
  int64_t num_experts_per_token = 0;
  int64_t num_shared_experts = 0;
  int64_t moe_intermediate_size = 0;
  std::optional<int64_t> routed_expert_hidden_size;  // latent MoE width when set
  bool latent_moe_use_norm = false;
  bool moe_renormalize = true;
  double routed_scaling_factor = 1.0;
  bool use_grouped_topk = true;
  int64_t num_expert_group = 1;
  int64_t topk_group = 1;
  // Router: sigmoid scores, FP32 e_score_correction_bias for selection only (topk_method noaux_tc); the only
  // router kimirt implements, so it is not a field.

  // Activations and residual stream.
  HiddenAct hidden_act = HiddenAct::kSitu;
  std::optional<double> situ_beta;         // activation_situ_beta (gate side)
  std::optional<double> situ_linear_beta;  // activation_situ_linear_beta (up side; absent: identity)
  int64_t attn_res_block_size = 0;         // 0: plain additive residual stream (no AttnRes)

  // Tokens and bookkeeping.
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> eos_token_id;
  std::optional<int64_t> pad_token_id;
  std::optional<int64_t> media_placeholder_token_id;  // Kimi K3 (vision placeholder)
  std::optional<int64_t> max_position_embeddings;     // Kimi Linear writes it as model_max_length
  std::string dtype = "bfloat16";

  QuantizationConfig quantization;

  bool operator==(const ModelConfig&) const = default;

  // Throws kimirt::Error naming `source` and the field (in this family's JSON spelling) of the first rule
  // broken. A config built from values must pass this before use; from_json calls it.
  void validate(const std::string& source = "config.json") const;

  // Parses and validates a config.json of either family.
  static ModelConfig from_json(const nlohmann::json& j, const std::string& source = "config.json");
  static ModelConfig from_file(const std::filesystem::path& path);
  // A config.json in the released layout of this config's family; from_json(to_json()) == *this.
  nlohmann::json to_json() const;

  // The released models (spec model-architecture §1.2 and §7), for the generator and tests.
  static ModelConfig kimi_k3();
  static ModelConfig kimi_linear_48b();

  // Derived facts.
  bool is_moe_layer(int64_t layer) const {
    return num_experts > 0 && moe_layer_freq > 0 && layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
  }
  bool is_kda_layer(int64_t layer) const { return layer_mixers.at(static_cast<size_t>(layer)) == LayerMixer::kKda; }
  bool has_attn_res() const { return attn_res_block_size > 0; }
  bool latent_moe() const { return routed_expert_hidden_size.has_value(); }
  int64_t expert_hidden_size() const { return routed_expert_hidden_size.value_or(hidden_size); }
  int64_t shared_intermediate_size() const { return num_shared_experts * moe_intermediate_size; }
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int64_t kda_dim() const { return kda_num_heads * kda_head_dim; }
  // "text_config." for Kimi K3, "" for Kimi Linear: where the text fields live in config.json.
  std::string field_prefix() const { return family == ModelFamily::kKimiK3 ? "text_config." : ""; }
};

}  // namespace kimirt::model
