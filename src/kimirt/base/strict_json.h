// JSON parsing for files we do not trust: rejects duplicate keys (nlohmann's normal parse keeps the last
// one silently, which lets two readers of one file see different tensors), bounds the nesting depth, and
// keeps the distinction between "had a minus sign" and "unsigned" integers that the format checks need.
// In base so that every reader of a JSON file (checkpoint, config, tokenizer, generation config) is strict
// in the same way, the text layer included.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace kimirt {

// Offset of the first byte that breaks UTF-8 (truncated or overlong sequence, surrogate, > U+10FFFF);
// nullopt when the whole text is valid.
std::optional<size_t> find_invalid_utf8(std::string_view text);

struct JsonProblem {
  enum class Kind { kInvalidUtf8, kSyntax, kDuplicateKey, kTooDeep };
  Kind kind;
  std::string message;  // says where: byte offset, or the key path of a duplicate ("a" > "b")
};

// Parses one JSON value (JSON whitespace around it is allowed). Integers keep their sign class: a number
// written with a minus sign is number_integer, one without is number_unsigned, and one that is too large
// for 64 bits or has a fraction or exponent is number_float. Returns nullopt and fills `problem` on error.
std::optional<nlohmann::json> parse_json_strict(std::string_view text, JsonProblem& problem, size_t max_depth = 64);

// The same for callers with nothing to add to a problem: throws kimirt::Error "<source>: not valid JSON:
// <problem>", or "<source>: duplicate key ..." for a duplicate key.
nlohmann::json parse_json_strict_or_fail(std::string_view text, std::string_view source);

// A JSON value for a message, cut short: it came from a file and may be huge.
std::string json_excerpt(const nlohmann::json& value, size_t max_chars = 40);

}  // namespace kimirt
