// The Kimi split pattern's exact meaning on the cases where a rewrite could go wrong: the Han class
// intersection, Script vs Script_Extensions, the case-insensitive contractions, `\s` as Unicode
// White_Space, `\s+(?!\S)`. Expected pieces were checked against the original pattern (with `&&`) in a
// regex engine that supports class intersection. Also: the ASCII fast path agrees with PCRE2 everywhere.
#include "kimirt/text/pretokenizer.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "kimirt/base/error.h"

namespace kimirt::text {
namespace {

std::vector<std::string> split(const Pretokenizer& p, std::string_view text) {
  std::vector<PieceSpan> spans;
  p.split(text, spans);
  std::vector<std::string> out;
  for (const auto& s : spans) out.emplace_back(text.substr(s.begin, s.end - s.begin));
  return out;
}

struct SplitCase {
  const char* text;
  std::vector<std::string> pieces;
};

const std::vector<SplitCase> kCases = {
    {"abc中文def", {"abc", "中文", "def"}},              // Han is cut out of letter runs
    {"a々b", {"a", "々", "b"}},                          // U+3005 is Lm but Han: not a letter here
    {"数学是科学的语言。", {"数学是科学的语言", "。"}},  // 。 is Han only by Script_Extensions
    {"東京は日本", {"東京", "は", "日本"}},
    {"ǅemo ǅEMO", {"ǅemo", " ǅEMO"}},  // Lt in the upper class
    {"HE'S", {"HE'S"}},
    {"don'T'S", {"don'T", "'S"}},
    {"x'\xC5\xBF", {"x'\xC5\xBF"}},  // 'ſ: long s case-folds to s
    {"it's'll", {"it's", "'ll"}},
    {"'re", {"'re"}},
    {"a   b", {"a", "  ", " b"}},  // \s+(?!\S) leaves one space to the word
    {"a   ", {"a", "   "}},        // ... unless the text ends
    {"a\xE1\xA0\x8E"
     "b",
     {"a",
      "\xE1\xA0\x8E"
      "b"}},                                   // U+180E is not white space
    {"a\xC2\x85 b", {"a", "\xC2\x85", " b"}},  // U+0085 is
    {"a\xC2\xA0\xC2\xA0"
     "b",
     {"a", "\xC2\xA0",
      "\xC2\xA0"
      "b"}},  // U+00A0 leads a word like a space
    {"12345", {"123", "45"}},
    {"١٢٣٤", {"١٢٣", "٤"}},
    {"Ⅻ12", {"Ⅻ12"}},  // Nl counts as a number
    {"a \n\n b", {"a", " \n\n", " b"}},
    {"!!\n\nx", {"!!\n\n", "x"}},
    {"  \t mixed whitespace   \r\n", {"  \t", " mixed", " whitespace", "   \r\n"}},
    {"(self", {"(self"}},
    {"\xE3\x80\x80"
     "a",
     {"\xE3\x80\x80"
      "a"}},                         // U+3000 ideographic space leads a word
    {"e\xCC\x81x", {"e\xCC\x81x"}},  // combining mark inside a word
};

TEST(Pretokenizer, KimiPatternMeaning) {
  const Pretokenizer pcre2_only(/*ascii_fast_path=*/false);
  const Pretokenizer fast(/*ascii_fast_path=*/true);
  for (const auto& c : kCases) {
    EXPECT_EQ(split(pcre2_only, c.text), c.pieces) << c.text;
    EXPECT_EQ(split(fast, c.text), c.pieces) << c.text;
  }
}

TEST(Pretokenizer, EmptyTextHasNoPieces) {
  const Pretokenizer p;
  EXPECT_TRUE(split(p, "").empty());
}

TEST(Pretokenizer, AsciiFastPathAgreesWithPcre2) {
  // Mostly ASCII (where the fast path decides) with non-ASCII neighbours that force it to hand over.
  const std::vector<std::string> alphabet = {"a",
                                             "A",
                                             "b",
                                             "Z",
                                             "s",
                                             "S",
                                             "t",
                                             "T",
                                             "r",
                                             "e",
                                             "E",
                                             "v",
                                             "m",
                                             "l",
                                             "L",
                                             "d",
                                             "D",
                                             "'",
                                             " ",
                                             " ",
                                             "\t",
                                             "\n",
                                             "\r",
                                             "0",
                                             "7",
                                             "9",
                                             "!",
                                             "?",
                                             ".",
                                             ",",
                                             "-",
                                             "(",
                                             "<",
                                             "|",
                                             "\\",
                                             "\"",
                                             "\x01",
                                             "\x1f",
                                             "\x7f",
                                             "\xC3\xA9",
                                             "\xC5\xBF",
                                             "\xC2\xA0",
                                             "\xE3\x80\x80",
                                             "\xE4\xB8\xAD",
                                             "\xE3\x80\x82",
                                             "\xE2\x85\xAB",
                                             "\xCC\x81",
                                             "\xF0\x9F\x98\x80",
                                             "\xC7\x85",
                                             "\xE1\xA0\x8E",
                                             "\xC2\x85",
                                             "\xEF\xBD\xB6"};
  const Pretokenizer pcre2_only(false);
  const Pretokenizer fast(true);
  std::mt19937 rng(11);
  for (int trial = 0; trial < 5000; ++trial) {
    std::string text;
    const int n = 1 + static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) {
      const size_t k = rng() % 10 == 0 ? rng() % alphabet.size() : rng() % 39;
      text += alphabet[k];
    }
    ASSERT_EQ(split(fast, text), split(pcre2_only, text)) << text;
  }
}

TEST(Pretokenizer, LongRunsFallBackToTheInterpreterThenFailCleanly) {
  // A word of 200,000 Hangul syllables backtracks one frame per character. With no JIT stack of our own
  // (PCRE2's 32 KiB default) the JIT gives up and the interpreter must finish the match; with its heap
  // capped at 1 MiB as well, the text is refused with an error instead.
  std::string word;
  for (int i = 0; i < 200000; ++i) word += "\xEA\xB0\x80";
  const Pretokenizer fallback(false, PretokenizerLimits{0, size_t{1} << 30});
  const auto pieces = split(fallback, word + " " + word);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].size(), word.size());
  EXPECT_EQ(pieces[1].size(), word.size() + 1);

  const Pretokenizer capped(false, PretokenizerLimits{0, size_t{1} << 20});
  try {
    split(capped, word);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot split the text at byte 0 into pieces"), std::string::npos) << e.what();
  }
  // The default limits take a 4 MB word on the JIT alone.
  const Pretokenizer p(false);
  EXPECT_EQ(split(p, std::string(4 << 20, 'x')).size(), 1u);
}

}  // namespace
}  // namespace kimirt::text
