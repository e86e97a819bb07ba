// Which chat template a model directory gets, and what `kimirt inspect` says about the templates the
// directory itself ships (chat_template.jinja, tokenizer_config.json "chat_template"): those are reported
// as present but never interpreted — the built-in template of the family is used.
#pragma once

#include <filesystem>
#include <string>

#include "kimirt/text/chat_template.h"

namespace kimirt::text {

struct ChatTemplateInfo {
  ChatFamily family = ChatFamily::kKimiLinear;
  std::string chosen_by;         // e.g. "config.json model_type \"kimi_k3\""
  bool jinja_file = false;       // <dir>/chat_template.jinja exists
  bool config_template = false;  // <dir>/tokenizer_config.json has a "chat_template"

  // One line for `kimirt inspect`.
  std::string describe() const;
};

// The family: from config.json `model_type` ("kimi_k3" or "kimi_linear") when it names one, else from the
// special tokens of tokenizer_config.json (<|open|>/<|end_of_msg|> for K3, <|im_user|>/<|im_end|> for Kimi
// Linear). Errors name the directory and what was found.
ChatTemplateInfo inspect_chat_template(const std::filesystem::path& model_dir);

inline ChatTemplate chat_template_for(const std::filesystem::path& model_dir) {
  return ChatTemplate(inspect_chat_template(model_dir).family);
}

}  // namespace kimirt::text
