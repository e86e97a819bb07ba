// The 341 golden cases of testdata/tokenizer/cases.jsonl, produced by tiktoken 0.14 with the Kimi pattern:
// every text must give exactly tiktoken's ids, with special strings as plain text (`ids`) and as single
// ids (`ids_special`), and decoding either must give the text back byte for byte.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kimirt/text/tokenizer.h"

namespace kimirt::text {
namespace {

const std::string kDir = std::string(KIMIRT_TESTDATA_DIR) + "/tokenizer";

struct GoldenCase {
  std::string text;
  std::vector<TokenId> ids;
  std::vector<TokenId> ids_special;
};

std::vector<GoldenCase> load_cases() {
  std::ifstream in(kDir + "/cases.jsonl");
  std::vector<GoldenCase> cases;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line);
    cases.push_back({j.at("text").get<std::string>(), j.at("ids").get<std::vector<TokenId>>(),
                     j.at("ids_special").get<std::vector<TokenId>>()});
  }
  return cases;
}

const Tokenizer& tokenizer() {
  static const Tokenizer t = Tokenizer::load(kDir);
  return t;
}

TEST(TokenizerGolden, AllCasesMatchTiktoken) {
  const auto cases = load_cases();
  ASSERT_EQ(cases.size(), 341u);
  int failures = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    const auto ids = tokenizer().encode(c.text, /*allow_special=*/false);
    const auto ids_special = tokenizer().encode(c.text, /*allow_special=*/true);
    EXPECT_EQ(ids, c.ids) << "case " << i << " (plain): " << c.text;
    EXPECT_EQ(ids_special, c.ids_special) << "case " << i << " (special): " << c.text;
    failures += (ids != c.ids) + (ids_special != c.ids_special);
    if (failures > 10) break;
  }
  EXPECT_EQ(failures, 0);
}

TEST(TokenizerGolden, DecodeRoundTrips) {
  for (const auto& c : load_cases()) {
    EXPECT_EQ(tokenizer().decode(c.ids), c.text);
    EXPECT_EQ(tokenizer().decode(c.ids_special), c.text);
  }
}

TEST(TokenizerGolden, SpecialTokensComeFromTheConfig) {
  const Tokenizer& t = tokenizer();
  EXPECT_EQ(t.num_ranks(), 1200);
  EXPECT_EQ(t.vocab_size(), 1456);
  EXPECT_EQ(t.bos_id(), 1200);
  EXPECT_EQ(t.eos_id(), 1201);
  EXPECT_EQ(t.unk_id(), 1454);
  EXPECT_EQ(t.pad_id(), 1455);
  EXPECT_EQ(t.special_id("<|end_of_msg|>"), 1202);
  EXPECT_EQ(t.special_id("<|open|>"), 1203);
  EXPECT_EQ(t.special_id("<|close|>"), 1204);
  EXPECT_EQ(t.special_id("<|sep|>"), 1205);
  EXPECT_FALSE(t.find_special("<|im_end|>").has_value());
  EXPECT_TRUE(t.is_special(1203));
  EXPECT_FALSE(t.is_special(1199));
  EXPECT_EQ(t.id_to_bytes(1203), "<|open|>");
}

}  // namespace
}  // namespace kimirt::text
