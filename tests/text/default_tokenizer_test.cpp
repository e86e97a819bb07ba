#include "kimirt/text/default_tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "kimirt/text/tokenizer.h"

namespace kimirt::text {
namespace {

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The embedded bytes are exactly the asset files, and they load as a tokenizer that round-trips text.
TEST(DefaultTokenizer, EmbeddedFilesEqualTheAssetsAndLoad) {
  const auto dir = std::filesystem::temp_directory_path() / "kimirt-default-tokenizer";
  std::filesystem::create_directories(dir);
  write_default_tokenizer(dir);
  const std::filesystem::path assets = std::filesystem::path(KIMIRT_TESTDATA_DIR) / ".." / "assets" / "default-tokenizer";
  for (const char* f : {"tiktoken.model", "tokenizer_config.json"}) EXPECT_EQ(slurp(dir / f), slurp(assets / f)) << f;
  const auto tok = Tokenizer::load(dir);
  EXPECT_EQ(tok.vocab_size(), default_tokenizer_vocab_size());
  EXPECT_EQ(tok.vocab_size(), 1456);
  const std::string text = "Kimi K3 reads 中文 and English.";
  EXPECT_EQ(tok.decode(tok.encode(text)), text);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kimirt::text
