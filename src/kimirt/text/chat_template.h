// Chat templates of the two Kimi families, written from their documented formats (spec §6, §7) rather
// than by interpreting a Jinja file:
//
//   Kimi Linear (K2-style):  <|im_system|>system<|im_middle|>…<|im_end|><|im_user|>user<|im_middle|>…<|im_end|>
//                            <|im_assistant|>assistant<|im_middle|>…<|im_end|>
//   Kimi K3 (XTML):          <|open|>message role="user"<|sep|>…<|close|>message<|sep|><|end_of_msg|>
//                            assistant bodies in channels: <|open|>think<|sep|>…<|close|>think<|sep|>
//                            <|open|>response<|sep|>…<|close|>response<|sep|>
//
// Every choice the spec leaves open (BOS, default system prompt, history reasoning, attribute escaping)
// is made once, in chat_template.cpp's "Policy" block.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kimirt/text/stream_decoder.h"
#include "kimirt/text/token.h"
#include "kimirt/text/tokenizer.h"

namespace kimirt::text {

enum class ChatFamily { kKimiLinear, kKimiK3 };

std::string_view chat_family_name(ChatFamily family);  // "kimi_linear", "kimi_k3"

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool", ...: letters, digits, '_', '-', '.'
  std::string content;
  std::string reasoning;  // assistant only: the K3 think channel (Kimi Linear has none; ignored there)
  std::string name;       // optional label shown instead of the role (Kimi Linear, as K2's template)
  // Assistant, K3: the turn had a think channel even if it is empty (the model closed it at once), so that
  // the history renders it as the model saw it. Set by parse_reply.
  bool think_channel = false;
};

// One piece of rendered output: a template special token (by its text), or plain text.
struct ChatSegment {
  bool special;
  std::string text;
};

class ChatTemplate {
 public:
  explicit ChatTemplate(ChatFamily family) : family_(family) {}

  ChatFamily family() const { return family_; }

  // The prompt as text. Message fields are copied verbatim: tokenizing this text with allow_special
  // would turn special-token text inside a message into control tokens; encode() does not.
  std::string render(std::span<const ChatMessage> messages, bool add_generation_prompt, bool thinking) const;

  // The prompt as ids: template tokens by name from the tokenizer (an error names any it lacks), message
  // text encoded as plain text. Equal to tokenizer.encode(render(...), true) when no message contains
  // special-token text.
  std::vector<TokenId> encode(const Tokenizer& tokenizer, std::span<const ChatMessage> messages,
                              bool add_generation_prompt, bool thinking) const;

  std::vector<ChatSegment> segments(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                    bool thinking) const;

  // Special tokens that end an assistant turn (the engine stops on these ids).
  std::vector<std::string> end_of_turn_tokens() const;
  std::vector<TokenId> end_of_turn_ids(const Tokenizer& tokenizer) const;
  // The markup whose tag names a reply's shown text leaves out (StreamDecoder's hidden_tags): K3's channel
  // and message tags; none for Kimi Linear, whose replies are plain text.
  std::optional<TagMarkup> tag_markup(const Tokenizer& tokenizer) const;
  // Whether the reply so far ends with the tag that closes the think channel (K3's <|close|>think<|sep|>):
  // where the reasoning ends and the answer starts.
  bool closes_think_channel(const Tokenizer& tokenizer, std::span<const TokenId> reply) const;

  // The history message of an assistant turn the model generated after this template's generation prompt
  // (`thinking` as the prompt was encoded), from the ids it sampled: the ids that ended it (`stop_ids`, and
  // this family's end-of-turn tokens) are dropped from the end; K3's channel markup is taken apart (the think
  // channel is the reasoning, the response channel up to <|close|>response the content, nothing after the
  // turn's close is kept); other special tokens are dropped, as the streamed text drops them; bytes that are
  // not UTF-8 become U+FFFD. So the next turn's encode() gives the prompt's ids followed by the reply's for a
  // reply the tokenizer would encode the same way, and never special-token text as plain text.
  // `shown`: the reply's streamed text (its plain text, special tokens and tag_markup's tag names skipped) when
  // a stop string ended it: the message then keeps the reply only up to where the stop string starts, since the
  // tokens that completed the stop string may carry text the user never saw.
  ChatMessage parse_reply(const Tokenizer& tokenizer, std::span<const TokenId> reply, bool thinking,
                          std::span<const TokenId> stop_ids = {},
                          std::optional<std::string_view> shown = std::nullopt) const;

 private:
  ChatFamily family_;
};

}  // namespace kimirt::text
