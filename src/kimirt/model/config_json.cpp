// config.json <-> ModelConfig, in the released layouts: Kimi K3 nests the text model under text_config (with
// quantization_config inside it) next to a vision_config; Kimi Linear is one flat object.
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "kimirt/base/error.h"
#include "kimirt/base/strict_json.h"
#include "kimirt/model/config.h"
#include "kimirt/model/json_fields.h"

namespace kimirt::model {
namespace {

using json = nlohmann::json;

// Layer maps are 1-based lists; every layer must be in exactly one of them.
std::vector<LayerMixer> parse_layer_maps(const JsonFields& lac, int64_t layers) {
  std::vector<int> seen(static_cast<size_t>(std::max<int64_t>(layers, 0)), -1);
  const char* keys[2] = {"kda_layers", "full_attn_layers"};
  for (int which = 0; which < 2; ++which) {
    for (int64_t l : lac.get_int_list(keys[which])) {
      if (l < 1 || l > layers) {
        lac.fail_field(
            keys[which],
            fmt::format("lists layer {}, outside 1..num_hidden_layers ({}); the lists are 1-based", l, layers));
      }
      int& s = seen[static_cast<size_t>(l - 1)];
      if (s == which) lac.fail_field(keys[which], fmt::format("lists layer {} twice", l));
      if (s >= 0) {
        fail("{}: {}: layer {} (1-based) is in both kda_layers and full_attn_layers; a layer is either KDA or MLA",
             lac.source(), lac.where(), l);
      }
      s = which;
    }
  }
  std::vector<LayerMixer> out;
  for (int64_t l = 0; l < layers; ++l) {
    if (seen[static_cast<size_t>(l)] < 0) {
      fail("{}: {}: layer {} (1-based) is in neither kda_layers nor full_attn_layers; every layer needs a mixer",
           lac.source(), lac.where(), l + 1);
    }
    out.push_back(seen[static_cast<size_t>(l)] == 0 ? LayerMixer::kKda : LayerMixer::kMla);
  }
  return out;
}

// The text-model fields, common to both families (K3 reads them from text_config).
void parse_text_fields(const JsonFields& t, ModelConfig& c) {
  c.vocab_size = t.get_int("vocab_size");
  c.hidden_size = t.get_int("hidden_size");
  c.num_layers = t.get_int("num_hidden_layers");
  if (c.num_layers <= 0) t.fail_field("num_hidden_layers", fmt::format("must be positive, got {}", c.num_layers));
  // Checked before the layer maps are read into a table of this many entries (validate() checks it again).
  if (c.num_layers > kMaxLayers) {
    t.fail_field("num_hidden_layers", fmt::format("is {}, over the sanity bound {}", c.num_layers, kMaxLayers));
  }
  c.intermediate_size = t.int_or("intermediate_size", 0);
  c.first_k_dense_replace = t.int_or("first_k_dense_replace", 0);
  c.moe_layer_freq = t.int_or("moe_layer_freq", 1);
  c.rms_norm_eps = t.get_double("rms_norm_eps");
  c.tie_word_embeddings = t.bool_or("tie_word_embeddings", false);

  c.mla_num_heads = t.get_int("num_attention_heads");
  // Compared only with a head count that can be right: 0 is said as such by validate(), not as a mismatch.
  if (auto kv = t.opt_int("num_key_value_heads"); kv && c.mla_num_heads > 0 && *kv != c.mla_num_heads) {
    t.fail_field("num_key_value_heads", fmt::format("({}) != num_attention_heads ({}): MLA has one latent KV for all "
                                                    "heads, grouped heads are not implemented",
                                                    *kv, c.mla_num_heads));
  }
  c.q_lora_rank = t.opt_int("q_lora_rank");
  c.kv_lora_rank = t.get_int("kv_lora_rank");
  c.qk_nope_head_dim = t.get_int("qk_nope_head_dim");
  c.qk_rope_head_dim = t.get_int("qk_rope_head_dim");
  c.v_head_dim = t.get_int("v_head_dim");
  if (!t.bool_or("mla_use_nope", false)) {
    t.fail_field("mla_use_nope",
                 "is missing or false: MLA with rotary embeddings is not implemented (Kimi models are "
                 "NoPE)");
  }
  c.mla_use_output_gate = t.bool_or("mla_use_output_gate", false);
  c.head_dim_field = t.opt_int("head_dim");

  const JsonFields lac = t.object("linear_attn_config");
  c.kda_num_heads = lac.get_int("num_heads");
  c.kda_head_dim = lac.get_int("head_dim");
  c.kda_conv_kernel = lac.int_or("short_conv_kernel_size", 4);
  c.kda_gate_lower_bound = lac.opt_double("gate_lower_bound");
  c.kda_use_full_rank_gate = lac.bool_or("use_full_rank_gate", false);
  c.layer_mixers = parse_layer_maps(lac, c.num_layers);

  c.num_experts = t.int_or("num_experts", 0);
  c.num_experts_per_token = t.int_or("num_experts_per_token", 0);
  c.num_shared_experts = t.int_or("num_shared_experts", 0);
  c.moe_intermediate_size = t.int_or("moe_intermediate_size", 0);
  c.routed_expert_hidden_size = t.opt_int("routed_expert_hidden_size");
  c.latent_moe_use_norm = t.bool_or("latent_moe_use_norm", false);
  c.moe_renormalize = t.bool_or("moe_renormalize", true);
  c.routed_scaling_factor = t.double_or("routed_scaling_factor", 1.0);
  c.use_grouped_topk = t.bool_or("use_grouped_topk", true);
  c.num_expert_group = t.int_or("num_expert_group", 1);
  c.topk_group = t.int_or("topk_group", 1);
  if (auto f = t.opt_string("moe_router_activation_func"); f && *f != "sigmoid") {
    t.fail_field("moe_router_activation_func", fmt::format("is \"{}\": only the sigmoid router is implemented", *f));
  }
  if (auto m = t.opt_string("topk_method"); m && *m != "noaux_tc") {
    t.fail_field("topk_method", fmt::format("is \"{}\": only noaux_tc (bias-corrected top-k) is implemented", *m));
  }
  if (const int64_t mtp = t.int_or("num_nextn_predict_layers", 0); mtp != 0) {
    t.fail_field("num_nextn_predict_layers", fmt::format("is {}: MTP layers are not implemented", mtp));
  }

  const std::string act = t.get_string("hidden_act");
  if (act == "silu") {
    c.hidden_act = HiddenAct::kSilu;
  } else if (act == "situ") {
    c.hidden_act = HiddenAct::kSitu;
  } else {
    t.fail_field("hidden_act", fmt::format("is \"{}\": kimirt implements \"silu\" and \"situ\"", act));
  }
  c.situ_beta = t.opt_double("activation_situ_beta");
  c.situ_linear_beta = t.opt_double("activation_situ_linear_beta");
  c.attn_res_block_size = t.int_or("attn_res_block_size", 0);

  c.bos_token_id = t.opt_int("bos_token_id");
  c.eos_token_id = t.opt_int("eos_token_id");
  c.pad_token_id = t.opt_int("pad_token_id");
  c.max_position_embeddings = t.opt_int("max_position_embeddings");
  if (!c.max_position_embeddings) c.max_position_embeddings = t.opt_int("model_max_length");
  if (auto d = t.opt_string("dtype")) {
    c.dtype = *d;
  } else if (auto td = t.opt_string("torch_dtype")) {
    c.dtype = *td;
  }
  if (auto q = t.opt_object("quantization_config")) {
    c.quantization = parse_quantization_config(q->json(), t.source(), t.field("quantization_config"));
  }
}

// Kimi K3 repeats some fields at the top level; where both levels have one they must agree.
void merge_top_level(const JsonFields& top, const JsonFields& text, ModelConfig& c) {
  const std::pair<std::optional<int64_t>*, const char*> ids[] = {
      {&c.bos_token_id, "bos_token_id"}, {&c.eos_token_id, "eos_token_id"}, {&c.pad_token_id, "pad_token_id"}};
  for (const auto& [id, key] : ids) {
    const auto outer = top.opt_int(key);
    if (outer && *id && *outer != **id) {
      top.fail_field(key, fmt::format("({}) != {} ({})", *outer, text.field(key), **id));
    }
    if (!*id) *id = outer;
  }
  // Compared only where the text level states it too (its absence is not "false"); otherwise the top level's
  // value is taken, as for the ids above.
  if (auto tie = top.opt_bool("tie_word_embeddings")) {
    if (text.has("tie_word_embeddings") && *tie != c.tie_word_embeddings) {
      top.fail_field("tie_word_embeddings",
                     fmt::format("({}) != {} ({})", *tie, text.field("tie_word_embeddings"), c.tie_word_embeddings));
    }
    c.tie_word_embeddings = *tie;
  }
  c.media_placeholder_token_id = top.opt_int("media_placeholder_token_id");
  if (auto q = top.opt_object("quantization_config")) {
    const auto outer = parse_quantization_config(q->json(), top.source(), "quantization_config");
    if (text.has("quantization_config") && !(outer == c.quantization)) {
      top.fail_field("quantization_config", "differs from " + text.field("quantization_config"));
    }
    c.quantization = outer;
  }
  if (auto v = top.opt_object("vision_config")) {
    if (auto th = v->opt_int("text_hidden_size"); th && c.hidden_size > 0 && *th != c.hidden_size) {
      v->fail_field("text_hidden_size", fmt::format("({}) != {} ({})", *th, text.field("hidden_size"), c.hidden_size));
    }
  }
  if (auto d = top.opt_string("dtype"); d && !text.has("dtype")) c.dtype = *d;
}

// 1-based layer lists of one mixer kind.
json layer_list(const ModelConfig& c, LayerMixer kind) {
  json out = json::array();
  for (size_t l = 0; l < c.layer_mixers.size(); ++l) {
    if (c.layer_mixers[l] == kind) out.push_back(static_cast<int64_t>(l + 1));
  }
  return out;
}

json opt(const std::optional<int64_t>& v) { return v ? json(*v) : json(nullptr); }

// The routed-expert module names, for a ModelOpt per-layer declaration.
std::vector<std::string> expert_modules(const ModelConfig& c) {
  std::vector<std::string> out;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (!c.is_moe_layer(l)) continue;
    for (int64_t e = 0; e < c.num_experts; ++e) {
      for (const char* w : {"w1", "w2", "w3"}) {
        out.push_back(fmt::format("model.layers.{}.block_sparse_moe.experts.{}.{}", l, e, w));
      }
    }
  }
  return out;
}

json text_fields(const ModelConfig& c) {
  const bool k3 = c.family == ModelFamily::kKimiK3;
  json t;
  t["vocab_size"] = c.vocab_size;
  t["hidden_size"] = c.hidden_size;
  t["num_hidden_layers"] = c.num_layers;
  t["intermediate_size"] = c.intermediate_size;
  t["first_k_dense_replace"] = c.first_k_dense_replace;
  t["moe_layer_freq"] = c.moe_layer_freq;
  t["rms_norm_eps"] = c.rms_norm_eps;
  t["tie_word_embeddings"] = c.tie_word_embeddings;
  t["num_attention_heads"] = c.mla_num_heads;
  t["num_key_value_heads"] = c.mla_num_heads;
  t["q_lora_rank"] = opt(c.q_lora_rank);
  t["kv_lora_rank"] = c.kv_lora_rank;
  t["qk_nope_head_dim"] = c.qk_nope_head_dim;
  t["qk_rope_head_dim"] = c.qk_rope_head_dim;
  t["v_head_dim"] = c.v_head_dim;
  t["mla_use_nope"] = true;
  if (k3 || c.mla_use_output_gate) t["mla_use_output_gate"] = c.mla_use_output_gate;
  if (c.head_dim_field) t["head_dim"] = *c.head_dim_field;

  json lac;
  lac["num_heads"] = c.kda_num_heads;
  lac["head_dim"] = c.kda_head_dim;
  lac["short_conv_kernel_size"] = c.kda_conv_kernel;
  lac["kda_layers"] = layer_list(c, LayerMixer::kKda);
  lac["full_attn_layers"] = layer_list(c, LayerMixer::kMla);
  if (c.kda_gate_lower_bound) lac["gate_lower_bound"] = *c.kda_gate_lower_bound;
  if (k3 || c.kda_use_full_rank_gate) lac["use_full_rank_gate"] = c.kda_use_full_rank_gate;
  t["linear_attn_config"] = std::move(lac);

  t["num_experts"] = c.num_experts > 0 ? json(c.num_experts) : json(nullptr);
  t["num_experts_per_token"] = c.num_experts_per_token;
  t["num_shared_experts"] = c.num_shared_experts;
  t["moe_intermediate_size"] = c.moe_intermediate_size;
  if (c.routed_expert_hidden_size) t["routed_expert_hidden_size"] = *c.routed_expert_hidden_size;
  if (k3 || c.latent_moe_use_norm) t["latent_moe_use_norm"] = c.latent_moe_use_norm;
  t["moe_renormalize"] = c.moe_renormalize;
  t["routed_scaling_factor"] = c.routed_scaling_factor;
  t["use_grouped_topk"] = c.use_grouped_topk;
  t["num_expert_group"] = c.num_expert_group;
  t["topk_group"] = c.topk_group;
  t["moe_router_activation_func"] = "sigmoid";
  if (k3) t["topk_method"] = "noaux_tc";
  t["num_nextn_predict_layers"] = 0;

  t["hidden_act"] = c.hidden_act == HiddenAct::kSitu ? "situ" : "silu";
  if (c.situ_beta) t["activation_situ_beta"] = *c.situ_beta;
  if (c.situ_linear_beta) t["activation_situ_linear_beta"] = *c.situ_linear_beta;
  if (k3 || c.attn_res_block_size > 0) t["attn_res_block_size"] = c.attn_res_block_size;

  if (c.bos_token_id) t["bos_token_id"] = *c.bos_token_id;
  if (c.eos_token_id) t["eos_token_id"] = *c.eos_token_id;
  if (c.pad_token_id) t["pad_token_id"] = *c.pad_token_id;
  t["use_cache"] = true;
  if (c.quantization.method != QuantMethod::kNone) {
    t["quantization_config"] = quantization_config_to_json(
        c.quantization, c.quantization.modelopt_mixed ? expert_modules(c) : std::vector<std::string>{});
  }
  return t;
}

// MoonViT-V2 as released; only text_hidden_size follows the text model. Text-only inference ignores it.
json vision_config(int64_t text_hidden_size) {
  return {{"_attn_implementation", "flash_attention_2"},
          {"activation_func", "gelu_pytorch_tanh"},
          {"attn_bias", false},
          {"init_pos_emb_height", 64},
          {"init_pos_emb_time", 4},
          {"init_pos_emb_width", 64},
          {"linear_bias", false},
          {"merge_kernel_size", {2, 2}},
          {"merge_type", "sd2_tpool"},
          {"mlp_type", "mlp2"},
          {"mm_hidden_size", 1024},
          {"mm_projector_type", "patchmergerv2"},
          {"norm_type", "rmsnorm"},
          {"patch_embed_proj_bias", false},
          {"patch_size", 14},
          {"pos_emb_interpolation_mode", "bilinear"},
          {"pos_emb_type", "divided_fixed"},
          {"projector_hidden_act", "gelu"},
          {"projector_ln_eps", 1e-05},
          {"qkv_hidden_size", 1536},
          {"text_hidden_size", text_hidden_size},
          {"vt_hidden_size", 1024},
          {"vt_intermediate_size", 4096},
          {"vt_num_attention_heads", 12},
          {"vt_num_hidden_layers", 27}};
}

}  // namespace

ModelConfig ModelConfig::from_json(const nlohmann::json& j, const std::string& source) {
  const JsonFields top(j, source, "");
  const std::string model_type = top.get_string("model_type");
  ModelConfig c;
  if (model_type == "kimi_k3") {
    c.family = ModelFamily::kKimiK3;
    const JsonFields text = top.object("text_config");
    if (auto mt = text.opt_string("model_type"); mt && *mt != "kimi_linear") {
      text.fail_field("model_type", fmt::format("is \"{}\": the Kimi K3 text model is \"kimi_linear\"", *mt));
    }
    parse_text_fields(text, c);
    merge_top_level(top, text, c);
    // Fields whose absence the parser would read as a feature switched off (Kimi Linear's behaviour): a K3
    // config always states them (RUST-CFG's validator requires each), and a K3 checkpoint read without one would
    // load, its tensors for the feature set aside, and compute another model.
    // (A missing routed_expert_hidden_size or activation_situ_beta is refused by validate(), by what it breaks.)
    for (const char* field : {"mla_use_output_gate", "attn_res_block_size", "latent_moe_use_norm"}) {
      if (!text.has(field)) text.fail_field(field, "is missing: a Kimi K3 config states it");
    }
    if (c.hidden_act == HiddenAct::kSitu && !text.has("activation_situ_linear_beta")) {
      text.fail_field("activation_situ_linear_beta", "is missing: a Kimi K3 config with SiTU states it");
    }
    const JsonFields lac = text.object("linear_attn_config");
    for (const char* field : {"gate_lower_bound", "use_full_rank_gate"}) {
      if (!lac.has(field)) lac.fail_field(field, "is missing: a Kimi K3 config states it");
    }
  } else if (model_type == "kimi_linear") {
    c.family = ModelFamily::kKimiLinear;
    parse_text_fields(top, c);
  } else {
    top.fail_field("model_type", fmt::format("is \"{}\": kimirt runs \"kimi_k3\" and \"kimi_linear\"", model_type));
  }
  c.validate(source);
  return c;
}

ModelConfig ModelConfig::from_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  KIMIRT_CHECK(in.good(), "{}: cannot open", path.string());
  std::stringstream buffer;
  buffer << in.rdbuf();
  return from_json(parse_json_strict_or_fail(buffer.str(), path.string()), path.string());
}

nlohmann::json ModelConfig::to_json() const {
  json text = text_fields(*this);
  if (family == ModelFamily::kKimiLinear) {
    text["architectures"] = {"KimiLinearForCausalLM"};
    text["model_type"] = "kimi_linear";
    text["torch_dtype"] = dtype;
    text["rope_theta"] = 10000.0;  // written by the release, unused (NoPE)
    text["rope_scaling"] = nullptr;
    if (max_position_embeddings) text["model_max_length"] = *max_position_embeddings;
    return text;
  }
  text["architectures"] = {"KimiLinearForCausalLM"};
  text["model_type"] = "kimi_linear";
  text["dtype"] = dtype;
  text["initializer_range"] = 0.02;
  text["auto_map"] = {{"AutoConfig", "configuration_kimi_k3.KimiLinearConfig"},
                      {"AutoModel", "modeling_kimi_linear.KimiLinearModel"},
                      {"AutoModelForCausalLM", "modeling_kimi_linear.KimiLinearForCausalLM"}};
  if (max_position_embeddings) text["max_position_embeddings"] = *max_position_embeddings;
  json top;
  top["architectures"] = {"KimiK3ForConditionalGeneration"};
  top["auto_map"] = {{"AutoConfig", "configuration_kimi_k3.KimiK3Config"},
                     {"AutoModel", "modeling_kimi_k3.KimiK3ForConditionalGeneration"},
                     {"AutoModelForCausalLM", "modeling_kimi_k3.KimiK3ForConditionalGeneration"}};
  top["model_type"] = "kimi_k3";
  top["dtype"] = dtype;
  if (bos_token_id) top["bos_token_id"] = *bos_token_id;
  if (eos_token_id) top["eos_token_id"] = *eos_token_id;
  if (pad_token_id) top["pad_token_id"] = *pad_token_id;
  top["ignore_index"] = -100;
  top["image_placeholder"] = "<|kimi_image_placeholder|>";
  if (media_placeholder_token_id) top["media_placeholder_token_id"] = *media_placeholder_token_id;
  top["tie_word_embeddings"] = tie_word_embeddings;
  top["text_config"] = std::move(text);
  top["vision_config"] = vision_config(hidden_size);
  return top;
}

}  // namespace kimirt::model
