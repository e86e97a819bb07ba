// tokenizer_config.json is Hugging Face's format: `added_tokens_decoder` maps decimal id strings to
// objects whose "content" is the token text; the role fields name a token either as a plain string or as
// an AddedToken object with a "content".
#include "kimirt/text/special_tokens.h"

#include <algorithm>
#include <charconv>
#include <nlohmann/json.hpp>

#include "kimirt/base/error.h"
#include "kimirt/base/strict_json.h"

namespace kimirt::text {
namespace {

using nlohmann::json;

std::optional<std::string> role_token(const json& root, const char* field, std::string_view name) {
  const auto it = root.find(field);
  if (it == root.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    const auto content = it->find("content");
    KIMIRT_CHECK(content != it->end() && content->is_string(), "{}: field \"{}\" has no string \"content\"", name,
                 field);
    return content->get<std::string>();
  }
  fail("{}: field \"{}\" must be a string or an object with \"content\"", name, field);
}

}  // namespace

TokenizerConfig parse_tokenizer_config(std::string_view json_text, std::string_view name) {
  const json root = parse_json_strict_or_fail(json_text, name);
  KIMIRT_CHECK(root.is_object(), "{}: the top level must be a JSON object", name);
  TokenizerConfig config;
  const auto added = root.find("added_tokens_decoder");
  KIMIRT_CHECK(added != root.end(), "{}: field \"added_tokens_decoder\" is missing", name);
  KIMIRT_CHECK(added->is_object(), "{}: field \"added_tokens_decoder\" must be an object", name);
  for (const auto& [key, value] : added->items()) {
    TokenId id = -1;
    const auto [ptr, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    KIMIRT_CHECK(ec == std::errc() && ptr == key.data() + key.size() && id >= 0,
                 "{}: added_tokens_decoder key \"{}\" is not a token id", name, key);
    KIMIRT_CHECK(value.is_object(), "{}: added_tokens_decoder[\"{}\"] must be an object", name, key);
    const auto content = value.find("content");
    KIMIRT_CHECK(content != value.end() && content->is_string(),
                 "{}: added_tokens_decoder[\"{}\"] has no string \"content\"", name, key);
    KIMIRT_CHECK(!content->get_ref<const std::string&>().empty(), "{}: added_tokens_decoder[\"{}\"] has empty content",
                 name, key);
    config.added_tokens.push_back({id, content->get<std::string>()});
  }
  std::sort(config.added_tokens.begin(), config.added_tokens.end(),
            [](const SpecialToken& a, const SpecialToken& b) { return a.id < b.id; });
  // Distinct keys may name one id ("6" and "06"): which content would win is not the config's to leave open.
  for (size_t i = 1; i < config.added_tokens.size(); ++i) {
    const SpecialToken &a = config.added_tokens[i - 1], &b = config.added_tokens[i];
    KIMIRT_CHECK(a.id != b.id, "{}: added_tokens_decoder gives id {} twice (\"{}\" and \"{}\")", name, a.id, a.content,
                 b.content);
  }
  config.bos_token = role_token(root, "bos_token", name);
  config.eos_token = role_token(root, "eos_token", name);
  config.pad_token = role_token(root, "pad_token", name);
  config.unk_token = role_token(root, "unk_token", name);
  config.has_chat_template = root.contains("chat_template") && !root["chat_template"].is_null();
  return config;
}

SpecialTokenTable::SpecialTokenTable(const TokenizerConfig& config, TokenId num_ranks, std::string_view config_name)
    : first_id_(num_ranks) {
  std::vector<std::string> contents(kNumSpecialIds);
  for (const auto& token : config.added_tokens) {
    KIMIRT_CHECK(token.id >= num_ranks && token.id < num_ranks + kNumSpecialIds,
                 "{}: added token {} \"{}\" is outside the special ids {}..{} that follow the {} ranks of "
                 "tiktoken.model",
                 config_name, token.id, token.content, num_ranks, num_ranks + kNumSpecialIds - 1, num_ranks);
    contents[static_cast<size_t>(token.id - num_ranks)] = token.content;
  }
  tokens_.reserve(kNumSpecialIds);
  for (TokenId i = 0; i < kNumSpecialIds; ++i) {
    const TokenId id = num_ranks + i;
    std::string content = contents[static_cast<size_t>(i)];
    if (content.empty()) content = "<|reserved_token_" + std::to_string(id) + "|>";
    const auto [it, inserted] = by_content_.emplace(content, id);
    KIMIRT_CHECK(inserted, "{}: special token \"{}\" is given to both id {} and id {}", config_name, content,
                 it->second, id);
    first_byte_[static_cast<unsigned char>(content[0])] = true;
    if (std::find(lengths_.begin(), lengths_.end(), content.size()) == lengths_.end()) {
      lengths_.push_back(content.size());
    }
    tokens_.push_back({id, std::move(content)});
  }
  std::sort(lengths_.begin(), lengths_.end(), std::greater<>());
}

std::optional<TokenId> SpecialTokenTable::find(std::string_view content) const {
  const auto it = by_content_.find(content);
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

std::optional<SpecialMatch> SpecialTokenTable::next_match(std::string_view text, size_t from) const {
  for (size_t pos = from; pos < text.size(); ++pos) {
    if (!first_byte_[static_cast<unsigned char>(text[pos])]) continue;
    for (const size_t length : lengths_) {
      if (length > text.size() - pos) continue;
      const auto it = by_content_.find(text.substr(pos, length));
      if (it != by_content_.end()) return SpecialMatch{pos, length, it->second};
    }
  }
  return std::nullopt;
}

}  // namespace kimirt::text
