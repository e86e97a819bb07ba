#include "kimirt/model/schema.h"

#include <vector>

#include <fmt/format.h>

#include "kimirt/base/error.h"
#include "kimirt/tensor/float_convert.h"

namespace kimirt::model {
namespace {

using quant::FormatSet;
using quant::WeightFormat;

// Linear weights may come in any stored format (the format is read from the tensors); norms, biases, convs,
// the embedding, the router and the AttnRes projections are plain float in every known checkpoint, and the
// engine computes them in f32, so a quantized one is refused rather than guessed at.
constexpr FormatSet kLinear = FormatSet::all();
constexpr FormatSet kFloatOnly = FormatSet::float_only();

class Builder {
 public:
  Builder(const ModelConfig& c, const CheckpointLayout& layout, std::vector<ParamSpec>& out)
      : c_(c), layout_(layout), out_(out) {}

  void build() {
    const int64_t H = c_.hidden_size;
    add(ParamRole::kEmbed, -1, "model.embed_tokens", {c_.vocab_size, H}, kFloatOnly);
    add(ParamRole::kFinalNorm, -1, "model.norm", {H}, kFloatOnly);
    if (c_.has_attn_res()) {
      add(ParamRole::kOutputResNorm, -1, "model.output_attn_res_norm", {H}, kFloatOnly);
      add(ParamRole::kOutputResProj, -1, "model.output_attn_res_proj", {1, H}, kFloatOnly);
    }
    for (int64_t l = 0; l < c_.num_layers; ++l) layer(static_cast<int32_t>(l));
    // A tied head reads the embedding table (sliced by vocabulary like an untied one).
    auto& head =
        add(ParamRole::kLmHead, -1, "lm_head", {c_.vocab_size, H}, c_.tie_word_embeddings ? kFloatOnly : kLinear);
    if (c_.tie_word_embeddings) head.sources[0].base = "model.embed_tokens";
  }

 private:
  ParamSpec& add(ParamRole role, int32_t layer, std::string base, Shape shape, FormatSet formats, bool bare = false,
                 WeightFormat predicted = WeightFormat::kFloat) {
    ParamSpec s;
    s.name = bare ? base : base + ".weight";
    s.role = role;
    s.layer = layer;
    s.shape = shape;
    s.bare = bare;
    s.formats = formats;
    s.sources.push_back({std::move(base), std::move(shape), predicted, 0});
    out_.push_back(std::move(s));
    return out_.back();
  }

  // [gate | up] as one parameter: runtime "<runtime>.gate_up_proj.weight" from "<ckpt>.{gate,up}_proj".
  void add_gate_up(ParamRole role, int32_t layer, const std::string& runtime, const std::string& ckpt, int64_t inter) {
    ParamSpec s;
    s.name = runtime + "gate_up_proj.weight";
    s.role = role;
    s.layer = layer;
    s.shape = {2 * inter, c_.hidden_size};
    s.formats = kLinear;
    for (const char* half : {"gate_proj", "up_proj"}) {
      s.sources.push_back({ckpt + half, {inter, c_.hidden_size}, WeightFormat::kFloat, 0});
    }
    out_.push_back(std::move(s));
  }

  void layer(int32_t l) {
    const int64_t H = c_.hidden_size;
    const std::string p = fmt::format("model.layers.{}.", l);
    add(ParamRole::kInputNorm, l, p + "input_layernorm", {H}, kFloatOnly);
    add(ParamRole::kPostAttnNorm, l, p + "post_attention_layernorm", {H}, kFloatOnly);
    if (c_.has_attn_res()) {
      add(ParamRole::kAttnResNorm, l, p + "self_attention_res_norm", {H}, kFloatOnly);
      add(ParamRole::kAttnResProj, l, p + "self_attention_res_proj", {1, H}, kFloatOnly);
      add(ParamRole::kMlpResNorm, l, p + "mlp_res_norm", {H}, kFloatOnly);
      add(ParamRole::kMlpResProj, l, p + "mlp_res_proj", {1, H}, kFloatOnly);
    }
    if (c_.is_kda_layer(l)) {
      kda(l, p + "self_attn.");
    } else {
      mla(l, p + "self_attn.");
    }
    if (c_.is_moe_layer(l)) {
      moe(l, p + "block_sparse_moe.");
    } else {
      const std::string ckpt = p + (layout_.dense_mlp == DenseMlpNaming::kMlp ? "mlp." : "block_sparse_moe.");
      add_gate_up(ParamRole::kDenseGateUp, l, p + "mlp.", ckpt, c_.intermediate_size);
      auto& down = add(ParamRole::kDenseDown, l, ckpt + "down_proj", {H, c_.intermediate_size}, kLinear);
      down.name = p + "mlp.down_proj.weight";
    }
  }

  void kda(int32_t l, const std::string& a) {
    const int64_t H = c_.hidden_size, D = c_.kda_dim(), hd = c_.kda_head_dim, heads = c_.kda_num_heads;
    add(ParamRole::kKdaQ, l, a + "q_proj", {D, H}, kLinear);
    add(ParamRole::kKdaK, l, a + "k_proj", {D, H}, kLinear);
    add(ParamRole::kKdaV, l, a + "v_proj", {D, H}, kLinear);
    if (c_.kda_use_full_rank_gate) {
      add(ParamRole::kKdaG, l, a + "g_proj", {D, H}, kLinear);
    } else {
      add(ParamRole::kKdaGA, l, a + "g_a_proj", {hd, H}, kLinear);
      add(ParamRole::kKdaGB, l, a + "g_b_proj", {D, hd}, kLinear);
    }
    add(ParamRole::kKdaFA, l, a + "f_a_proj", {hd, H}, kLinear);
    add(ParamRole::kKdaFB, l, a + "f_b_proj", {D, hd}, kLinear);
    add(ParamRole::kKdaB, l, a + "b_proj", {heads, H}, kLinear);
    add(ParamRole::kKdaQConv, l, a + "q_conv1d", {D, 1, c_.kda_conv_kernel}, kFloatOnly);
    add(ParamRole::kKdaKConv, l, a + "k_conv1d", {D, 1, c_.kda_conv_kernel}, kFloatOnly);
    add(ParamRole::kKdaVConv, l, a + "v_conv1d", {D, 1, c_.kda_conv_kernel}, kFloatOnly);
    add(ParamRole::kKdaALog, l, a + "A_log", {heads}, kFloatOnly, /*bare=*/true);
    add(ParamRole::kKdaDtBias, l, a + "dt_bias", {D}, kFloatOnly, /*bare=*/true);
    add(ParamRole::kKdaONorm, l, a + "o_norm", {hd}, kFloatOnly);
    add(ParamRole::kKdaO, l, a + "o_proj", {H, D}, kLinear);
  }

  void mla(int32_t l, const std::string& a) {
    const int64_t H = c_.hidden_size, n = c_.mla_num_heads;
    if (c_.q_lora_rank) {
      add(ParamRole::kMlaQA, l, a + "q_a_proj", {*c_.q_lora_rank, H}, kLinear);
      add(ParamRole::kMlaQANorm, l, a + "q_a_layernorm", {*c_.q_lora_rank}, kFloatOnly);
      add(ParamRole::kMlaQB, l, a + "q_b_proj", {n * c_.qk_head_dim(), *c_.q_lora_rank}, kLinear);
    } else {
      add(ParamRole::kMlaQ, l, a + "q_proj", {n * c_.qk_head_dim(), H}, kLinear);
    }
    add(ParamRole::kMlaKvA, l, a + "kv_a_proj_with_mqa", {c_.kv_lora_rank + c_.qk_rope_head_dim, H}, kLinear);
    add(ParamRole::kMlaKvANorm, l, a + "kv_a_layernorm", {c_.kv_lora_rank}, kFloatOnly);
    add(ParamRole::kMlaKvB, l, a + "kv_b_proj", {n * (c_.qk_nope_head_dim + c_.v_head_dim), c_.kv_lora_rank}, kLinear);
    if (c_.mla_use_output_gate) add(ParamRole::kMlaG, l, a + "g_proj", {n * c_.v_head_dim, H}, kLinear);
    add(ParamRole::kMlaO, l, a + "o_proj", {H, n * c_.v_head_dim}, kLinear);
  }

  void moe(int32_t l, const std::string& b) {
    const int64_t H = c_.hidden_size, E = c_.num_experts, I = c_.moe_intermediate_size, L = c_.expert_hidden_size();
    add(ParamRole::kRouter, l, b + "gate", {E, H}, kFloatOnly);
    add(ParamRole::kRouterBias, l, b + "gate.e_score_correction_bias", {E}, kFloatOnly, /*bare=*/true);
    if (c_.latent_moe()) {
      add(ParamRole::kLatentDown, l, b + "routed_expert_down_proj", {L, H}, kLinear);
      add(ParamRole::kLatentNorm, l, b + "routed_expert_norm", {L}, kFloatOnly);
      add(ParamRole::kLatentUp, l, b + "routed_expert_up_proj", {H, L}, kLinear);
    }
    if (c_.num_shared_experts > 0) {
      const int64_t S = c_.shared_intermediate_size();
      add_gate_up(ParamRole::kSharedGateUp, l, b + "shared_experts.", b + "shared_experts.", S);
      add(ParamRole::kSharedDown, l, b + "shared_experts.down_proj", {H, S}, kLinear);
    }
    const WeightFormat predicted = c_.quantization.expert_format();
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = fmt::format("{}experts.{}.", b, e);
      for (auto [role, w, shape] :
           {std::tuple{ParamRole::kExpertW1, "w1", Shape{I, L}}, std::tuple{ParamRole::kExpertW2, "w2", Shape{L, I}},
            std::tuple{ParamRole::kExpertW3, "w3", Shape{I, L}}}) {
        add(role, l, x + w, shape, kLinear, false, predicted).expert = static_cast<int32_t>(e);
      }
    }
  }

  const ModelConfig& c_;
  const CheckpointLayout& layout_;
  std::vector<ParamSpec>& out_;
};

bool is_conv(ParamRole r) {
  return r == ParamRole::kKdaQConv || r == ParamRole::kKdaKConv || r == ParamRole::kKdaVConv;
}

}  // namespace

std::string_view role_name(ParamRole role) {
  switch (role) {
    case ParamRole::kEmbed:
      return "embed";
    case ParamRole::kFinalNorm:
      return "final_norm";
    case ParamRole::kLmHead:
      return "lm_head";
    case ParamRole::kOutputResNorm:
      return "attn_res.output_norm";
    case ParamRole::kOutputResProj:
      return "attn_res.output_proj";
    case ParamRole::kInputNorm:
      return "input_norm";
    case ParamRole::kPostAttnNorm:
      return "post_attention_norm";
    case ParamRole::kAttnResNorm:
      return "attn_res.attn_norm";
    case ParamRole::kAttnResProj:
      return "attn_res.attn_proj";
    case ParamRole::kMlpResNorm:
      return "attn_res.mlp_norm";
    case ParamRole::kMlpResProj:
      return "attn_res.mlp_proj";
    case ParamRole::kKdaQ:
      return "kda.q_proj";
    case ParamRole::kKdaK:
      return "kda.k_proj";
    case ParamRole::kKdaV:
      return "kda.v_proj";
    case ParamRole::kKdaG:
      return "kda.g_proj";
    case ParamRole::kKdaGA:
      return "kda.g_a_proj";
    case ParamRole::kKdaGB:
      return "kda.g_b_proj";
    case ParamRole::kKdaFA:
      return "kda.f_a_proj";
    case ParamRole::kKdaFB:
      return "kda.f_b_proj";
    case ParamRole::kKdaB:
      return "kda.b_proj";
    case ParamRole::kKdaQConv:
      return "kda.q_conv1d";
    case ParamRole::kKdaKConv:
      return "kda.k_conv1d";
    case ParamRole::kKdaVConv:
      return "kda.v_conv1d";
    case ParamRole::kKdaALog:
      return "kda.A_log";
    case ParamRole::kKdaDtBias:
      return "kda.dt_bias";
    case ParamRole::kKdaONorm:
      return "kda.o_norm";
    case ParamRole::kKdaO:
      return "kda.o_proj";
    case ParamRole::kMlaQ:
      return "mla.q_proj";
    case ParamRole::kMlaQA:
      return "mla.q_a_proj";
    case ParamRole::kMlaQANorm:
      return "mla.q_a_layernorm";
    case ParamRole::kMlaQB:
      return "mla.q_b_proj";
    case ParamRole::kMlaKvA:
      return "mla.kv_a_proj_with_mqa";
    case ParamRole::kMlaKvANorm:
      return "mla.kv_a_layernorm";
    case ParamRole::kMlaKvB:
      return "mla.kv_b_proj";
    case ParamRole::kMlaG:
      return "mla.g_proj";
    case ParamRole::kMlaO:
      return "mla.o_proj";
    case ParamRole::kDenseGateUp:
      return "mlp.gate_up_proj";
    case ParamRole::kDenseDown:
      return "mlp.down_proj";
    case ParamRole::kRouter:
      return "moe.gate";
    case ParamRole::kRouterBias:
      return "moe.e_score_correction_bias";
    case ParamRole::kSharedGateUp:
      return "moe.shared.gate_up_proj";
    case ParamRole::kSharedDown:
      return "moe.shared.down_proj";
    case ParamRole::kLatentDown:
      return "moe.routed_expert_down_proj";
    case ParamRole::kLatentNorm:
      return "moe.routed_expert_norm";
    case ParamRole::kLatentUp:
      return "moe.routed_expert_up_proj";
    case ParamRole::kExpertW1:
      return "moe.expert.w1";
    case ParamRole::kExpertW2:
      return "moe.expert.w2";
    case ParamRole::kExpertW3:
      return "moe.expert.w3";
  }
  return "?";
}

CheckpointLayout default_layout(const ModelConfig& config) {
  return {config.family == ModelFamily::kKimiK3 ? "language_model." : "", DenseMlpNaming::kMlp};
}

std::string detect_prefix(const KeyIndex& keys) {
  return keys.any_with_prefix("language_model.") ? "language_model." : "";
}

CheckpointLayout detect_layout(const ModelConfig& config, const KeyIndex& keys) {
  CheckpointLayout layout;
  layout.prefix = detect_prefix(keys);
  for (int64_t l = 0; l < config.num_layers; ++l) {
    if (config.is_moe_layer(l)) continue;
    const std::string p = fmt::format("{}model.layers.{}.", layout.prefix, l);
    if (!keys.any_with_prefix(p + "mlp.gate_proj.") && keys.any_with_prefix(p + "block_sparse_moe.gate_proj.")) {
      layout.dense_mlp = DenseMlpNaming::kBlockSparseMoe;
    }
    break;
  }
  return layout;
}

Schema::Schema(const ModelConfig& config, CheckpointLayout layout) : config_(config), layout_(std::move(layout)) {
  config_.validate();
  Builder(config_, layout_, params_).build();
}

Schema Schema::for_checkpoint(const ModelConfig& config, const KeyIndex& keys) {
  Schema s(config, detect_layout(config, keys));
  s.resolve_formats(keys);
  return s;
}

void Schema::resolve_formats(const KeyIndex& keys) {
  for (auto& spec : params_) {
    if (spec.bare) continue;  // a bare parameter is one plain tensor, checked when read
    // The first source found stored; the halves of a fused pair must match it.
    const ParamSource* stored = nullptr;
    std::vector<size_t> absent;
    for (size_t i = 0; i < spec.sources.size(); ++i) {
      auto& src = spec.sources[i];
      const std::string base = layout_.prefix + src.base;
      std::vector<quant::PresentTensor> present;
      bool any_component = false;
      std::string file;  // the shard of its first component, for the errors below
      for (const auto& e : keys.with_prefix(base + ".")) {
        const std::string suffix = e.name.substr(base.size() + 1);
        if (suffix.find('.') != std::string::npos) continue;
        if (quant::is_component_suffix(suffix)) {
          if (!any_component) file = e.file;
          any_component = true;
        }
        present.push_back({suffix, e.dtype});
      }
      if (!any_component) {
        absent.push_back(i);
        continue;
      }
      const auto detect = [&] {
        const WeightFormat detected = quant::detect_weight_format(base, present);
        KIMIRT_CHECK(spec.formats.contains(detected), "{}: stored as {}, but {} ({}) may only be stored as {}", base,
                     quant::format_name(detected), spec.name, role_name(spec.role), spec.formats.str());
        if (stored) {
          KIMIRT_CHECK(detected == stored->format, "{}: stored as {} but {} is {}; the fused halves must match", base,
                       quant::format_name(detected), layout_.prefix + stored->base, quant::format_name(stored->format));
        }
        return detected;
      };
      const WeightFormat f = file.empty() ? detect() : with_context(file, detect);
      src.format = f;
      src.optional_present = 0;
      const auto comps = quant::format_components(f);
      for (size_t c = 0; c < comps.size(); ++c) {
        if (comps[c].required) continue;
        for (const auto& p : present) {
          if (p.suffix == comps[c].suffix) src.optional_present |= 1u << c;
        }
      }
      if (!stored) stored = &src;
    }
    // A half stored nowhere is expected in its sibling's format, so that what is missing is listed as its
    // tensors (weight and scales), not reported as halves that differ.
    if (stored) {
      for (size_t i : absent) {
        spec.sources[i].format = stored->format;
        spec.sources[i].optional_present = stored->optional_present;
      }
    }
  }
}

const ParamSpec* Schema::find(std::string_view name) const {
  for (const auto& p : params_) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

std::string Schema::key(const ParamSpec& spec, const ParamSource& source, const quant::Component& component) const {
  if (spec.bare) return layout_.prefix + source.base;
  return layout_.prefix + source.base + "." + std::string(component.suffix);
}

std::vector<int> Schema::stored_components(const ParamSource& source) const {
  std::vector<int> out;
  const auto comps = quant::format_components(source.format);
  for (size_t c = 0; c < comps.size(); ++c) {
    if (comps[c].required || (source.optional_present >> c) & 1u) out.push_back(static_cast<int>(c));
  }
  return out;
}

std::vector<std::string> Schema::checkpoint_keys(const ParamSpec& spec) const {
  std::vector<std::string> out;
  for (const auto& src : spec.sources) {
    const auto comps = quant::format_components(src.format);
    for (int c : stored_components(src)) out.push_back(key(spec, src, comps[static_cast<size_t>(c)]));
  }
  return out;
}

std::set<std::string> Schema::all_checkpoint_keys() const {
  std::set<std::string> out;
  for (const auto& spec : params_) {
    for (auto& k : checkpoint_keys(spec)) out.insert(std::move(k));
  }
  return out;
}

TensorView Schema::normalize(const ParamSpec& spec, size_t source, size_t component, const TensorView& stored,
                             std::string_view key) const {
  KIMIRT_CHECK(source < spec.sources.size(), "{}: source {} of a parameter with {}", key, source, spec.sources.size());
  const auto& src = spec.sources[source];
  const auto comps = quant::format_components(src.format);
  KIMIRT_CHECK(component < comps.size(), "{}: component {} of a {} weight", key, component,
               quant::format_name(src.format));
  if (spec.role == ParamRole::kKdaALog) {
    check_a_log_padding(stored, src.shape[0], key);
    return TensorView(stored.dtype(), src.shape, stored.data());
  }
  if (is_conv(spec.role) && stored.rank() == 2 && stored.shape()[0] == src.shape[0] &&
      stored.shape()[1] == src.shape[2] && stored.is_contiguous()) {
    // [D, W]: the same bytes as [D, 1, W], then the checks of any stored weight (its dtype above all).
    return quant::normalize_component(src.format, comps[component], stored.reshape(src.shape), src.shape, key);
  }
  return quant::normalize_component(src.format, comps[component], stored, src.shape, key);
}

void check_a_log_padding(const TensorView& stored, int64_t num_heads, std::string_view key) {
  KIMIRT_CHECK(
      quant::component_accepts(WeightFormat::kFloat, quant::format_components(WeightFormat::kFloat)[0], stored.dtype()),
      "{}: dtype {} is not a float dtype", key, dtype_name(stored.dtype()));
  int non_unit = 0;
  for (int64_t d : stored.shape()) non_unit += d != 1;
  KIMIRT_CHECK(non_unit <= 1 && stored.numel() >= num_heads && stored.is_contiguous(),
               "{}: shape {} is not a vector of at least num_heads ({}) values", key, shape_str(stored.shape()),
               num_heads);
  const int64_t n = stored.numel();
  if (n == num_heads) return;
  std::vector<float> values(static_cast<size_t>(n));
  convert_to_f32(stored.dtype(), stored.data(), values.data(), n);
  for (int64_t i = num_heads; i < n; ++i) {
    KIMIRT_CHECK(values[static_cast<size_t>(i)] == 0.0f,
                 "{}: padding entry {} is {} (entries past num_heads ({}) must be exactly zero)", key, i,
                 values[static_cast<size_t>(i)], num_heads);
  }
}

}  // namespace kimirt::model
