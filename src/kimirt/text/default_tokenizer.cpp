#include "kimirt/text/default_tokenizer.h"

#include <fstream>
#include <string_view>

#include "kimirt/base/error.h"
#include "kimirt/text/tokenizer.h"

std::string_view kimirt_default_tokenizer_file(std::string_view file_name);  // generated at build time

namespace kimirt::text {
namespace {

std::string_view embedded(std::string_view name) {
  const auto data = kimirt_default_tokenizer_file(name);
  KIMIRT_ASSERT(!data.empty());
  return data;
}

}  // namespace

void write_default_tokenizer(const std::filesystem::path& dir) {
  for (const char* name : {"tiktoken.model", "tokenizer_config.json"}) {
    const auto data = embedded(name);
    std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    out.close();  // the last bytes reach the file here: checked after, not before
    KIMIRT_CHECK(!out.fail(), "cannot write {}", (dir / name).string());
  }
}

int64_t default_tokenizer_vocab_size() {
  static const int64_t size =
      Tokenizer::from_contents(embedded("tiktoken.model"), embedded("tokenizer_config.json"), "the default tokenizer")
          .vocab_size();
  return size;
}

}  // namespace kimirt::text
