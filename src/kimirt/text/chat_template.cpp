// Rendering goes through segments (special token / plain text) so that render() and encode() cannot
// disagree, and so that encode() can keep message text from ever becoming control tokens.
#include "kimirt/text/chat_template.h"

#include <algorithm>

#include "kimirt/base/error.h"
#include "kimirt/text/utf8.h"

namespace kimirt::text {
namespace {

// ---- Policy: the choices the documentation leaves open, made once, here. ------------------------------
// BOS: neither family's prompt starts with [BOS]. Kimi K2's published template (which Kimi Linear's
//   follows) emits none; for K3 it is UNKNOWN (spec §6, §10). A caller that wants one prepends bos_id().
// Default system prompt: K2's template inserts this one when the first message is not a system message;
//   we do the same for Kimi Linear. K3 has no documented default, so none is inserted.
constexpr std::string_view kKimiLinearDefaultSystem = "You are Kimi, an AI assistant created by Moonshot AI.";
// Reasoning: Kimi Linear has no thinking channel, so `thinking` and ChatMessage::reasoning are ignored.
//   K3 renders an assistant message's reasoning in a think channel whenever it is non-empty (history
//   included); a caller that wants old reasoning dropped clears it.
// Attribute escaping (K3 `role="…"`): UNKNOWN, so nothing is escaped; instead roles and names are
//   restricted to [A-Za-z0-9_.-], which never needs escaping. K3 has no documented place for `name`: it is
//   not rendered there.
// Layout: no newlines between blocks (the released K2 template and the XTML figure have none).
// ----------------------------------------------------------------------------------------------------------

constexpr std::string_view kImSystem = "<|im_system|>";
constexpr std::string_view kImUser = "<|im_user|>";
constexpr std::string_view kImAssistant = "<|im_assistant|>";
constexpr std::string_view kImMiddle = "<|im_middle|>";
constexpr std::string_view kImEnd = "<|im_end|>";
constexpr std::string_view kOpen = "<|open|>";
constexpr std::string_view kClose = "<|close|>";
constexpr std::string_view kSep = "<|sep|>";
constexpr std::string_view kEndOfMsg = "<|end_of_msg|>";

class SegmentBuilder {
 public:
  void special(std::string_view token) { segments_.push_back({true, std::string(token)}); }
  void text(std::string_view text) {
    if (text.empty()) return;
    if (!segments_.empty() && !segments_.back().special) {
      segments_.back().text.append(text);
    } else {
      segments_.push_back({false, std::string(text)});
    }
  }
  std::vector<ChatSegment> take() { return std::move(segments_); }

 private:
  std::vector<ChatSegment> segments_;
};

bool is_label_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
}

void check_label(std::string_view value, size_t index, const char* field, bool required) {
  if (value.empty()) {
    KIMIRT_CHECK(!required, "chat message {}: {} is empty", index, field);
    return;
  }
  for (const char c : value) {
    KIMIRT_CHECK(is_label_char(c), "chat message {}: {} \"{}\" may only contain letters, digits, '_', '-' and '.'",
                 index, field, value.substr(0, 40));
  }
}

void check_message(const ChatMessage& m, size_t index) {
  check_label(m.role, index, "role", true);
  check_label(m.name, index, "name", false);
  KIMIRT_CHECK(m.reasoning.empty() || m.role == "assistant",
               "chat message {}: role \"{}\" has reasoning, which only assistant messages carry", index, m.role);
}

void render_kimi_linear(SegmentBuilder& out, std::span<const ChatMessage> messages, bool add_generation_prompt) {
  if (!messages.empty() && messages[0].role != "system") {
    out.special(kImSystem);
    out.text("system");
    out.special(kImMiddle);
    out.text(kKimiLinearDefaultSystem);
    out.special(kImEnd);
  }
  for (const auto& m : messages) {
    out.special(m.role == "user" ? kImUser : m.role == "assistant" ? kImAssistant : kImSystem);
    out.text(m.name.empty() ? m.role : m.name);
    out.special(kImMiddle);
    out.text(m.content);
    out.special(kImEnd);
  }
  if (add_generation_prompt) {
    out.special(kImAssistant);
    out.text("assistant");
    out.special(kImMiddle);
  }
}

// <|open|>TAG<|sep|> ... <|close|>TAG<|sep|>; `open_tag` may carry attributes.
void open_block(SegmentBuilder& out, std::string_view open_tag) {
  out.special(kOpen);
  out.text(open_tag);
  out.special(kSep);
}

void close_block(SegmentBuilder& out, std::string_view tag) {
  out.special(kClose);
  out.text(tag);
  out.special(kSep);
}

void render_k3(SegmentBuilder& out, std::span<const ChatMessage> messages, bool add_generation_prompt, bool thinking) {
  for (const auto& m : messages) {
    open_block(out, "message role=\"" + m.role + "\"");
    if (m.role == "assistant") {
      if (!m.reasoning.empty() || m.think_channel) {
        open_block(out, "think");
        out.text(m.reasoning);
        close_block(out, "think");
      }
      open_block(out, "response");
      out.text(m.content);
      close_block(out, "response");
    } else {
      out.text(m.content);
    }
    close_block(out, "message");
    out.special(kEndOfMsg);
  }
  if (add_generation_prompt) {
    open_block(out, "message role=\"assistant\"");
    open_block(out, thinking ? "think" : "response");
  }
}

// A reply as segments: each special token by its text, each run of ordinary ids as its bytes.
std::vector<ChatSegment> reply_segments(const Tokenizer& tokenizer, std::span<const TokenId> reply) {
  SegmentBuilder out;
  for (const TokenId id : reply) {
    if (tokenizer.is_special(id)) {
      out.special(tokenizer.id_to_bytes(id));
    } else {
      out.text(tokenizer.id_to_bytes(id));
    }
  }
  return out.take();
}

// How many bytes of the plain text `plain` were streamed as the first `shown_bytes` bytes of text: the stream
// decodes the bytes as they come (StreamDecoder: bytes that are not UTF-8 become U+FFFD, 3 bytes for 1 or 2), so
// the two lengths differ wherever the reply has such bytes. Fed a byte at a time as the stream is, the decoder
// says where the cut falls: a replacement and the byte after it may come out together, and then the cut is
// between them.
size_t plain_bytes_streamed(std::string_view plain, size_t shown_bytes) {
  std::string out, pending;
  for (size_t i = 0; i < plain.size() && out.size() < shown_bytes; ++i) {
    pending += plain[i];
    pending.erase(0, decode_utf8_prefix(pending, /*final=*/false, out));
    if (out.size() == shown_bytes) return i + 1 - pending.size();
    if (out.size() > shown_bytes) return i;
  }
  return shown_bytes == 0 ? 0 : plain.size();
}

// Whether segment i is the NAME of a K3 tag: <|open|> or <|close|>, plain text, <|sep|>. The stream does not
// show it (StreamDecoder's hidden tags, the same rule).
bool is_tag_name(const std::vector<ChatSegment>& segments, size_t i) {
  if (i == 0 || i + 1 >= segments.size() || segments[i].special) return false;
  if (segments[i].text.size() > TagMarkup::kMaxNameBytes) return false;
  const ChatSegment &before = segments[i - 1], &after = segments[i + 1];
  return before.special && (before.text == kOpen || before.text == kClose) && after.special && after.text == kSep;
}

// Keeps the segments up to where the stream showed `shown_bytes` bytes of their plain text (the streamed text
// skips the special tokens); a shorter reply is kept whole.
void cut_plain_text(std::vector<ChatSegment>& segments, size_t shown_bytes, bool tags_hidden) {
  const auto shown = [&](size_t i) { return !segments[i].special && !(tags_hidden && is_tag_name(segments, i)); };
  std::string plain;
  for (size_t i = 0; i < segments.size(); ++i) {
    if (shown(i)) plain += segments[i].text;
  }
  const size_t keep = plain_bytes_streamed(plain, shown_bytes);
  size_t seen = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    if (!shown(i)) continue;
    if (seen + segments[i].text.size() >= keep) {
      segments[i].text.resize(keep - seen);
      segments.resize(i + 1);
      return;
    }
    seen += segments[i].text.size();
  }
}

// The K3 assistant body: <|open|>TAG<|sep|> and <|close|>TAG<|sep|> switch channels; text goes to the
// channel it is in. `thinking`: the generation prompt opened the think channel, else the response channel.
void parse_k3_reply(const std::vector<ChatSegment>& segments, bool thinking, std::string& reasoning,
                    std::string& content, bool& think_channel) {
  enum class Channel { kThink, kBetween, kResponse, kDone };
  Channel channel = thinking ? Channel::kThink : Channel::kResponse;
  think_channel = thinking;
  for (size_t i = 0; i < segments.size() && channel != Channel::kDone; ++i) {
    const ChatSegment& s = segments[i];
    if (!s.special) {
      if (channel == Channel::kThink) reasoning += s.text;
      if (channel == Channel::kResponse) content += s.text;
      continue;
    }
    if (!is_tag_name(segments, i + 1)) continue;  // any other special token is not shown, and not kept
    const bool open = s.text == kOpen;
    const std::string& name = segments[i + 1].text;
    i += 2;
    if (open && name == "think") {
      channel = Channel::kThink;
      think_channel = true;
    } else if (open && name == "response") {
      channel = Channel::kResponse;
    } else if (!open && name == "think") {
      channel = Channel::kBetween;
    } else if (!open && (name == "response" || name == "message")) {
      channel = Channel::kDone;
    }
  }
}

}  // namespace

std::string_view chat_family_name(ChatFamily family) {
  return family == ChatFamily::kKimiK3 ? "kimi_k3" : "kimi_linear";
}

std::vector<ChatSegment> ChatTemplate::segments(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                                bool thinking) const {
  for (size_t i = 0; i < messages.size(); ++i) check_message(messages[i], i);
  SegmentBuilder out;
  if (family_ == ChatFamily::kKimiK3) {
    render_k3(out, messages, add_generation_prompt, thinking);
  } else {
    render_kimi_linear(out, messages, add_generation_prompt);
  }
  return out.take();
}

std::string ChatTemplate::render(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                 bool thinking) const {
  std::string text;
  for (const auto& segment : segments(messages, add_generation_prompt, thinking)) text.append(segment.text);
  return text;
}

std::vector<TokenId> ChatTemplate::encode(const Tokenizer& tokenizer, std::span<const ChatMessage> messages,
                                          bool add_generation_prompt, bool thinking) const {
  std::vector<TokenId> ids;
  for (const auto& segment : segments(messages, add_generation_prompt, thinking)) {
    if (segment.special) {
      ids.push_back(tokenizer.special_id(segment.text));
    } else {
      tokenizer.encode_append(segment.text, /*allow_special=*/false, ids);
    }
  }
  return ids;
}

std::vector<std::string> ChatTemplate::end_of_turn_tokens() const {
  if (family_ == ChatFamily::kKimiK3) return {std::string(kEndOfMsg)};
  return {std::string(kImEnd)};
}

bool ChatTemplate::closes_think_channel(const Tokenizer& tokenizer, std::span<const TokenId> reply) const {
  // Asked after every token: most are not a <|sep|>, and need no segments.
  if (family_ != ChatFamily::kKimiK3 || reply.empty() || !tokenizer.is_special(reply.back()) ||
      tokenizer.id_to_bytes(reply.back()) != kSep) {
    return false;
  }
  // The tag's two special tokens and a name of at most kMaxNameBytes tokens.
  const std::vector<ChatSegment> s =
      reply_segments(tokenizer, reply.last(std::min(reply.size(), TagMarkup::kMaxNameBytes + 2)));
  const size_t n = s.size();
  return n >= 3 && is_tag_name(s, n - 2) && s[n - 3].text == kClose && s[n - 2].text == "think";
}

std::optional<TagMarkup> ChatTemplate::tag_markup(const Tokenizer& tokenizer) const {
  if (family_ != ChatFamily::kKimiK3) return std::nullopt;
  return TagMarkup{tokenizer.special_id(kOpen), tokenizer.special_id(kClose), tokenizer.special_id(kSep)};
}

std::vector<TokenId> ChatTemplate::end_of_turn_ids(const Tokenizer& tokenizer) const {
  std::vector<TokenId> ids;
  for (const auto& token : end_of_turn_tokens()) ids.push_back(tokenizer.special_id(token));
  return ids;
}

ChatMessage ChatTemplate::parse_reply(const Tokenizer& tokenizer, std::span<const TokenId> reply, bool thinking,
                                      std::span<const TokenId> stop_ids, std::optional<std::string_view> shown) const {
  const std::vector<TokenId> end_of_turn = end_of_turn_ids(tokenizer);
  auto ends = [&](TokenId id) {
    return std::find(end_of_turn.begin(), end_of_turn.end(), id) != end_of_turn.end() ||
           std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end();
  };
  while (!reply.empty() && ends(reply.back())) reply = reply.first(reply.size() - 1);

  std::vector<ChatSegment> segments = reply_segments(tokenizer, reply);
  if (shown) cut_plain_text(segments, shown->size(), family_ == ChatFamily::kKimiK3);
  std::string reasoning, content;
  bool think_channel = false;
  if (family_ == ChatFamily::kKimiK3) {
    parse_k3_reply(segments, thinking, reasoning, content, think_channel);
  } else {
    for (const ChatSegment& s : segments) {
      if (s.special && s.text == kImEnd) break;
      if (!s.special) content += s.text;
    }
  }
  ChatMessage message{"assistant", "", "", "", think_channel};
  text::decode_utf8_prefix(content, /*final=*/true, message.content);
  text::decode_utf8_prefix(reasoning, /*final=*/true, message.reasoning);
  return message;
}

}  // namespace kimirt::text
