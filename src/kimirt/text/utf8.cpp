// UTF-8 classification by the table of well-formed byte sequences (Unicode 15, table 3-7).
#include "kimirt/text/utf8.h"

#include <cstdint>
#include <cstring>

namespace kimirt::text {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// Allowed range of the second byte for a lead byte; later bytes are always 80..BF. The narrowed ranges
// exclude overlong forms (E0, F0), surrogates (ED) and code points above U+10FFFF (F4).
struct LeadInfo {
  size_t length;  // 0: not a valid lead byte
  unsigned char second_lo;
  unsigned char second_hi;
};

LeadInfo lead_info(unsigned char b) {
  if (b < 0x80) return {1, 0, 0};
  if (b < 0xC2) return {0, 0, 0};
  if (b < 0xE0) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b < 0xF0) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b < 0xF4) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

}  // namespace

Utf8Sequence utf8_sequence_at(std::string_view bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const LeadInfo info = lead_info(p[0]);
  if (info.length == 0) return {Utf8Status::kInvalid, 1};
  if (info.length == 1) return {Utf8Status::kValid, 1};
  for (size_t i = 1; i < info.length; ++i) {
    if (i >= bytes.size()) return {Utf8Status::kIncomplete, i};
    const unsigned char lo = i == 1 ? info.second_lo : 0x80;
    const unsigned char hi = i == 1 ? info.second_hi : 0xBF;
    if (p[i] < lo || p[i] > hi) return {Utf8Status::kInvalid, i};
  }
  return {Utf8Status::kValid, info.length};
}

size_t find_invalid_utf8(std::string_view bytes) {
  size_t i = 0;
  while (i < bytes.size()) {
    // ASCII runs dominate real text; skip them eight bytes at a time.
    while (i + 8 <= bytes.size()) {
      std::uint64_t word;
      std::memcpy(&word, bytes.data() + i, 8);
      if (word & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= bytes.size()) break;
    if (static_cast<unsigned char>(bytes[i]) < 0x80) {
      ++i;
      continue;
    }
    const Utf8Sequence seq = utf8_sequence_at(bytes.substr(i));
    if (seq.status != Utf8Status::kValid) return i;
    i += seq.length;
  }
  return bytes.size();
}

size_t decode_utf8_prefix(std::string_view bytes, bool final, std::string& out) {
  size_t i = 0;
  while (i < bytes.size()) {
    const Utf8Sequence seq = utf8_sequence_at(bytes.substr(i));
    switch (seq.status) {
      case Utf8Status::kValid:
        out.append(bytes.substr(i, seq.length));
        break;
      case Utf8Status::kInvalid:
        out.append(kReplacement);
        break;
      case Utf8Status::kIncomplete:
        if (!final) return i;
        out.append(kReplacement);
        break;
    }
    i += seq.length;
  }
  return i;
}

}  // namespace kimirt::text
