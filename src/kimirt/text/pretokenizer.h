// Splits text into the pieces BPE sees, with the Kimi pre-tokenizer pattern (tokenization_kimi.py's
// `pat_str`, shared by Kimi K2, Kimi Linear and Kimi K3), run on PCRE2 (JIT-compiled when available).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace kimirt::text {

struct PieceSpan {
  std::uint32_t begin;
  std::uint32_t end;
};

// Memory the matcher may use per thread. Letter runs backtrack one frame per character, so the JIT stack
// grows with the longest non-ASCII word (ASCII words never reach PCRE2: see ascii_scanner.h). The stack is
// reserved address space, committed only as used (~8 bytes per character: the default holds a word of
// about 30 million characters). Longer runs fall back to the interpreter, whose heap frames are capped;
// past that the text is refused with an error rather than exhausting memory.
struct PretokenizerLimits {
  size_t jit_stack_bytes = size_t{256} << 20;
  size_t fallback_heap_bytes = size_t{1} << 30;
};

class Pretokenizer {
 public:
  // With ascii_fast_path, pieces made only of ASCII (and decided by ASCII alone) are cut by a hand-written
  // scanner of the same pattern; anything else goes to PCRE2. Off only to test the two against each other.
  explicit Pretokenizer(bool ascii_fast_path = true, PretokenizerLimits limits = {});
  ~Pretokenizer();
  Pretokenizer(const Pretokenizer&) = delete;
  Pretokenizer& operator=(const Pretokenizer&) = delete;

  // Appends the byte spans of the pieces of `text` to `out`, in order; together they cover the text.
  // `text` must be valid UTF-8 (the tokenizer checks before calling) and shorter than 4 GiB. Pieces of
  // one call never cross its end: the lookahead of `\s+(?!\S)` sees the end of `text` as the end of the
  // string, as tiktoken does for the text between two special tokens. Thread-safe.
  void split(std::string_view text, std::vector<PieceSpan>& out) const;

  // The pattern as tiktoken runs it (with `&&` class intersections) and the PCRE2 form we compile.
  static std::string_view tiktoken_pattern();
  static const std::string& pcre2_pattern();
  bool jit_enabled() const { return jit_; }

 private:
  void* code_ = nullptr;  // pcre2_code_8*, kept out of the header so users need not include pcre2.h
  bool jit_ = false;
  bool ascii_fast_path_ = true;
  PretokenizerLimits limits_;
};

}  // namespace kimirt::text
