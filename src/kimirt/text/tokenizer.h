// The Kimi tokenizer: tiktoken byte-level BPE over the Kimi pre-tokenizer pattern, plus the 256 special
// tokens of tokenizer_config.json. Ids and bytes are exactly tiktoken's (tests/text/tokenizer_golden_test).
//
// A Tokenizer is immutable after loading and cheap to copy (shared state); encode/decode may run on any
// number of threads at once.
//
// Like tiktoken, a text is encoded whole. tokenization_kimi.py (the Hugging Face wrapper) first cuts texts
// into 400,000-character chunks and breaks runs of more than 25,000 spaces or non-spaces; ids differ from
// ours only for such texts.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kimirt/text/special_tokens.h"
#include "kimirt/text/token.h"

namespace kimirt::text {

inline constexpr const char* kTiktokenModelFile = "tiktoken.model";
inline constexpr const char* kTokenizerConfigFile = "tokenizer_config.json";

class Tokenizer {
 public:
  // Loads <model_dir>/tiktoken.model and <model_dir>/tokenizer_config.json. Errors name the file (and the
  // line or field); nothing is returned half-built.
  static Tokenizer load(const std::filesystem::path& model_dir);
  static Tokenizer from_files(const std::filesystem::path& tiktoken_model, const std::filesystem::path& config);
  // The same from file contents; `name` stands in for the directory in messages.
  static Tokenizer from_contents(std::string_view tiktoken_model, std::string_view config_json, std::string_view name);

  // Ids of `text` (valid UTF-8, else kimirt::Error naming the byte offset). With allow_special, the text
  // of a special token ("<|open|>", "[BOS]", ...) becomes its single id; without, it is ordinary text.
  std::vector<TokenId> encode(std::string_view text, bool allow_special = false) const;
  void encode_append(std::string_view text, bool allow_special, std::vector<TokenId>& out) const;

  // The bytes of the ids, concatenated; special tokens give their text unless skip_special. The result
  // need not be valid UTF-8 (a character may be cut between ids): StreamDecoder handles that case.
  std::string decode(std::span<const TokenId> ids, bool skip_special = false) const;
  std::string_view id_to_bytes(TokenId id) const;  // throws for an id outside the vocabulary

  TokenId vocab_size() const;  // ranks + special ids (163,840 for the released models)
  TokenId num_ranks() const;   // mergeable ranks; special ids start here
  bool is_special(TokenId id) const { return id >= num_ranks() && id < vocab_size(); }

  // Special tokens by their text ("<|im_end|>"), never by number: the families number them differently.
  std::optional<TokenId> find_special(std::string_view content) const;
  TokenId special_id(std::string_view content) const;  // throws, naming the token and the tokenizer
  const std::vector<SpecialToken>& special_tokens() const;
  std::optional<TokenId> bos_id() const;
  std::optional<TokenId> eos_id() const;
  std::optional<TokenId> pad_id() const;
  std::optional<TokenId> unk_id() const;

  bool has_config_chat_template() const;  // tokenizer_config.json carries a "chat_template"
  bool jit_enabled() const;               // PCRE2 JIT compiled the pre-tokenizer pattern
  const std::string& source() const;      // directory or name it was loaded from, for messages

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace kimirt::text
