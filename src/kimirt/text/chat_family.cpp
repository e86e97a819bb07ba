// config.json is read here only for `model_type` (the model layer owns the rest of it); K3 nests its text
// model's config under text_config, whose own model_type is "kimi_linear", so only the top level counts.
#include "kimirt/text/chat_family.h"

#include <nlohmann/json.hpp>
#include <optional>
#include <system_error>

#include "kimirt/base/error.h"
#include "kimirt/base/path_lookup.h"
#include "kimirt/base/strict_json.h"
#include "kimirt/text/special_tokens.h"
#include "kimirt/text/tiktoken_model.h"
#include "kimirt/text/tokenizer.h"

namespace kimirt::text {
namespace {

nlohmann::json read_json(const std::filesystem::path& path) {
  return parse_json_strict_or_fail(read_text_file(path), path.string());
}

bool has_token(const TokenizerConfig& config, std::string_view content) {
  for (const auto& token : config.added_tokens) {
    if (token.content == content) return true;
  }
  return false;
}

}  // namespace

std::string ChatTemplateInfo::describe() const {
  std::string line =
      "chat template: built-in " + std::string(chat_family_name(family)) + " (chosen by " + chosen_by + ")";
  if (jinja_file) line += "; chat_template.jinja present, not interpreted";
  if (config_template) line += "; tokenizer_config.json chat_template present, not interpreted";
  return line;
}

ChatTemplateInfo inspect_chat_template(const std::filesystem::path& model_dir) {
  std::error_code ec;
  KIMIRT_CHECK(path_exists(model_dir), "model directory {} does not exist", model_dir.string());
  KIMIRT_CHECK(std::filesystem::is_directory(model_dir, ec), "{} is not a directory", model_dir.string());
  ChatTemplateInfo info;
  info.jinja_file = path_exists(model_dir / "chat_template.jinja");

  std::string model_type;
  std::string config_fact = "there is no config.json";
  const auto config_path = model_dir / "config.json";
  if (path_exists(config_path)) {
    const auto config = read_json(config_path);
    const auto it = config.is_object() ? config.find("model_type") : config.end();
    if (it != config.end() && it->is_string()) model_type = it->get<std::string>();
    config_fact =
        model_type.empty() ? "config.json has no model_type" : "config.json model_type is \"" + model_type + "\"";
  }

  std::optional<TokenizerConfig> tokenizer_config;
  const auto tokenizer_config_path = model_dir / kTokenizerConfigFile;
  if (path_exists(tokenizer_config_path)) {
    tokenizer_config = parse_tokenizer_config(read_text_file(tokenizer_config_path), tokenizer_config_path.string());
    info.config_template = tokenizer_config->has_chat_template;
  }

  if (model_type == "kimi_k3" || model_type == "kimi_linear") {
    info.family = model_type == "kimi_k3" ? ChatFamily::kKimiK3 : ChatFamily::kKimiLinear;
    info.chosen_by = "config.json model_type \"" + model_type + "\"";
    return info;
  }
  if (tokenizer_config) {
    if (has_token(*tokenizer_config, "<|open|>") && has_token(*tokenizer_config, "<|end_of_msg|>")) {
      info.family = ChatFamily::kKimiK3;
      info.chosen_by = "the <|open|> and <|end_of_msg|> tokens of tokenizer_config.json";
      return info;
    }
    if (has_token(*tokenizer_config, "<|im_user|>") && has_token(*tokenizer_config, "<|im_end|>")) {
      info.family = ChatFamily::kKimiLinear;
      info.chosen_by = "the <|im_user|> and <|im_end|> tokens of tokenizer_config.json";
      return info;
    }
  }
  fail("{}: cannot tell which chat template to use: {}, and {}", model_dir.string(), config_fact,
       tokenizer_config ? "tokenizer_config.json has neither the K3 tokens (<|open|>, <|end_of_msg|>) nor the Kimi "
                          "Linear ones (<|im_user|>, <|im_end|>)"
                        : "there is no tokenizer_config.json");
}

}  // namespace kimirt::text
