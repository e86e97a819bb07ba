#include "kimirt/base/printable.h"

#include <fmt/format.h>

#include <algorithm>

namespace kimirt {

std::string printable(std::string_view text, size_t max_bytes) {
  std::string out;
  out.reserve(std::min(text.size(), max_bytes) + 16);
  size_t i = 0;
  // Where the last multi-byte character began, in the text and in `out`: a cut inside it goes back there (a lone
  // continuation byte, invalid UTF-8, is no character to keep whole).
  size_t unit_in = 0, unit_out = 0;
  bool in_character = false;
  for (; i < text.size() && out.size() < max_bytes; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c & 0xC0) != 0x80) {
      in_character = c >= 0xC0;
      unit_in = i, unit_out = out.size();
    }
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7F) {
      out += fmt::format("\\x{:02x}", c);
    } else if (c == 0xC2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
               static_cast<unsigned char>(text[i + 1]) <= 0x9F) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned char>(text[++i]));
    } else {
      out += static_cast<char>(c);
    }
  }
  if (i < text.size()) {
    if (in_character && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) {  // cut inside a character
      i = unit_in;
      out.resize(unit_out);
    }
    out += fmt::format("... ({} more bytes)", text.size() - i);
  }
  return out;
}

}  // namespace kimirt
