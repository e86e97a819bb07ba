// Reader of tiktoken's vocabulary file `tiktoken.model`: one "base64(token bytes) rank" per line.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "kimirt/text/bpe_vocab.h"

namespace kimirt::text {

// Parses the file contents. Requirements (each violation is a kimirt::Error "<name>:<line>: ..."):
// two fields per non-empty line, canonical base64 of at least one byte, a decimal rank; ranks are a
// permutation of 0..N-1 (N = number of tokens, because Kimi numbers its special tokens from N), no rank
// and no byte string twice.
BpeVocab parse_tiktoken_model(std::string_view contents, std::string_view name);

// Reads and parses the file; a missing or unreadable file is an error naming the path.
BpeVocab load_tiktoken_model(const std::filesystem::path& path);

// Whole-file read shared by the text layer's loaders; throws naming the path.
std::string read_text_file(const std::filesystem::path& path);

}  // namespace kimirt::text
