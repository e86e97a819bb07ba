#include "kimirt/cli/model_files.h"

#include <algorithm>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "kimirt/base/error.h"
#include "kimirt/base/log.h"
#include "kimirt/base/strict_json.h"
#include "kimirt/text/tiktoken_model.h"

namespace kimirt::cli {

namespace fs = std::filesystem;

std::optional<text::Tokenizer> find_tokenizer(const fs::path& dir, int64_t vocab) {
  if (!fs::is_regular_file(dir / text::kTiktokenModelFile)) return std::nullopt;
  auto tokenizer = text::Tokenizer::load(dir);
  if (tokenizer.vocab_size() != vocab) {
    log::warn("{}: the tokenizer has {} ids, the model {}; printing ids", dir.string(), tokenizer.vocab_size(), vocab);
    return std::nullopt;
  }
  return tokenizer;
}

std::vector<int32_t> eos_ids(const fs::path& dir, const model::ModelConfig& config) {
  std::vector<int32_t> ids;
  if (config.eos_token_id) ids.push_back(static_cast<int32_t>(*config.eos_token_id));
  const fs::path path = dir / "generation_config.json";
  if (!fs::is_regular_file(path)) return ids;
  const auto j = parse_json_strict_or_fail(text::read_text_file(path), path.string());
  const auto it = j.find("eos_token_id");
  if (it == j.end() || it->is_null()) return ids;
  const auto list = it->is_array() ? *it : nlohmann::json::array({*it});
  for (const auto& v : list) {
    KIMIRT_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < config.vocab_size,
                 "{}: eos_token_id {} is not a token id of the model", path.string(), v.dump());
    const auto id = static_cast<int32_t>(v.get<int64_t>());
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  return ids;
}

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    std::string item = text.substr(pos, comma - pos);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    KIMIRT_CHECK(!item.empty() && end && *end == '\0' && v >= 0 && v <= INT32_MAX,
                 "--ids: element {} (\"{}\") is not a token id", ids.size(), item);
    ids.push_back(static_cast<int32_t>(v));
    pos = comma + 1;
  }
  return ids;
}

}  // namespace kimirt::cli
