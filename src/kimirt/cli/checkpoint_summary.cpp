#include "kimirt/cli/checkpoint_summary.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>

#include "kimirt/base/error.h"
#include "kimirt/base/printable.h"
#include "kimirt/base/progress.h"
#include "kimirt/cli/model_files.h"
#include "kimirt/io/checkpoint.h"
#include "kimirt/model/load_plan.h"
#include "kimirt/model/schema.h"
#include "kimirt/quant/scale_codes.h"
#include "kimirt/quant/weight_format.h"
#include "kimirt/text/chat_family.h"
#include "kimirt/text/tokenizer.h"

namespace kimirt::cli {
namespace {

constexpr const char* kValuesNotChecked = "values not checked: the checkpoint has errors";

// Splits "a.b.weight_scale" into the weight's base and a component suffix; false for other tensors.
bool split_component(const std::string& name, std::string* base, std::string* suffix) {
  const auto dot = name.rfind('.');
  if (dot == std::string::npos) return false;
  *suffix = name.substr(dot + 1);
  if (!quant::is_component_suffix(*suffix)) return false;
  *base = name.substr(0, dot);
  return true;
}

// Runs one stage of the summary; whatever it throws becomes one error (or warning), so that a later stage
// still runs and a bad value (a config whose sizes exhaust memory) never ends `inspect` with a bare
// std::bad_alloc.
template <typename Fn>
void stage(std::vector<std::string>& problems, std::string_view what, Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    problems.push_back(e.what());
  } catch (const std::exception& e) {
    problems.push_back(fmt::format("{}: {}", what, e.what()));
  }
}

// Counts the weights per format (a weight whose tensors make none is an error) and returns the block-scale tensors
// with how they encode a scale, for check_values.
std::map<std::string, quant::ScaleCode> count_weight_formats(const io::Checkpoint& checkpoint,
                                                             const model::KeyIndex& keys, CheckpointSummary& s) {
  std::map<std::string, std::vector<quant::PresentTensor>> by_base;
  // The vision tower's weights, which a text model never reads, may be stored in a format no text weight uses (a
  // W4A16 tower, say).
  const std::string prefix = model::detect_prefix(keys);
  for (const auto& name : checkpoint.tensor_names()) {
    if (model::text_model_ignores(name, prefix)) {
      ++s.not_read;
      continue;
    }
    std::string base, suffix;
    if (!split_component(name, &base, &suffix)) continue;
    by_base[base].push_back({suffix, checkpoint.at(name).info->dtype});
  }
  std::map<std::string, quant::ScaleCode> block_scales;
  for (const auto& [base, present] : by_base) {
    stage(s.errors, base, [&] {
      const auto format = quant::detect_weight_format(base, present);
      s.weights_per_format[std::string(quant::format_name(format))]++;
      for (const auto& t : present) {
        const int c = quant::component_index(format, t.suffix);
        if (c < 0) continue;
        const quant::ScaleCode code = quant::block_scale_code(format, quant::format_components(format)[c], *t.dtype);
        if (code != quant::ScaleCode::kNone) block_scales.emplace(base + "." + t.suffix, code);
      }
    });
  }
  return block_scales;
}

void check_against_schema(const io::Checkpoint& checkpoint, const model::KeyIndex& keys, CheckpointSummary& s) {
  auto schema = std::make_shared<const model::Schema>(model::Schema::for_checkpoint(*s.config, keys));
  for (const auto& p : schema->params()) s.parameters += static_cast<uint64_t>(shape_numel(p.shape));
  const auto plan = model::LoadPlan::build(checkpoint, *schema, model::ParallelMapping{});
  s.schema = std::move(schema);
  for (const auto& key : plan.unexpected_keys()) s.warnings.push_back("unexpected tensor " + key);
}

}  // namespace

CheckpointSummary summarize_checkpoint(const std::filesystem::path& dir, bool check_values) {
  CheckpointSummary s;
  s.dir = dir;
  // One walk of the directory: the report, and the checkpoint when it has no error.
  auto inspection = io::inspect_checkpoint_dir(dir);
  s.errors = std::move(inspection.report.errors);
  s.warnings = std::move(inspection.report.warnings);
  if (!inspection.checkpoint) {
    if (check_values) s.warnings.push_back(kValuesNotChecked);
    return s;
  }
  const io::Checkpoint& checkpoint = *inspection.checkpoint;
  const std::string config_path = (dir / "config.json").string();
  stage(s.errors, "shards", [&] {
    for (const auto& shard : checkpoint.shards()) {
      s.shards.push_back({shard.path().filename().string(), shard.file_size(), shard.tensors().size()});
      for (const auto& t : shard.tensors()) s.bytes_per_dtype[std::string(dtype_name(t.dtype))] += t.nbytes();
    }
    s.tensors = checkpoint.size();
    s.tensor_bytes = checkpoint.tensor_bytes();
    for (const char* f : {"tiktoken.model", "tokenizer_config.json", "generation_config.json", "chat_template.jinja",
                          "tokenization_kimi.py"}) {
      if (checkpoint.has_file(f)) s.side_files.emplace_back(f);
    }
  });
  // One index of the keys for the two stages that ask it.
  std::optional<model::KeyIndex> keys;
  stage(s.errors, "tensor names", [&] { keys = model::checkpoint_keys(checkpoint); });
  std::map<std::string, quant::ScaleCode> block_scales;
  if (keys) stage(s.errors, "weight formats", [&] { block_scales = count_weight_formats(checkpoint, *keys, s); });
  stage(s.errors, config_path, [&] { s.config = model::ModelConfig::from_json(checkpoint.config(), config_path); });
  if (s.config) {
    if (keys) stage(s.errors, "the model's parameters", [&] { check_against_schema(checkpoint, *keys, s); });
    // What run and chat read beside the weights, read as they read it: a tokenizer or generation config they
    // would refuse is an error here too (inspect said "ok" for a garbage tiktoken.model).
    stage(s.errors, text::kTiktokenModelFile, [&] {
      if (!std::filesystem::is_regular_file(dir / text::kTiktokenModelFile)) return;
      const auto tokenizer = text::Tokenizer::load(dir);
      if (tokenizer.vocab_size() != s.config->vocab_size) {
        s.warnings.push_back(
            fmt::format("the tokenizer has {} ids, the model {}: run prints ids and refuses -p, chat refuses to start",
                        tokenizer.vocab_size(), s.config->vocab_size));
      }
    });
    stage(s.errors, "generation_config.json", [&] { (void)eos_ids(dir, *s.config); });
  }
  stage(s.warnings, "chat template", [&] { s.chat_template = text::inspect_chat_template(dir).describe(); });
  if (check_values) {
    if (!s.ok()) {
      s.warnings.push_back(kValuesNotChecked);
      return s;
    }
    stage(s.errors, "checking values", [&] {
      s.values = cli::check_values(checkpoint, block_scales, true);
      for (const auto& t : s.values->nonfinite) {
        s.errors.push_back(fmt::format("tensor {} ({}, {}): {} of {} values are NaN or infinite, the first at index {}",
                                       t.name, t.shard, t.dtype, t.nonfinite, t.elements, t.first));
      }
      for (const auto& t : s.values->invalid_scales) {
        s.errors.push_back(fmt::format(
            "tensor {} ({}, {}): {} of {} block scales are invalid ({} NaN or infinite, the others negative or so "
            "large that their weights overflow float: run refuses them), the first at index {}",
            t.name, t.shard, t.dtype, t.invalid, t.elements, t.nonfinite, t.first));
      }
    });
  }
  return s;
}

namespace {

nlohmann::json model_json(const model::ModelConfig& c) {
  int64_t kda = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) kda += c.is_kda_layer(l) ? 1 : 0;
  nlohmann::json j = {
      {"family", std::string(model::family_name(c.family))},
      {"hidden_size", c.hidden_size},
      {"layers", c.num_layers},
      {"kda_layers", kda},
      {"mla_layers", c.num_layers - kda},
      {"vocab_size", c.vocab_size},
      {"kda_heads", c.kda_num_heads},
      {"kda_head_dim", c.kda_head_dim},
      {"mla_heads", c.mla_num_heads},
      {"q_lora_rank", c.q_lora_rank ? nlohmann::json(*c.q_lora_rank) : nlohmann::json(nullptr)},
      {"kv_lora_rank", c.kv_lora_rank},
      {"experts", c.num_experts},
      {"experts_per_token", c.num_experts_per_token},
      {"shared_experts", c.num_shared_experts},
      {"moe_intermediate_size", c.moe_intermediate_size},
      {"latent_moe_width",
       c.routed_expert_hidden_size ? nlohmann::json(*c.routed_expert_hidden_size) : nlohmann::json(nullptr)},
      {"attn_res_block_size", c.attn_res_block_size},
      {"activation", c.hidden_act == model::HiddenAct::kSitu ? "situ" : "silu"},
      {"quantization", c.quantization.method == model::QuantMethod::kNone
                           ? std::string("none")
                           : std::string(quant::format_name(c.quantization.expert_format()))},
  };
  return j;
}

}  // namespace

nlohmann::json CheckpointSummary::to_json() const {
  nlohmann::json j;
  j["dir"] = dir.string();
  j["ok"] = ok();
  j["model"] = config ? model_json(*config) : nlohmann::json(nullptr);
  j["parameters"] = parameters;
  j["tensors"] = tensors;
  j["tensor_bytes"] = tensor_bytes;
  j["shards"] = nlohmann::json::array();
  for (const auto& sh : shards)
    j["shards"].push_back({{"file", sh.file}, {"bytes", sh.bytes}, {"tensors", sh.tensors}});
  j["bytes_per_dtype"] = bytes_per_dtype;
  j["weights_per_format"] = weights_per_format;
  j["tensors_not_read"] = not_read;
  j["side_files"] = side_files;
  j["chat_template"] = chat_template;
  if (values) {
    nlohmann::json bad = nlohmann::json::array();
    for (const auto& t : values->nonfinite) {
      bad.push_back({{"tensor", t.name},
                     {"shard", t.shard},
                     {"dtype", t.dtype},
                     {"elements", t.elements},
                     {"nonfinite", t.nonfinite},
                     {"first", t.first}});
    }
    nlohmann::json invalid = nlohmann::json::array();
    for (const auto& t : values->invalid_scales) {
      invalid.push_back({{"tensor", t.name},
                         {"shard", t.shard},
                         {"dtype", t.dtype},
                         {"elements", t.elements},
                         {"invalid", t.invalid},
                         {"nonfinite", t.nonfinite},
                         {"first", t.first}});
    }
    j["values"] = {{"tensors", values->tensors}, {"skipped", values->skipped}, {"bytes", values->bytes},
                   {"seconds", values->seconds}, {"nonfinite", bad},           {"invalid_scales", invalid}};
  }
  j["errors"] = errors;
  j["warnings"] = warnings;
  return j;
}

std::string CheckpointSummary::to_text() const {
  std::string out = fmt::format("checkpoint {}\n", dir.string());
  if (config) {
    const auto m = model_json(*config);
    out += fmt::format("  model       {}: hidden {}, {} layers ({} KDA + {} MLA), vocab {}\n",
                       m["family"].get<std::string>(), config->hidden_size, config->num_layers,
                       m["kda_layers"].get<int64_t>(), m["mla_layers"].get<int64_t>(), config->vocab_size);
    out += fmt::format("  attention   KDA {} heads x {}, MLA {} heads (q-LoRA {}, kv-LoRA {})\n", config->kda_num_heads,
                       config->kda_head_dim, config->mla_num_heads,
                       config->q_lora_rank ? std::to_string(*config->q_lora_rank) : std::string("none"),
                       config->kv_lora_rank);
    if (config->num_experts > 0) {
      out += fmt::format("  moe         {} experts, top-{}, {} shared, width {}{}, {}\n", config->num_experts,
                         config->num_experts_per_token, config->num_shared_experts, config->moe_intermediate_size,
                         config->routed_expert_hidden_size
                             ? fmt::format(" in a {}-wide latent", *config->routed_expert_hidden_size)
                             : std::string(),
                         m["activation"].get<std::string>());
    }
    if (config->has_attn_res()) out += fmt::format("  residual    AttnRes, block {}\n", config->attn_res_block_size);
    out += fmt::format("  declared    quantization {}\n", m["quantization"].get<std::string>());
  }
  if (parameters) {
    const double p = static_cast<double>(parameters);
    out +=
        p >= 1e9 ? fmt::format("  parameters  {:.2f} B\n", p / 1e9) : fmt::format("  parameters  {:.2f} M\n", p / 1e6);
  }
  if (!shards.empty()) {
    out += fmt::format("  shards      {} files, {} tensors, {}\n", shards.size(), tensors, format_bytes(tensor_bytes));
    for (const auto& sh : shards) {
      out += fmt::format("    {}  {} tensors  {}\n", printable(sh.file), sh.tensors, format_bytes(sh.bytes));
    }
  }
  if (!bytes_per_dtype.empty()) {
    out += "  dtypes     ";
    for (const auto& [d, b] : bytes_per_dtype) out += fmt::format(" {} {}", d, format_bytes(b));
    out += "\n";
  }
  if (!weights_per_format.empty()) {
    out += "  weights    ";
    for (const auto& [f, n] : weights_per_format) out += fmt::format(" {} {}", n, f);
    out += "\n";
  }
  if (not_read > 0) {
    out += fmt::format("  not read    {} tensors of the vision tower and projector (a text model does not use them)\n",
                       not_read);
  }
  if (!side_files.empty()) {
    out += "  files      ";
    for (const auto& f : side_files) out += " " + f;
    out += "\n";
  }
  if (!chat_template.empty()) out += "  " + chat_template + "\n";
  if (values) {
    out += fmt::format("  values      {} tensors, {} read in {:.1f} s: {}; {} without NaN or infinity codes not read\n",
                       values->tensors, format_bytes(values->bytes), values->seconds,
                       values->nonfinite.empty() && values->invalid_scales.empty()
                           ? std::string("all finite")
                           : fmt::format("{} with NaN or infinite values, {} with invalid block scales",
                                         values->nonfinite.size(), values->invalid_scales.size()),
                       values->skipped);
  }
  // Each line as printable() shows it: the names in them come from the files.
  for (const auto& w : warnings) out += "  warning: " + printable(w) + "\n";
  for (const auto& e : errors) out += "  error: " + printable(e) + "\n";
  out += ok() ? "  ok\n" : fmt::format("  INVALID: {} problem(s)\n", errors.size());
  return out;
}

}  // namespace kimirt::cli
