// Text from files (tensor names, index keys, config values) goes into messages that a terminal shows: control
// characters in it could move the cursor, retitle the window or clear the screen, and a 50 MB name would make a
// 50 MB line. printable() shows such characters as escapes and caps the length.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kimirt {

// `text` with C0 controls other than newline and tab, DEL and the C1 controls (U+0080-U+009F) written as
// \xNN / \u00NN, and, past `max_bytes`, cut at a character boundary with "... (N more bytes)".
std::string printable(std::string_view text, size_t max_bytes = 4096);

}  // namespace kimirt
