// model.safetensors.index.json parsing: the good shape, and each way an index can lie about files.
#include "kimirt/io/shard_index.h"

#include <gtest/gtest.h>

#include "io/io_test_util.h"

namespace kimirt::io {
namespace {

using Kind = CheckpointError::Kind;

std::string kind_of(std::string_view text) {
  try {
    ShardIndex::parse(text, "idx.json");
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("idx.json"), std::string::npos) << e.what();
    return std::string(kind_name(e.kind()));
  }
  return "accepted";
}

std::string name(Kind k) { return std::string(kind_name(k)); }

TEST(ShardIndex, ParsesWeightMapAndTotalSize) {
  const auto index = ShardIndex::parse(R"({
    "metadata": {"total_size": 1234, "total_parameters": 617},
    "weight_map": {"b": "model-00002-of-00002.safetensors", "a": "model-00001-of-00002.safetensors",
                   "c": "model-00001-of-00002.safetensors"}})",
                                       "idx.json");
  EXPECT_EQ(index.size(), 3u);
  EXPECT_EQ(index.files(),
            (std::vector<std::string>{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}));
  EXPECT_EQ(index.entries()[0].name, "a");
  EXPECT_EQ(*index.file_of("b"), "model-00002-of-00002.safetensors");
  EXPECT_EQ(*index.file_of("c"), "model-00001-of-00002.safetensors");
  EXPECT_EQ(index.file_of("d"), nullptr);
  EXPECT_EQ(index.total_size(), 1234u);
  EXPECT_TRUE(index.unknown_keys().empty());

  const auto bare = ShardIndex::parse(R"({"weight_map": {"x": "m.safetensors"}, "extra": 1})", "idx.json");
  EXPECT_FALSE(bare.total_size().has_value());
  EXPECT_EQ(bare.unknown_keys(), std::vector<std::string>{"extra"});
}

TEST(ShardIndex, RejectsMalformedIndexes) {
  EXPECT_EQ(kind_of("{"), name(Kind::kInvalidJson));
  EXPECT_EQ(kind_of("[]"), name(Kind::kInvalidIndex));
  EXPECT_EQ(kind_of(R"({"metadata": {}})"), name(Kind::kInvalidIndex));
  EXPECT_EQ(kind_of(R"({"weight_map": []})"), name(Kind::kInvalidIndex));
  EXPECT_EQ(kind_of(R"({"weight_map": {}})"), name(Kind::kInvalidIndex));
  EXPECT_EQ(kind_of(R"({"weight_map": {"a": 3}})"), name(Kind::kInvalidIndex));
  EXPECT_EQ(kind_of(R"({"weight_map": {"a": null}})"), name(Kind::kInvalidIndex));
  EXPECT_EQ(kind_of(R"({"weight_map": {"": "m.safetensors"}})"), name(Kind::kInvalidIndex));
  EXPECT_EQ(kind_of(R"({"weight_map": {"a": "m.safetensors"}, "metadata": {"total_size": -1}})"),
            name(Kind::kInvalidIndex));
  EXPECT_EQ(kind_of(R"({"weight_map": {"a": "m.safetensors"}, "metadata": {"total_size": "12"}})"),
            name(Kind::kInvalidIndex));
  EXPECT_EQ(kind_of(R"({"weight_map": {"a": "m.safetensors"}, "metadata": 5})"), name(Kind::kInvalidIndex));
  // Duplicates: a plain JSON parse would let the second mapping win silently.
  EXPECT_EQ(kind_of(R"({"weight_map": {"a": "m.safetensors", "a": "n.safetensors"}})"), name(Kind::kDuplicateKey));
  EXPECT_EQ(kind_of(R"({"weight_map": {"a": "m.safetensors"}, "weight_map": {"a": "n.safetensors"}})"),
            name(Kind::kDuplicateKey));
  EXPECT_EQ(kind_of("{\"weight_map\": {\"a\xff\": \"m.safetensors\"}}"), name(Kind::kInvalidJson));
}

TEST(ShardIndex, RejectsShardNamesOutsideTheDirectory) {
  for (const char* bad :
       {"../model.safetensors", "/etc/passwd.safetensors", "sub/model.safetensors", "..\\\\model.safetensors", "..",
        ".", "", ".safetensors", "config.json", "model.safetensors\\u0000.txt", "model\\n.safetensors"}) {
    const std::string text = std::string(R"({"weight_map": {"a": ")") + bad + "\"}}";
    EXPECT_EQ(kind_of(text), name(Kind::kBadShardName)) << bad;
  }
  std::string why;
  EXPECT_FALSE(is_plain_shard_name("../x.safetensors", &why));
  EXPECT_NE(why.find("directory"), std::string::npos);
  EXPECT_TRUE(is_plain_shard_name("model-00001-of-00096.safetensors"));
  EXPECT_TRUE(is_plain_shard_name("..model.safetensors"));  // a plain (odd) name, not a parent reference
}

TEST(ShardIndex, CollectsEveryProblemAndKeepsTheGoodEntries) {
  std::vector<CheckpointError> problems;
  const auto index = ShardIndex::parse(
      R"({"weight_map": {"a": "../a.safetensors", "b": 7, "c": "ok.safetensors", "d": "x/y.safetensors"},
          "metadata": {"total_size": 1.5}})",
      "idx.json", problems);
  std::vector<std::string> kinds;
  for (const auto& p : problems) kinds.push_back(std::string(kind_name(p.kind())));
  EXPECT_EQ(kinds, (std::vector<std::string>{name(Kind::kInvalidIndex), name(Kind::kBadShardName),
                                             name(Kind::kInvalidIndex), name(Kind::kBadShardName)}));
  EXPECT_NE(std::string(problems[1].what()).find("\"a\""), std::string::npos);
  EXPECT_EQ(index.size(), 1u);
  EXPECT_EQ(*index.file_of("c"), "ok.safetensors");
}

TEST(ShardIndex, ReadReportsUnreadableFile) {
  testing::ScratchDir dir;
  try {
    ShardIndex::read(dir / "model.safetensors.index.json");
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_EQ(e.kind(), Kind::kIo);
    EXPECT_NE(std::string(e.what()).find("model.safetensors.index.json"), std::string::npos);
  }
}

}  // namespace
}  // namespace kimirt::io
