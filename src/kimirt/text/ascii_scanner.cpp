// How each alternative of the pattern resolves on ASCII (Rust regex = leftmost-first, greedy, backtracking):
//   [\p{Han}]+                        never (no ASCII character is Han)
//   lead? U* L+ C?  |  lead? U+ L* C?  with lead = [^\r\n\p{L}\p{N}], U = [A-Z], L = [a-z] on ASCII, C the
//                                     contraction: the uppercase run, then the lowercase run, then 's|'t|…
//                                     (both alternatives give that same span, since U and L are disjoint here)
//   \p{N}{1,3}                        up to three digits
//   ' '? [^\s\p{L}\p{N}]+ [\r\n]*     optional space, run of "other" characters, run of CR/LF
//   \s*[\r\n]+                        a white-space run up to and including its last CR/LF
//   \s+(?!\S)                         the white-space run; without its last character if a non-space follows
//   \s+                               a single white-space character (only left when the run has length 1)
#include "kimirt/text/ascii_scanner.h"

#include <array>
#include <cstdint>

namespace kimirt::text {
namespace {

enum : std::uint8_t {
  kUpper = 1,
  kLower = 2,
  kDigit = 4,
  kSpace = 8,     // White_Space (includes CR, LF)
  kNewline = 16,  // CR, LF
  kOther = 32,    // neither letter, number nor white space
  kNonAscii = 64,
};

constexpr std::array<std::uint8_t, 256> make_classes() {
  std::array<std::uint8_t, 256> t{};
  for (int c = 0; c < 256; ++c) {
    std::uint8_t v = kOther;
    if (c >= 0x80) {
      v = kNonAscii;
    } else if (c >= 'A' && c <= 'Z') {
      v = kUpper;
    } else if (c >= 'a' && c <= 'z') {
      v = kLower;
    } else if (c >= '0' && c <= '9') {
      v = kDigit;
    } else if (c == '\r' || c == '\n') {
      v = kSpace | kNewline;
    } else if (c == '\t' || c == '\v' || c == '\f' || c == ' ') {
      v = kSpace;
    }
    t[static_cast<size_t>(c)] = v;
  }
  return t;
}

constexpr auto kClass = make_classes();

struct Text {
  std::string_view s;
  std::uint8_t cls(size_t i) const { return kClass[static_cast<unsigned char>(s[i])]; }
  // Class at i, or 0 past the end (the end of the subject).
  std::uint8_t cls_or_end(size_t i) const { return i < s.size() ? cls(i) : 0; }
  char lower(size_t i) const {
    const char c = s[i];
    return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  }
};

// The contraction after a letter run ending at `end`: returns the new end, or 0 if undecidable.
size_t contraction(const Text& t, size_t end) {
  if (end >= t.s.size() || t.s[end] != '\'') return end;
  if (end + 1 >= t.s.size()) return end;
  if (t.cls(end + 1) & kNonAscii) return 0;  // U+017F (long s) folds to 's'
  const char a = t.lower(end + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return end + 2;
  if (end + 2 >= t.s.size()) return end;
  // 'e' and 'l' have no non-ASCII case variants, so a non-ASCII byte here simply does not match.
  const char b = t.lower(end + 2);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return end + 3;
  return end;
}

// The letter alternatives from the letter at q: uppercase run, lowercase run, contraction.
size_t letters(const Text& t, size_t q) {
  size_t i = q;
  while (t.cls_or_end(i) & kUpper) ++i;
  if (t.cls_or_end(i) & kNonAscii) return 0;
  while (t.cls_or_end(i) & kLower) ++i;
  if (t.cls_or_end(i) & kNonAscii) return 0;
  return contraction(t, i);
}

size_t white_space(const Text& t, size_t p) {
  size_t q = p;
  size_t last_newline = 0;
  bool newline = false;
  for (; q < t.s.size() && (t.cls(q) & kSpace); ++q) {
    if (t.cls(q) & kNewline) {
      newline = true;
      last_newline = q;
    }
  }
  if (t.cls_or_end(q) & kNonAscii) return 0;  // the run may go on with U+00A0, U+3000, ...
  if (newline) return last_newline + 1;
  if (q == t.s.size()) return q;
  return q - p >= 2 ? q - 1 : q;
}

}  // namespace

size_t scan_ascii_piece(std::string_view text, size_t pos) {
  const Text t{text};
  const std::uint8_t c = t.cls(pos);
  if (c & kNonAscii) return 0;
  if (c & (kUpper | kLower)) return letters(t, pos);
  if (c & kDigit) {
    size_t i = pos + 1;
    while (i < pos + 3 && (t.cls_or_end(i) & kDigit)) ++i;
    if (i < pos + 3 && (t.cls_or_end(i) & kNonAscii)) return 0;  // could be a non-ASCII number
    return i;
  }
  if (!(c & kNewline)) {
    // `lead` then letters: any character that is not CR/LF, letter or number may lead a word.
    const std::uint8_t next = t.cls_or_end(pos + 1);
    if (next & kNonAscii) return 0;
    if (next & (kUpper | kLower)) return letters(t, pos + 1);
    // ' '? then a run of other characters, then CR/LF.
    size_t i = text[pos] == ' ' ? pos + 1 : pos;
    size_t k = i;
    while (t.cls_or_end(k) & kOther) ++k;
    if (k > i) {
      if (t.cls_or_end(k) & kNonAscii) return 0;
      while (t.cls_or_end(k) & kNewline) ++k;
      return k;
    }
  }
  return white_space(t, pos);
}

}  // namespace kimirt::text
