// The hardening corpus: malformed safetensors files, each made here from a readable header and each
// expected to fail with one specific error kind and a message naming the file (and the tensor at fault).
// The cases follow the bugs other loaders had (spec/checkpoints-and-loading.md §4.3-4.5).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "io/io_test_util.h"
#include "io/safetensors_corpus.h"
#include "kimirt/io/safetensors.h"

namespace kimirt::io {
namespace {

using testing::le64;
using testing::ScratchDir;
using testing::st_bytes;
using Kind = SafetensorsError::Kind;

using testing::Case;
using testing::corpus;
using testing::kW;

class SafetensorsCorpus : public ::testing::TestWithParam<Case> {};

TEST_P(SafetensorsCorpus, RejectedWithKindAndNames) {
  const Case& c = GetParam();
  ScratchDir dir;
  const auto path = dir / (c.name + ".safetensors");
  testing::write_file(path, c.bytes);

  try {
    SafetensorsFile::open(path);
    FAIL() << c.name << ": opened without error";
  } catch (const SafetensorsError& e) {
    const std::string message = e.what();
    EXPECT_EQ(kind_name(e.kind()), kind_name(c.kind)) << message;
    EXPECT_NE(message.find(path.string()), std::string::npos) << message;
    EXPECT_EQ(e.tensor(), c.tensor) << message;
    if (!c.tensor.empty()) {
      EXPECT_NE(message.find("'" + c.tensor + "'"), std::string::npos) << message;
    }
    if (!c.mentions.empty()) {
      EXPECT_NE(message.find(c.mentions), std::string::npos) << message;
    }
  }

  // The in-memory path (what the fuzzer drives) agrees with the file path.
  const auto* bytes = reinterpret_cast<const uint8_t*>(c.bytes.data());
  try {
    parse_safetensors_buffer({bytes, c.bytes.size()}, c.name);
    FAIL() << c.name << ": parsed from memory without error";
  } catch (const SafetensorsError& e) {
    EXPECT_EQ(kind_name(e.kind()), kind_name(c.kind)) << e.what();
  }

  // The collecting validator reports it too.
  bool reported = false;
  for (const auto& problem : find_safetensors_file_problems(path)) reported |= problem.kind() == c.kind;
  EXPECT_TRUE(reported) << c.name;
}

INSTANTIATE_TEST_SUITE_P(Malformed, SafetensorsCorpus, ::testing::ValuesIn(corpus()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(SafetensorsCorpus, HasAtLeast25DistinctCases) {
  const auto cases = corpus();
  EXPECT_GE(cases.size(), 25u);
  // A case that accidentally equals the valid file would "pass" by failing for another reason.
  const std::string good = st_bytes("{" + kW + "}", 16);
  for (const auto& c : cases) EXPECT_NE(c.bytes, good) << c.name;
}

}  // namespace
}  // namespace kimirt::io
