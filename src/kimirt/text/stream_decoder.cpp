// The pending buffer only ever holds a valid prefix of one character, so each push decodes at most
// 3 + (token length) bytes: constant work per id whatever the length of the stream.
#include "kimirt/text/stream_decoder.h"

#include "kimirt/base/error.h"
#include "kimirt/text/utf8.h"

namespace kimirt::text {

StreamDecoder::StreamDecoder(Tokenizer tokenizer, bool skip_special, std::optional<TagMarkup> hidden_tags)
    : tokenizer_(std::move(tokenizer)), skip_special_(skip_special), tags_(hidden_tags) {
  KIMIRT_CHECK(!tags_ || skip_special_, "StreamDecoder: hidden tag names need skip_special (the tags' tokens)");
}

void StreamDecoder::decode(std::string_view bytes, std::string& out) {
  pending_.append(bytes);
  pending_.erase(0, decode_utf8_prefix(pending_, /*final=*/false, out));
}

// A NAME that no sep closed is text after all.
void StreamDecoder::flush_tag(std::string& out) {
  in_tag_ = false;
  decode(tag_, out);
  tag_.clear();
}

void StreamDecoder::push(TokenId id, std::string& out) {
  const std::string_view bytes = tokenizer_.id_to_bytes(id);
  const bool special = tokenizer_.is_special(id);
  if (tags_) {
    if (in_tag_ && id == tags_->sep) {
      in_tag_ = false;
      tag_.clear();
      return;
    }
    if (in_tag_ && !special) {
      tag_.append(bytes);
      if (tag_.size() > TagMarkup::kMaxNameBytes) flush_tag(out);
      return;
    }
    if (in_tag_) flush_tag(out);
    if (id == tags_->open || id == tags_->close) {
      in_tag_ = true;
      return;
    }
  }
  if (skip_special_ && special) return;
  decode(bytes, out);
}

std::string StreamDecoder::push(TokenId id) {
  std::string out;
  push(id, out);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out;
  if (in_tag_) flush_tag(out);
  decode_utf8_prefix(pending_, /*final=*/true, out);
  pending_.clear();
  return out;
}

}  // namespace kimirt::text
