// Streaming detokenization: turns generated ids into text one id at a time, emitting only whole UTF-8
// characters. A character whose bytes are split across ids (common for CJK and emoji with byte-level
// BPE) is held until its last byte arrives; bytes that can never form a character become U+FFFD.
#pragma once

#include <string>

#include "kimirt/text/tokenizer.h"

namespace kimirt::text {

class StreamDecoder {
 public:
  // skip_special: special tokens (end-of-turn markers, ...) produce no text.
  explicit StreamDecoder(Tokenizer tokenizer, bool skip_special = false);

  // Text completed by this id (possibly empty). Throws kimirt::Error for an id outside the vocabulary.
  std::string push(TokenId id);
  void push(TokenId id, std::string& out);  // appends instead of returning

  // End of the stream: bytes still waiting for the rest of their character, as one U+FFFD.
  std::string finish();
  bool has_pending() const { return !pending_.empty(); }
  void reset() { pending_.clear(); }

 private:
  Tokenizer tokenizer_;
  bool skip_special_;
  std::string pending_;  // at most 3 bytes: an incomplete but still possible character
};

}  // namespace kimirt::text
