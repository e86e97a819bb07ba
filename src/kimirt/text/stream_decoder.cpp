// The pending buffer only ever holds a valid prefix of one character, so each push decodes at most
// 3 + (token length) bytes: constant work per id whatever the length of the stream.
#include "kimirt/text/stream_decoder.h"

#include "kimirt/text/utf8.h"

namespace kimirt::text {

StreamDecoder::StreamDecoder(Tokenizer tokenizer, bool skip_special)
    : tokenizer_(std::move(tokenizer)), skip_special_(skip_special) {}

void StreamDecoder::push(TokenId id, std::string& out) {
  const std::string_view bytes = tokenizer_.id_to_bytes(id);
  if (skip_special_ && tokenizer_.is_special(id)) return;
  pending_.append(bytes);
  const size_t consumed = decode_utf8_prefix(pending_, /*final=*/false, out);
  pending_.erase(0, consumed);
}

std::string StreamDecoder::push(TokenId id) {
  std::string out;
  push(id, out);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out;
  decode_utf8_prefix(pending_, /*final=*/true, out);
  pending_.clear();
  return out;
}

}  // namespace kimirt::text
