// The strict JSON layer: UTF-8 validation by the RFC 3629 table, duplicate keys at every level, the depth
// bound, NUL bytes, and the sign class of integers that the safetensors checks rely on.
#include "kimirt/base/strict_json.h"

#include <gtest/gtest.h>

#include "kimirt/base/error.h"

namespace kimirt {
namespace {

using Kind = JsonProblem::Kind;

TEST(StrictJson, Utf8Validation) {
  EXPECT_FALSE(find_invalid_utf8("").has_value());
  EXPECT_FALSE(find_invalid_utf8("plain ascii").has_value());
  EXPECT_FALSE(
      find_invalid_utf8("\xC2\x80 \xDF\xBF \xE0\xA0\x80 \xED\x9F\xBF \xEE\x80\x80 \xF0\x90\x80\x80 \xF4\x8F\xBF\xBF")
          .has_value());
  EXPECT_EQ(find_invalid_utf8("ab\x80"), 2u);            // lone continuation byte
  EXPECT_EQ(find_invalid_utf8("\xC0\xAF"), 0u);          // overlong '/'
  EXPECT_EQ(find_invalid_utf8("\xC1\xBF"), 0u);          // overlong
  EXPECT_EQ(find_invalid_utf8("\xE0\x9F\xBF"), 0u);      // overlong 3-byte
  EXPECT_EQ(find_invalid_utf8("x\xED\xA0\x80"), 1u);     // UTF-16 surrogate U+D800
  EXPECT_EQ(find_invalid_utf8("\xF0\x8F\xBF\xBF"), 0u);  // overlong 4-byte
  EXPECT_EQ(find_invalid_utf8("\xF4\x90\x80\x80"), 0u);  // U+110000
  EXPECT_EQ(find_invalid_utf8("\xF5\x80\x80\x80"), 0u);  // lead byte past F4
  EXPECT_EQ(find_invalid_utf8("ok\xE2\x82"), 2u);        // truncated at the end
  EXPECT_EQ(find_invalid_utf8("\xE2\x28\xA1"), 0u);      // bad continuation
  EXPECT_EQ(find_invalid_utf8("\xFF"), 0u);
}

TEST(StrictJson, RejectsDuplicateKeysAtEveryLevel) {
  JsonProblem problem;
  EXPECT_FALSE(parse_json_strict(R"({"a":1,"a":1})", problem));
  EXPECT_EQ(problem.kind, Kind::kDuplicateKey);
  EXPECT_EQ(problem.message, "duplicate key \"a\"");
  EXPECT_FALSE(parse_json_strict(R"({"x":[{"k":1},{"k":2,"k":3}]})", problem));
  EXPECT_EQ(problem.kind, Kind::kDuplicateKey);
  EXPECT_EQ(problem.message, "duplicate key \"k\" in \"x\" > [1]");
  EXPECT_FALSE(parse_json_strict(R"({"a":{"b":{"c":0,"c":0}}})", problem));
  EXPECT_EQ(problem.message, "duplicate key \"c\" in \"a\" > \"b\"");
  // The same key in sibling objects is fine.
  auto ok = parse_json_strict(R"({"a":{"k":1},"b":{"k":2},"c":[{"k":3},{"k":4}]})", problem);
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ((*ok)["c"][1]["k"], 4);
}

TEST(StrictJson, KeepsIntegerSignClass) {
  JsonProblem problem;
  auto v = parse_json_strict(R"([0, 7, -0, -3, 1.0, 1e2, 18446744073709551615, 18446744073709551616])", problem);
  ASSERT_TRUE(v.has_value()) << problem.message;
  EXPECT_TRUE((*v)[0].is_number_unsigned());
  EXPECT_TRUE((*v)[1].is_number_unsigned());
  EXPECT_TRUE((*v)[2].is_number_integer() && !(*v)[2].is_number_unsigned());
  EXPECT_TRUE((*v)[3].is_number_integer() && !(*v)[3].is_number_unsigned());
  EXPECT_TRUE((*v)[4].is_number_float());
  EXPECT_TRUE((*v)[5].is_number_float());
  EXPECT_EQ((*v)[6].get<uint64_t>(), UINT64_MAX);
  EXPECT_TRUE((*v)[7].is_number_float());
}

TEST(StrictJson, SyntaxDepthNulAndUtf8Problems) {
  JsonProblem problem;
  EXPECT_FALSE(parse_json_strict("{\"a\":}", problem));
  EXPECT_EQ(problem.kind, Kind::kSyntax);
  EXPECT_NE(problem.message.find("byte"), std::string::npos);
  EXPECT_FALSE(parse_json_strict(std::string(65, '[') + std::string(65, ']'), problem));
  EXPECT_EQ(problem.kind, Kind::kTooDeep);
  EXPECT_TRUE(parse_json_strict(std::string(64, '[') + std::string(64, ']'), problem).has_value());
  EXPECT_FALSE(parse_json_strict(std::string("{}\0{}", 5), problem));
  EXPECT_EQ(problem.kind, Kind::kSyntax);
  EXPECT_FALSE(parse_json_strict("{\"\xC3\x28\":1}", problem));
  EXPECT_EQ(problem.kind, Kind::kInvalidUtf8);
  EXPECT_FALSE(parse_json_strict("", problem));
  EXPECT_EQ(problem.kind, Kind::kSyntax);
  EXPECT_FALSE(parse_json_strict("{} {}", problem));  // one value only
  EXPECT_TRUE(parse_json_strict(" \n{\"a\": [1, 2]}\n ", problem).has_value());
}

TEST(StrictJson, OrFailNamesTheSourceAndTheProblem) {
  EXPECT_EQ(parse_json_strict_or_fail(R"({"a": 1})", "x.json")["a"].get<int>(), 1);
  try {
    parse_json_strict_or_fail(R"({"a": 1, "a": 2})", "dir/x.json");
    FAIL() << "a duplicate key was accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "dir/x.json: duplicate key \"a\"");
  }
}

TEST(StrictJson, ExcerptsAreCutShort) {
  EXPECT_EQ(json_excerpt(nlohmann::json("abc")), "\"abc\"");
  const std::string long_text(100, 'x');
  const std::string cut = json_excerpt(nlohmann::json(long_text));
  EXPECT_EQ(cut.size(), 40u);
  EXPECT_EQ(cut, "\"" + std::string(36, 'x') + "...");
  EXPECT_EQ(json_excerpt(nlohmann::json(long_text), 10), "\"xxxxxx...");
}

}  // namespace
}  // namespace kimirt
