// Streaming detokenization: turns generated ids into text one id at a time, emitting only whole UTF-8
// characters. A character whose bytes are split across ids (common for CJK and emoji with byte-level
// BPE) is held until its last byte arrives; bytes that can never form a character become U+FFFD.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "kimirt/text/tokenizer.h"

namespace kimirt::text {

// Markup whose tags are written <open>NAME<sep> and <close>NAME<sep>: three special tokens around a NAME of
// plain-text tokens (K3's channels and messages: <|open|>think<|sep|> ... <|close|>think<|sep|>).
struct TagMarkup {
  // A longer NAME is not a tag's (K3's are think, response, message): a model that opens a tag and then writes
  // free text has its text shown, not held to the end of the reply.
  static constexpr size_t kMaxNameBytes = 32;
  TokenId open = -1, close = -1, sep = -1;
};

class StreamDecoder {
 public:
  // skip_special: special tokens (end-of-turn markers, ...) produce no text. hidden_tags (with skip_special):
  // the NAMEs of those tags produce none either, as they are markup too. A NAME is held until its sep; another
  // special token, the end of the stream or a NAME past kMaxNameBytes first shows it after all (it was not a
  // tag), as ChatTemplate's reply parsing reads it.
  explicit StreamDecoder(Tokenizer tokenizer, bool skip_special = false,
                         std::optional<TagMarkup> hidden_tags = std::nullopt);

  // Text completed by this id (possibly empty). Throws kimirt::Error for an id outside the vocabulary.
  std::string push(TokenId id);
  void push(TokenId id, std::string& out);  // appends instead of returning

  // End of the stream: bytes still waiting for the rest of their character, as one U+FFFD.
  std::string finish();
  bool has_pending() const { return !pending_.empty(); }
  void reset() {
    pending_.clear();
    tag_.clear();
    in_tag_ = false;
  }

 private:
  void decode(std::string_view bytes, std::string& out);  // into pending_, whole characters out
  void flush_tag(std::string& out);

  Tokenizer tokenizer_;
  bool skip_special_;
  std::optional<TagMarkup> tags_;
  bool in_tag_ = false;  // after an open or close token, before its sep
  std::string tag_;      // the bytes of the NAME so far
  std::string pending_;  // at most 3 bytes: an incomplete but still possible character
};

}  // namespace kimirt::text
