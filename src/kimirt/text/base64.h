// Standard base64 (RFC 4648 alphabet, '=' padding) decoding for the token column of tiktoken.model.
#pragma once

#include <string>
#include <string_view>

namespace kimirt::text {

// Decodes `in` into `out` (replacing its contents). Returns false when `in` is not canonical padded
// base64: a length that is not a multiple of 4, a character outside the alphabet, misplaced padding, or
// padding bits that are not zero. Strict on purpose: a vocabulary line that decodes "somehow" would give
// a token the wrong bytes without anyone noticing.
bool base64_decode(std::string_view in, std::string& out);

}  // namespace kimirt::text
