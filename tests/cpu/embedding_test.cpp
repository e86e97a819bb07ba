#include "kimirt/cpu/embedding.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kimirt/base/error.h"

namespace kimirt::cpu {
namespace {

TEST(CpuEmbedding, GathersRows) {
  const std::vector<float> table = {0, 1, 10, 11, 20, 21};  // vocab 3, hidden 2
  const std::vector<int32_t> ids = {2, 0, 2};
  std::vector<float> out(6);
  embedding_gather(table.data(), 3, 2, ids, out.data());
  EXPECT_EQ(out, (std::vector<float>{20, 21, 0, 1, 20, 21}));
}

TEST(CpuEmbedding, OutOfVocabularyIdNamesPositionAndLeavesOutputAlone) {
  const std::vector<float> table = {0, 1, 10, 11};
  const std::vector<int32_t> ids = {1, 2};
  std::vector<float> out(4, -1.0f);
  try {
    embedding_gather(table.data(), 2, 2, ids, out.data());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 2 at position 1"), std::string::npos) << e.what();
  }
  EXPECT_EQ(out, std::vector<float>(4, -1.0f));
  const std::vector<int32_t> negative = {-1};
  EXPECT_THROW(embedding_gather(table.data(), 2, 2, negative, out.data()), Error);
}

TEST(CpuEmbedding, NullTableOrBadShapeIsAnError) {
  const std::vector<int32_t> ids = {0};
  std::vector<float> out(2);
  EXPECT_THROW(embedding_gather(nullptr, 2, 2, ids, out.data()), Error);
  const std::vector<float> table = {0, 1, 10, 11};
  EXPECT_THROW(embedding_gather(table.data(), 2, 0, ids, out.data()), Error);
  EXPECT_THROW(embedding_gather(table.data(), 2, 2, ids, nullptr), Error);
  embedding_gather(nullptr, 2, 2, {}, nullptr);  // no ids (an idle rank): nothing to read or write
}

}  // namespace
}  // namespace kimirt::cpu
