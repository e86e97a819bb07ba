// What the commands that run a model read from its directory besides the weights: the tokenizer (when it
// matches the model's vocabulary), the EOS ids (config.json and generation_config.json), and --ids lists.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "kimirt/model/config.h"
#include "kimirt/text/tokenizer.h"

namespace kimirt::cli {

// The directory's tokenizer when it has one whose vocabulary is the model's (a warning and nullopt when
// the sizes differ; nullopt when there is none).
std::optional<text::Tokenizer> find_tokenizer(const std::filesystem::path& dir, int64_t vocab);
// config.json's eos_token_id, plus those of generation_config.json (an id or a list) when it is there.
std::vector<int32_t> eos_ids(const std::filesystem::path& dir, const model::ModelConfig& config);
// "1, 2,3" -> {1, 2, 3}; errors name the element.
std::vector<int32_t> parse_ids(const std::string& text);

}  // namespace kimirt::cli
