// UTF-8 facts shared by the tokenizer (input validation) and the streaming detokenizer (emit only whole
// characters). Invalid input is described with Unicode's "maximal subpart" rule, the same rule Python's
// bytes.decode(errors="replace") and the WHATWG decoder follow, so replacement output matches theirs.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kimirt::text {

enum class Utf8Status {
  kValid,       // a whole character of `length` bytes
  kIncomplete,  // every byte present is a valid start of a character, but the character needs more bytes
  kInvalid,     // `length` bytes (the maximal subpart, at least 1) can never start a character
};

struct Utf8Sequence {
  Utf8Status status;
  size_t length;
};

// Classifies the character that starts at bytes[0] (bytes must be non-empty).
Utf8Sequence utf8_sequence_at(std::string_view bytes);

// Offset of the first byte that is not part of a valid character, or bytes.size() when all is valid
// (a character truncated by the end counts as invalid).
size_t find_invalid_utf8(std::string_view bytes);

// Decodes as much of `bytes` as is certain: whole characters are appended to `out`, each invalid maximal
// subpart becomes U+FFFD. A trailing incomplete character is left unconsumed unless `final`, in which
// case it is replaced by one U+FFFD. Returns the number of bytes consumed.
size_t decode_utf8_prefix(std::string_view bytes, bool final, std::string& out);

}  // namespace kimirt::text
