// The Kimi pre-tokenizer pattern, decided by hand for the common case where every character the regex
// would look at is ASCII. Returns 0 ("ask PCRE2") as soon as a decision would depend on a non-ASCII
// character, so the regex stays the single authority for everything else.
#pragma once

#include <cstddef>
#include <string_view>

namespace kimirt::text {

// End of the piece that starts at text[pos], or 0 when the scanner cannot decide from ASCII alone.
// `text` ends where the regex subject ends (lookahead sees its end as the end of the string).
size_t scan_ascii_piece(std::string_view text, size_t pos);

}  // namespace kimirt::text
