// Every file of the malformed-safetensors corpus (tests/io/safetensors_corpus.h), put in a checkpoint
// directory as its only shard, makes `kimirt inspect` exit 1 with a message that names the file and the
// problem, and never crash.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "common/run_command.h"
#include "io/safetensors_corpus.h"

namespace kimirt::io {
namespace {

namespace fs = std::filesystem;

class InspectCorpus : public ::testing::TestWithParam<testing::Case> {};

TEST_P(InspectCorpus, ExitsOneNamingTheFileAndTheProblem) {
  const auto& c = GetParam();
  const fs::path dir = fs::temp_directory_path() / ("kimirt-inspect-corpus-" + c.name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(fs::path(KIMIRT_TESTDATA_DIR) / "kl-tiny" / "config.json", dir / "config.json");
  testing::write_file(dir / "model.safetensors", c.bytes);

  const auto r = kimirt::test::run_command(kimirt::test::kimirt_binary() + " inspect " + dir.string());
  const std::string& out = r.output;
  EXPECT_EQ(r.exit_code, 1) << "kimirt inspect must exit 1 (-1: it crashed): " << out;
  EXPECT_NE(out.find("model.safetensors"), std::string::npos) << out;
  if (!c.mentions.empty()) {
    EXPECT_NE(out.find(c.mentions), std::string::npos) << out;
  }
  if (!c.tensor.empty()) {
    EXPECT_NE(out.find(c.tensor), std::string::npos) << out;
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Malformed, InspectCorpus, ::testing::ValuesIn(testing::corpus()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace kimirt::io
