// Streaming detokenization: only whole UTF-8 characters come out, whatever the cut between ids.
#include "kimirt/text/stream_decoder.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kimirt/base/error.h"
#include "kimirt/text/utf8.h"

namespace kimirt::text {
namespace {

const std::string kDir = std::string(KIMIRT_TESTDATA_DIR) + "/tokenizer";

const Tokenizer& tokenizer() {
  static const Tokenizer t = Tokenizer::load(kDir);
  return t;
}

// The id of a single byte (the test vocabulary, like every byte-level one, has all 256).
TokenId byte_id(unsigned char b) {
  for (TokenId id = 0; id < tokenizer().num_ranks(); ++id) {
    const auto bytes = tokenizer().id_to_bytes(id);
    if (bytes.size() == 1 && static_cast<unsigned char>(bytes[0]) == b) return id;
  }
  ADD_FAILURE() << "no id for byte " << int(b);
  return 0;
}

std::vector<TokenId> byte_ids(std::string_view s) {
  std::vector<TokenId> ids;
  for (const char c : s) ids.push_back(byte_id(static_cast<unsigned char>(c)));
  return ids;
}

TEST(Utf8, ClassifiesSequences) {
  EXPECT_EQ(find_invalid_utf8("plain ascii text, long enough for the word loop"), 47u);
  EXPECT_EQ(find_invalid_utf8("中文😀é"), std::string_view("中文😀é").size());
  EXPECT_EQ(find_invalid_utf8("ab\xC0\xAF"), 2u);          // overlong
  EXPECT_EQ(find_invalid_utf8("ab\xED\xA0\x80"), 2u);      // surrogate
  EXPECT_EQ(find_invalid_utf8("ab\xF4\x90\x80\x80"), 2u);  // above U+10FFFF
  EXPECT_EQ(find_invalid_utf8("ab\xE4\xB8"), 2u);          // truncated at the end
  EXPECT_EQ(find_invalid_utf8("\x80"), 0u);
}

TEST(Utf8, ReplacesMaximalSubpartsLikePython) {
  // bytes.decode("utf-8", "replace") gives one U+FFFD per maximal subpart: E4 B8 | 41 | 80 | F0 9F 98.
  std::string out;
  const size_t used = decode_utf8_prefix(
      "\xE4\xB8"
      "A\x80\xF0\x9F\x98",
      /*final=*/true, out);
  EXPECT_EQ(used, 7u);
  EXPECT_EQ(out,
            "\xEF\xBF\xBD"
            "A\xEF\xBF\xBD\xEF\xBF\xBD");
  out.clear();
  EXPECT_EQ(decode_utf8_prefix("ok\xF0\x9F\x98", /*final=*/false, out), 2u);  // the emoji may still complete
  EXPECT_EQ(out, "ok");
}

TEST(StreamDecoder, EmojiSplitAcrossIds) {
  StreamDecoder decoder(tokenizer());
  const auto ids = byte_ids("😀!");  // F0 9F 98 80 21
  EXPECT_EQ(decoder.push(ids[0]), "");
  EXPECT_EQ(decoder.push(ids[1]), "");
  EXPECT_EQ(decoder.push(ids[2]), "");
  EXPECT_TRUE(decoder.has_pending());
  EXPECT_EQ(decoder.push(ids[3]), "😀");
  EXPECT_EQ(decoder.push(ids[4]), "!");
  EXPECT_EQ(decoder.finish(), "");
}

TEST(StreamDecoder, CjkSplitAcrossIds) {
  // "中" = E4 B8 AD and "文" = E6 96 87, delivered byte by byte: E4 | B8 | AD | E6 | 96 | 87.
  StreamDecoder decoder(tokenizer());
  EXPECT_EQ(decoder.push(byte_id(0xE4)), "");
  std::string got;
  for (const TokenId id : byte_ids("\xB8\xAD\xE6")) got += decoder.push(id);
  EXPECT_EQ(got, "中");
  EXPECT_EQ(decoder.push(byte_id(0x96)), "");
  EXPECT_EQ(decoder.push(byte_id(0x87)), "文");
}

TEST(StreamDecoder, GoldenTextsStreamBackExactly) {
  std::ifstream in(kDir + "/cases.jsonl");
  std::string line;
  int split_characters = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    const std::string text = j.at("text");
    StreamDecoder decoder(tokenizer());
    std::string streamed;
    for (const TokenId id : j.at("ids_special").get<std::vector<TokenId>>()) {
      const std::string chunk = decoder.push(id);
      EXPECT_EQ(find_invalid_utf8(chunk), chunk.size());
      streamed += chunk;
      split_characters += decoder.has_pending();
    }
    streamed += decoder.finish();
    EXPECT_EQ(streamed, text);
  }
  EXPECT_GT(split_characters, 0);  // the cases do cut characters between ids, so this test means something
}

TEST(StreamDecoder, BrokenBytesBecomeReplacementCharacters) {
  StreamDecoder decoder(tokenizer());
  EXPECT_EQ(decoder.push(byte_id(0xE4)), "");
  EXPECT_EQ(decoder.push(byte_id('a')),
            "\xEF\xBF\xBD"
            "a");                                          // E4 can no longer complete
  EXPECT_EQ(decoder.push(byte_id(0xFF)), "\xEF\xBF\xBD");  // never valid
  EXPECT_EQ(decoder.push(byte_id(0xF0)), "");
  EXPECT_EQ(decoder.finish(), "\xEF\xBF\xBD");  // stream ended inside a character
  EXPECT_FALSE(decoder.has_pending());
}

TEST(StreamDecoder, SpecialTokensAndBadIds) {
  StreamDecoder keep(tokenizer());
  EXPECT_EQ(keep.push(tokenizer().special_id("<|end_of_msg|>")), "<|end_of_msg|>");
  StreamDecoder skip(tokenizer(), /*skip_special=*/true);
  EXPECT_EQ(skip.push(tokenizer().special_id("<|end_of_msg|>")), "");
  EXPECT_THROW(skip.push(tokenizer().vocab_size()), Error);
  EXPECT_THROW(skip.push(-1), Error);
}

// K3's tags are markup: with hidden tags their names produce no text. A NAME no sep closes was text after all:
// shown when another special token or the end of the stream comes first.
TEST(StreamDecoder, HiddenTagNames) {
  const Tokenizer& t = tokenizer();
  const TagMarkup tags{t.special_id("<|open|>"), t.special_id("<|close|>"), t.special_id("<|sep|>")};
  std::vector<TokenId> ids;
  const auto special = [&](const char* s) { ids.push_back(t.special_id(s)); };
  const auto text = [&](const char* s) { t.encode_append(s, false, ids); };
  text("Hmm."), special("<|close|>"), text("think"), special("<|sep|>");
  special("<|open|>"), text("response"), special("<|sep|>"), text("Yes, ");
  special("<|open|>"), text("not a tag"), special("<|end_of_msg|>"), text(" and ");
  special("<|close|>"), text("open at the end");
  const auto stream = [&](StreamDecoder d) {
    std::string out;
    for (const TokenId id : ids) d.push(id, out);
    return out + d.finish();
  };
  EXPECT_EQ(stream(StreamDecoder(t, true, tags)), "Hmm.Yes, not a tag and open at the end");
  EXPECT_EQ(stream(StreamDecoder(t, true)), "Hmm.thinkresponseYes, not a tag and open at the end");
  EXPECT_THROW(StreamDecoder(t, false, tags), Error);
  // A NAME past kMaxNameBytes is free text, shown as it comes rather than held to the end of the reply.
  StreamDecoder d(t, true, tags);
  EXPECT_EQ(d.push(tags.open), "");
  std::string out;
  for (const TokenId id : t.encode("a tag never names itself with this many words")) d.push(id, out);
  EXPECT_EQ(out, "a tag never names itself with this many words");
}

}  // namespace
}  // namespace kimirt::text
