// The Kimi pattern uses things PCRE2 lacks or defines differently, so it is rewritten here:
//  - class intersection `[X&&[^\p{Han}]]` becomes a lookahead in front of the class, `(?:(?!Han)[X])`;
//  - `\s` / `\S` are spelled out as Unicode White_Space, which is what Rust's regex (tiktoken's engine)
//    means by `\s`; PCRE2's own `\s` also matches U+180E.
//  - `\p{Han}` in Rust's regex is the Script property; PCRE2 >= 10.40 reads a bare script name as Script
//    Extensions (which would pull 、。 into Han runs), so we say `\p{sc:Han}`.
//  - the case-insensitive suffix `(?i:'s|'t|'re|'ve|'m|'ll|'d)` is spelled out with Unicode simple case
//    folding, which adds only U+017F (long s) to plain ASCII case.
//  - Debian's PCRE2 10.42 has Unicode 14 tables, tiktoken's regex crate Unicode 16: the Han ideographs of
//    Unicode 15.0 and 15.1 (CJK extensions H and I) are unassigned to PCRE2, so they are added by range
//    wherever the pattern names Han or letters. Other characters new since Unicode 14 (a few scripts and
//    symbols) are still classified as unassigned.
// The golden cases (tests/text/tokenizer_golden_test.cpp) and pretokenizer_test.cpp prove the rewrite.
#include "kimirt/text/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kimirt/base/error.h"
#include "kimirt/text/ascii_scanner.h"

namespace kimirt::text {
namespace {

std::string build_pattern() {
  const std::string space =
      "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";
  const std::string late_han = "\\x{2EBF0}-\\x{2EE5D}\\x{31350}-\\x{323AF}";  // CJK Ext. I, H: Lo, Script=Han
  const std::string han = "[\\p{sc:Han}" + late_han + "]";
  const std::string ws = "[" + space + "]";
  const std::string not_ws = "[^" + space + "]";
  const std::string upper = "(?:(?!" + han + ")[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])";
  const std::string lower = "(?:(?!" + han + ")[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])";
  const std::string suffix = "(?:'[sS\\x{17F}]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?";
  const std::string lead = "[^\\r\\n\\p{L}\\p{N}" + late_han + "]?";
  // The eight alternatives of the original, in its order (the order decides between them).
  const std::string alternatives[] = {
      han + "+",
      lead + upper + "*" + lower + "+" + suffix,
      lead + upper + "+" + lower + "*" + suffix,
      "\\p{N}{1,3}",
      " ?[^" + space + "\\p{L}\\p{N}" + late_han + "]+[\\r\\n]*",
      ws + "*[\\r\\n]+",
      ws + "+(?!" + not_ws + ")",
      ws + "+",
  };
  std::string pattern;
  for (const auto& alternative : alternatives) pattern += (pattern.empty() ? "" : "|") + alternative;
  return pattern;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof(buffer)) < 0) return "error " + std::to_string(code);
  return reinterpret_cast<const char*>(buffer);
}

// Match data, match contexts and JIT stacks are per thread: PCRE2 forbids sharing them between concurrent
// matches. Contexts carry the limits, so there is one set per distinct PretokenizerLimits a thread uses.
struct MatchContexts {
  PretokenizerLimits limits;
  pcre2_match_context* jit = nullptr;
  pcre2_match_context* fallback = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
};

constexpr size_t kLongPieceBytes = 64 * 1024;

struct ThreadState {
  pcre2_match_data* match_data = pcre2_match_data_create(1, nullptr);
  std::vector<MatchContexts> contexts;

  void renew_match_data() {
    pcre2_match_data_free(match_data);
    match_data = pcre2_match_data_create(1, nullptr);
    KIMIRT_ASSERT(match_data != nullptr);
  }

  const MatchContexts& for_limits(const PretokenizerLimits& limits) {
    for (const auto& c : contexts) {
      if (c.limits.jit_stack_bytes == limits.jit_stack_bytes &&
          c.limits.fallback_heap_bytes == limits.fallback_heap_bytes) {
        return c;
      }
    }
    MatchContexts c{limits, pcre2_match_context_create(nullptr), pcre2_match_context_create(nullptr), nullptr};
    KIMIRT_ASSERT(match_data != nullptr && c.jit != nullptr && c.fallback != nullptr);
    c.jit_stack =
        pcre2_jit_stack_create(std::min<size_t>(limits.jit_stack_bytes, 64 * 1024), limits.jit_stack_bytes, nullptr);
    if (c.jit_stack != nullptr) pcre2_jit_stack_assign(c.jit, nullptr, c.jit_stack);
    pcre2_set_match_limit(c.fallback, 0xFFFFFFFFu);
    pcre2_set_depth_limit(c.fallback, 0xFFFFFFFFu);
    pcre2_set_heap_limit(c.fallback, static_cast<std::uint32_t>(std::max<size_t>(limits.fallback_heap_bytes >> 10, 1)));
    contexts.push_back(c);
    return contexts.back();
  }

  ~ThreadState() {
    for (auto& c : contexts) {
      pcre2_jit_stack_free(c.jit_stack);
      pcre2_match_context_free(c.fallback);
      pcre2_match_context_free(c.jit);
    }
    pcre2_match_data_free(match_data);
  }
};

ThreadState& thread_state() {
  thread_local ThreadState state;
  return state;
}

}  // namespace

std::string_view Pretokenizer::tiktoken_pattern() {
  return "[\\p{Han}]+"
         "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*"
         "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
         "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+"
         "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
         "|\\p{N}{1,3}"
         "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
         "|\\s*[\\r\\n]+"
         "|\\s+(?!\\S)"
         "|\\s+";
}

const std::string& Pretokenizer::pcre2_pattern() {
  static const std::string pattern = build_pattern();
  return pattern;
}

Pretokenizer::Pretokenizer(bool ascii_fast_path, PretokenizerLimits limits)
    : ascii_fast_path_(ascii_fast_path), limits_(limits) {
  const std::string& pattern = pcre2_pattern();
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  // ANCHORED: every position of valid UTF-8 starts a match (each code point is a letter, a number, white
  // space or something else, and each kind has an alternative), so each match begins where the last ended.
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_ANCHORED, &error, &error_offset, nullptr);
  KIMIRT_CHECK(code != nullptr, "cannot compile the pre-tokenizer pattern at offset {}: {}", error_offset,
               pcre2_message(error));
  std::uint32_t jit_available = 0;
  pcre2_config(PCRE2_CONFIG_JIT, &jit_available);
  jit_ = jit_available != 0 && pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  code_ = code;
}

Pretokenizer::~Pretokenizer() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Pretokenizer::split(std::string_view text, std::vector<PieceSpan>& out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  ThreadState& state = thread_state();
  const MatchContexts& contexts = state.for_limits(limits_);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t size = text.size();
  size_t pos = 0;
  while (pos < size) {
    if (ascii_fast_path_) {
      const size_t end = scan_ascii_piece(text, pos);
      if (end != 0) {
        out.push_back({static_cast<std::uint32_t>(pos), static_cast<std::uint32_t>(end)});
        pos = end;
        continue;
      }
    }
    int rc = 0;
    bool interpreted = !jit_;
    if (jit_) {
      rc = pcre2_jit_match(code, subject, size, pos, 0, state.match_data, contexts.jit);
      interpreted = rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT;
    }
    if (interpreted) {
      rc =
          pcre2_match(code, subject, size, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, state.match_data, contexts.fallback);
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.match_data);
    const size_t begin = rc > 0 ? ovector[0] : pos;
    const size_t end = rc > 0 ? ovector[1] : pos;
    // The interpreter keeps its backtracking frames in the match data, and the heap limit only checks
    // growth: after a long word, let the frames go so that the memory and the limit start afresh.
    if (interpreted && (rc <= 0 || end - pos > kLongPieceBytes)) state.renew_match_data();
    KIMIRT_CHECK(rc > 0,
                 "cannot split the text at byte {} into pieces ({}): a single word of this length is more than "
                 "the pre-tokenizer handles",
                 pos, pcre2_message(rc));
    KIMIRT_ASSERT(begin == pos && end > pos);
    out.push_back({static_cast<std::uint32_t>(pos), static_cast<std::uint32_t>(end)});
    pos = end;
  }
}

}  // namespace kimirt::text
