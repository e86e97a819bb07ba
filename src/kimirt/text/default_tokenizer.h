// The tokenizer compiled into the binary (assets/default-tokenizer): a small K3-style vocabulary for the
// embedded default model, so that `kimirt run` with no model directory takes and prints real text.
#pragma once

#include <cstdint>
#include <filesystem>

namespace kimirt::text {

// Writes tiktoken.model and tokenizer_config.json into dir (which must exist).
void write_default_tokenizer(const std::filesystem::path& dir);
// Token ids the default vocabulary spans: mergeable ranks then 256 special tokens.
int64_t default_tokenizer_vocab_size();

}  // namespace kimirt::text
