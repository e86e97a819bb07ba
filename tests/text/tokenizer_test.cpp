// Tokenizer behaviour beyond the golden ids: special tokens only when allowed, errors for bad input,
// decode options, and concurrent use.
#include "kimirt/text/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "kimirt/base/error.h"

namespace kimirt::text {
namespace {

using ::testing::HasSubstr;

const Tokenizer& tokenizer() {
  static const Tokenizer t = Tokenizer::load(std::string(KIMIRT_TESTDATA_DIR) + "/tokenizer");
  return t;
}

TEST(Tokenizer, SpecialTextIsOneIdOnlyWhenAllowed) {
  const Tokenizer& t = tokenizer();
  const TokenId open = t.special_id("<|open|>");
  const auto allowed = t.encode("a<|open|>b", true);
  EXPECT_EQ(std::count(allowed.begin(), allowed.end(), open), 1);
  const auto plain = t.encode("a<|open|>b", false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), open), 0);
  EXPECT_EQ(t.decode(plain), "a<|open|>b");
  // Text that only resembles a special token stays text.
  const auto near = t.encode("<|open|<|open>", true);
  EXPECT_EQ(std::count(near.begin(), near.end(), open), 0);
}

TEST(Tokenizer, SpecialTokensSplitTheTextLikeTiktoken) {
  // The text on each side of a special token is encoded on its own: "hi  " before a special token ends
  // there, so its trailing spaces form one piece (\s+(?!\S) sees the end of the stretch).
  const Tokenizer& t = tokenizer();
  std::vector<TokenId> expected = t.encode("hi  ", false);
  expected.push_back(t.special_id("[EOS]"));
  const auto tail = t.encode("  x", false);
  expected.insert(expected.end(), tail.begin(), tail.end());
  EXPECT_EQ(t.encode("hi  [EOS]  x", true), expected);
}

TEST(Tokenizer, InvalidUtf8IsAnErrorWithTheOffset) {
  try {
    tokenizer().encode(
        "abc\xFF"
        "def");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("not valid UTF-8 (byte 3 of 7)"));
  }
  EXPECT_THROW(tokenizer().encode("truncated \xE4\xB8"), Error);
}

TEST(Tokenizer, DecodeOptionsAndBadIds) {
  const Tokenizer& t = tokenizer();
  const std::vector<TokenId> ids = {t.special_id("[BOS]"), t.encode("hi")[0], t.special_id("[EOS]")};
  EXPECT_EQ(t.decode(ids, /*skip_special=*/true), t.id_to_bytes(ids[1]));
  EXPECT_EQ(t.decode(ids).substr(0, 5), "[BOS]");
  try {
    t.decode(std::vector<TokenId>{1, t.vocab_size()});
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("token id 1456 is outside the vocabulary"));
  }
  EXPECT_THROW(t.id_to_bytes(-5), Error);
  EXPECT_THROW(t.special_id("<|nope|>"), Error);
}

TEST(Tokenizer, ConcurrentEncodesAgree) {
  const std::string text =
      "Kimi reads long documents 长文本 and answers questions about them. It's 2026-11-29!\n\n  def f(x): return x";
  const auto expected = tokenizer().encode(text, true);
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      const Tokenizer copy = tokenizer();  // copies share the loaded state
      for (int i = 0; i < 200; ++i) mismatches[k] += copy.encode(text, true) != expected;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches, (std::vector<int>{0, 0, 0, 0}));
}

TEST(Tokenizer, TwoTokenizersDoNotShareCachedPieces) {
  // The per-thread piece cache is keyed by tokenizer: a second vocabulary must not see the first's ids.
  const Tokenizer& a = tokenizer();
  const Tokenizer b = Tokenizer::from_contents("YQ== 0\nYg== 1\nYWI= 2\n", R"({"added_tokens_decoder": {}})", "tiny");
  const auto ids_a = a.encode("abababab");
  EXPECT_EQ(b.encode("abababab"), (std::vector<TokenId>{2, 2, 2, 2}));
  EXPECT_EQ(a.encode("abababab"), ids_a);
}

}  // namespace
}  // namespace kimirt::text
