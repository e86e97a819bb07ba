// Special tokens of a Kimi tokenizer: read from tokenizer_config.json (`added_tokens_decoder`, and the
// `bos_token` / `eos_token` / `pad_token` / `unk_token` names), and found in text when a caller allows it.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kimirt/text/token.h"

namespace kimirt::text {

struct SpecialToken {
  TokenId id;
  std::string content;
};

struct TokenizerConfig {
  std::vector<SpecialToken> added_tokens;  // as listed, sorted by id
  std::optional<std::string> bos_token;    // contents of the named tokens, when the file names them
  std::optional<std::string> eos_token;
  std::optional<std::string> pad_token;
  std::optional<std::string> unk_token;
  bool has_chat_template = false;  // a "chat_template" field is present (reported, never interpreted)
};

// Parses tokenizer_config.json text; errors name `name` and the field.
TokenizerConfig parse_tokenizer_config(std::string_view json_text, std::string_view name);

// Kimi's tokenizer owns exactly 256 special ids after the mergeable ranks (163,584 + 256 = 163,840 for the
// released models). Like tokenization_kimi.py, ids of that block that the config does not name are called
// "<|reserved_token_{id}|>". Ids outside the block, repeated ids or repeated contents are errors.
inline constexpr TokenId kNumSpecialIds = 256;

struct SpecialMatch {
  size_t pos;
  size_t length;
  TokenId id;
};

class SpecialTokenTable {
 public:
  SpecialTokenTable() = default;
  SpecialTokenTable(const TokenizerConfig& config, TokenId num_ranks, std::string_view config_name);

  TokenId first_id() const { return first_id_; }
  const std::vector<SpecialToken>& tokens() const { return tokens_; }  // kNumSpecialIds entries, id order
  const std::string& content(TokenId id) const { return tokens_[static_cast<size_t>(id - first_id_)].content; }
  std::optional<TokenId> find(std::string_view content) const;

  // The leftmost special token in text[from..], the longest one if several start there.
  std::optional<SpecialMatch> next_match(std::string_view text, size_t from) const;

 private:
  TokenId first_id_ = 0;
  std::vector<SpecialToken> tokens_;
  // Transparent hashing: lookups by string_view, so scanning text for special tokens allocates nothing.
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, TokenId, Hash, std::equal_to<>> by_content_;
  std::vector<size_t> lengths_;  // distinct content lengths, longest first
  bool first_byte_[256] = {};
};

}  // namespace kimirt::text
