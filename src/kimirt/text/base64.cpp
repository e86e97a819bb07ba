// Table-driven base64 decoding, four characters to three bytes.
#include "kimirt/text/base64.h"

#include <array>
#include <cstdint>

namespace kimirt::text {
namespace {

constexpr std::uint8_t kBad = 0xFF;

constexpr std::array<std::uint8_t, 256> make_table() {
  std::array<std::uint8_t, 256> table{};
  for (auto& v : table) v = kBad;
  constexpr std::string_view alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (size_t i = 0; i < alphabet.size(); ++i)
    table[static_cast<unsigned char>(alphabet[i])] = static_cast<std::uint8_t>(i);
  return table;
}

constexpr auto kTable = make_table();

}  // namespace

bool base64_decode(std::string_view in, std::string& out) {
  out.clear();
  if (in.size() % 4 != 0) return false;
  size_t padding = 0;
  if (!in.empty() && in.back() == '=') padding = in[in.size() - 2] == '=' ? 2 : 1;
  out.reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    const bool last = i + 4 == in.size();
    const size_t pad_here = last ? padding : 0;
    std::uint32_t group = 0;
    for (size_t k = 0; k < 4; ++k) {
      std::uint8_t v = 0;
      if (k < 4 - pad_here) {
        v = kTable[static_cast<unsigned char>(in[i + k])];
        if (v == kBad) return false;
      }
      group = (group << 6) | v;
    }
    // Bits that padding discards must be zero, otherwise two spellings would decode to the same bytes.
    if (pad_here == 1 && (group & 0xFF) != 0) return false;
    if (pad_here == 2 && (group & 0xFFFF) != 0) return false;
    out.push_back(static_cast<char>(group >> 16));
    if (pad_here < 2) out.push_back(static_cast<char>((group >> 8) & 0xFF));
    if (pad_here < 1) out.push_back(static_cast<char>(group & 0xFF));
  }
  return true;
}

}  // namespace kimirt::text
