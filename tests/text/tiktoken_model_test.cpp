// Loading tiktoken.model and tokenizer_config.json: what is accepted, and that every kind of bad input is
// a kimirt::Error naming the file and the line or field.
#include "kimirt/text/tiktoken_model.h"
#include "common/error_of.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "kimirt/base/error.h"
#include "kimirt/text/base64.h"
#include "kimirt/text/tokenizer.h"

namespace kimirt::text {
namespace {

using ::testing::HasSubstr;

// Single bytes a..d as ranks 0..3, then "ab" 4 and "abc" 5.
constexpr const char* kSmallModel = "YQ== 0\nYg== 1\nYw== 2\nZA== 3\nYWI= 4\nYWJj 5\n";

using ::kimirt::test::error_of;

TEST(Base64, DecodesCanonicalPaddedInput) {
  std::string out;
  ASSERT_TRUE(base64_decode("IGhlbGxv", out));
  EXPECT_EQ(out, " hello");
  ASSERT_TRUE(base64_decode("YQ==", out));
  EXPECT_EQ(out, "a");
  ASSERT_TRUE(base64_decode("YWI=", out));
  EXPECT_EQ(out, "ab");
  ASSERT_TRUE(base64_decode("/w==", out));
  EXPECT_EQ(out, "\xFF");
}

TEST(Base64, RejectsNonCanonicalInput) {
  std::string out;
  EXPECT_FALSE(base64_decode("YQ=", out));       // length not a multiple of 4
  EXPECT_FALSE(base64_decode("Y*==", out));      // not in the alphabet
  EXPECT_FALSE(base64_decode("YR==", out));      // padding bits not zero
  EXPECT_FALSE(base64_decode("Y===", out));      // too much padding
  EXPECT_FALSE(base64_decode("YQ==YQ==", out));  // padding in the middle
}

TEST(TiktokenModel, ParsesRanksAndLooksUpBothWays) {
  const BpeVocab vocab = parse_tiktoken_model(kSmallModel, "small.model");
  ASSERT_EQ(vocab.size(), 6);
  EXPECT_EQ(vocab.bytes(5), "abc");
  EXPECT_EQ(vocab.rank_of("ab"), 4);
  EXPECT_EQ(vocab.rank_of("abc"), 5);
  EXPECT_EQ(vocab.rank_of("bc"), BpeVocab::kNoRank);
  EXPECT_EQ(vocab.byte_rank('c'), 2);
  EXPECT_EQ(vocab.byte_rank('z'), BpeVocab::kNoRank);
}

TEST(TiktokenModel, AcceptsCrlfBlankLinesAndAnyRankOrder) {
  const BpeVocab vocab = parse_tiktoken_model("YWI= 2\r\n\r\nYQ==\t0\nYg==  1", "x.model");
  ASSERT_EQ(vocab.size(), 3);
  EXPECT_EQ(vocab.bytes(2), "ab");
  EXPECT_EQ(vocab.bytes(0), "a");
}

TEST(TiktokenModel, BadLinesNameFileAndLine) {
  EXPECT_THAT(error_of([] { parse_tiktoken_model("YQ== 0\nYg==\n", "m.model"); }),
              HasSubstr("m.model:2: expected \"<base64 token> <rank>\""));
  EXPECT_THAT(error_of([] { parse_tiktoken_model("YQ== 0\nYg== 1 7\n", "m.model"); }), HasSubstr("m.model:2:"));
  EXPECT_THAT(error_of([] { parse_tiktoken_model("YQ== 0\nY!== 1\n", "m.model"); }),
              HasSubstr("m.model:2: \"Y!==\" is not valid base64"));
  EXPECT_THAT(error_of([] { parse_tiktoken_model("YQ== 0\nYg== -1\n", "m.model"); }),
              HasSubstr("m.model:2: rank \"-1\" is not a non-negative integer"));
  EXPECT_THAT(error_of([] { parse_tiktoken_model("YQ== 0\nYg== 1x\n", "m.model"); }),
              HasSubstr("m.model:2: rank \"1x\""));
}

TEST(TiktokenModel, DuplicateAndMissingRanksAreErrors) {
  EXPECT_THAT(error_of([] { parse_tiktoken_model("YQ== 0\nYg== 1\nYw== 1\n", "m.model"); }),
              HasSubstr("m.model:3: rank 1 appears twice (first at line 2)"));
  EXPECT_THAT(error_of([] { parse_tiktoken_model("YQ== 0\nYg== 5\n", "m.model"); }),
              HasSubstr("m.model:2: rank 5 is out of range: the 2 tokens must have ranks 0..1"));
  EXPECT_THAT(error_of([] { parse_tiktoken_model("YQ== 0\nYQ== 1\n", "m.model"); }),
              HasSubstr("m.model: ranks 0 and 1 have the same bytes"));
  EXPECT_THAT(error_of([] { parse_tiktoken_model("\n\n", "m.model"); }), HasSubstr("m.model: the file has no tokens"));
}

class TokenizerFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("kimirt_text_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }

  std::filesystem::path dir_;
};

TEST_F(TokenizerFiles, MissingFilesAreNamed) {
  EXPECT_THAT(error_of([&] { Tokenizer::load(dir_); }), HasSubstr("cannot open " + (dir_ / "tiktoken.model").string()));
  write("tiktoken.model", kSmallModel);
  EXPECT_THAT(error_of([&] { Tokenizer::load(dir_); }),
              HasSubstr("cannot open " + (dir_ / "tokenizer_config.json").string()));
}

TEST_F(TokenizerFiles, ABadModelLineNamesTheFileAndLine) {
  write("tiktoken.model", "YQ== 0\nnot base64! 1\n");
  write("tokenizer_config.json", R"({"added_tokens_decoder": {}})");
  EXPECT_THAT(error_of([&] { Tokenizer::load(dir_); }), HasSubstr((dir_ / "tiktoken.model").string() + ":2:"));
}

TEST_F(TokenizerFiles, ConfigErrorsNameTheField) {
  write("tiktoken.model", kSmallModel);
  const auto config_error = [&](const std::string& json) {
    write("tokenizer_config.json", json);
    return error_of([&] { Tokenizer::load(dir_); });
  };
  EXPECT_THAT(config_error("{"), HasSubstr("tokenizer_config.json: not valid JSON"));
  EXPECT_THAT(config_error("{}"), HasSubstr("field \"added_tokens_decoder\" is missing"));
  EXPECT_THAT(config_error(R"({"added_tokens_decoder": {"x": {"content": "[BOS]"}}})"),
              HasSubstr("added_tokens_decoder key \"x\" is not a token id"));
  EXPECT_THAT(config_error(R"({"added_tokens_decoder": {"6": {"special": true}}})"),
              HasSubstr("added_tokens_decoder[\"6\"] has no string \"content\""));
  EXPECT_THAT(config_error(R"({"added_tokens_decoder": {"3": {"content": "[BOS]"}}})"),
              HasSubstr("added token 3 \"[BOS]\" is outside the special ids 6..261"));
  EXPECT_THAT(config_error(R"({"added_tokens_decoder": {"6": {"content": "[A]"}, "06": {"content": "[B]"}}})"),
              HasSubstr("added_tokens_decoder gives id 6 twice"));
  EXPECT_THAT(config_error(R"({"added_tokens_decoder": {"6": {"content": "[X]"}, "7": {"content": "[X]"}}})"),
              HasSubstr("special token \"[X]\" is given to both id 6 and id 7"));
  EXPECT_THAT(config_error(R"({"added_tokens_decoder": {"6": {"content": "[BOS]"}}, "eos_token": "[EOS]"})"),
              HasSubstr("field \"eos_token\" names \"[EOS]\", which is not one of its special tokens"));
}

TEST_F(TokenizerFiles, UnnamedSpecialIdsAreReservedTokensAndRolesMayBeObjects) {
  write("tiktoken.model", kSmallModel);
  write("tokenizer_config.json", R"({"added_tokens_decoder": {"6": {"content": "[BOS]"}, "8": {"content": "[EOS]"}},
      "bos_token": {"__type": "AddedToken", "content": "[BOS]"}, "eos_token": "[EOS]", "chat_template": "{{x}}"})");
  const Tokenizer t = Tokenizer::load(dir_);
  EXPECT_EQ(t.vocab_size(), 6 + 256);
  EXPECT_EQ(t.bos_id(), 6);
  EXPECT_EQ(t.eos_id(), 8);
  EXPECT_FALSE(t.pad_id().has_value());
  EXPECT_EQ(t.id_to_bytes(7), "<|reserved_token_7|>");
  EXPECT_EQ(t.special_id("<|reserved_token_261|>"), 261);
  EXPECT_TRUE(t.has_config_chat_template());
  EXPECT_EQ(t.encode("abcab<|reserved_token_7|>", true), (std::vector<TokenId>{5, 4, 7}));
}

}  // namespace
}  // namespace kimirt::text
