#include "kimirt/io/shard_index.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "kimirt/base/strict_json.h"
#include "kimirt/io/posix_file.h"
#include "kimirt/io/reporter.h"

namespace kimirt::io {
namespace {

using nlohmann::json;
using Kind = CheckpointError::Kind;

// The released K3 index lists about half a million keys (~60 MB); anything near this is not an index. The parse
// holds the whole index as JSON values: measured, a file of short entries takes about 15 times its size in memory
// (26 MB, 1M keys: 0.4 GB resident), so the limit also bounds that (to about 4 GB).
constexpr uint64_t kMaxIndexBytes = uint64_t{256} << 20;

void parse_metadata(const json& metadata, std::optional<uint64_t>& total_size, Reporter<CheckpointError>& report) {
  if (!metadata.is_object()) {
    report(Kind::kInvalidIndex, fmt::format("\"metadata\" must be an object, not {}", json_excerpt(metadata)));
    return;
  }
  // Other metadata keys (total_parameters, ...) are free-form.
  auto it = metadata.find("total_size");
  if (it == metadata.end()) return;
  if (!it->is_number_unsigned()) {
    report(Kind::kInvalidIndex,
           fmt::format("metadata.total_size must be a non-negative integer, not {}", json_excerpt(*it)));
    return;
  }
  total_size = it->get<uint64_t>();
}

}  // namespace

bool is_plain_shard_name(std::string_view name, std::string* why) {
  auto no = [&](std::string_view reason) {
    if (why != nullptr) *why = std::string(reason);
    return false;
  };
  constexpr std::string_view kSuffix = ".safetensors";
  if (name.find('/') != std::string_view::npos || name.find('\\') != std::string_view::npos) {
    return no("a shard must be a plain file name inside the checkpoint directory, without a directory part");
  }
  if (name == "." || name == "..") return no("a shard must be a plain file name, not a directory reference");
  for (char c : name) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return no("control character in the file name");
  }
  if (name.size() <= kSuffix.size() || !name.ends_with(kSuffix))
    return no("a shard file name must end in .safetensors");
  return true;
}

const std::string* ShardIndex::file_of(std::string_view tensor) const {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), tensor,
                             [](const Entry& e, std::string_view n) { return e.name < n; });
  if (it == entries_.end() || it->name != tensor) return nullptr;
  return &files_[it->file];
}

bool ShardIndex::left_out(std::string_view tensor) const {
  return std::binary_search(left_out_.begin(), left_out_.end(), tensor, std::less<>());
}

ShardIndex ShardIndex::parse_into(std::string_view text, std::string_view label, std::vector<CheckpointError>* sink) {
  Reporter<CheckpointError> report(label, sink);
  ShardIndex index;
  JsonProblem problem;
  auto root = parse_json_strict(text, problem);
  if (!root) {
    report(problem.kind == JsonProblem::Kind::kDuplicateKey ? Kind::kDuplicateKey : Kind::kInvalidJson,
           problem.message);
    return index;
  }
  if (!root->is_object()) {
    report(Kind::kInvalidIndex, fmt::format("must be a JSON object, not {}", root->type_name()));
    return index;
  }
  for (auto it = root->begin(); it != root->end(); ++it) {
    if (it.key() == "metadata") {
      parse_metadata(it.value(), index.total_size_, report);
    } else if (it.key() != "weight_map") {
      index.unknown_keys_.push_back(it.key());
    }
  }
  auto map_it = root->find("weight_map");
  if (map_it == root->end()) {
    report(Kind::kInvalidIndex, "no \"weight_map\"");
    return index;
  }
  const json& map = *map_it;
  if (!map.is_object()) {
    report(Kind::kInvalidIndex, fmt::format("\"weight_map\" must be an object, not {}", json_excerpt(map)));
    return index;
  }
  if (map.empty()) report(Kind::kInvalidIndex, "\"weight_map\" lists no tensors");

  std::map<std::string, uint32_t, std::less<>> file_ids;
  std::vector<std::pair<const std::string*, const std::string*>> good;  // (tensor, file), in key order
  for (auto it = map.begin(); it != map.end(); ++it) {
    const std::string& name = it.key();
    const json& value = it.value();
    if (name.empty()) {
      report(Kind::kInvalidIndex, "weight_map has an empty tensor name");
      continue;
    }
    if (!value.is_string()) {
      report(Kind::kInvalidIndex,
             fmt::format("weight_map[\"{}\"] must be a file name string, not {}", name, json_excerpt(value)));
      index.left_out_.push_back(name);
      continue;
    }
    const auto& file = value.get_ref<const std::string&>();
    std::string why;
    if (!is_plain_shard_name(file, &why)) {
      report(Kind::kBadShardName, fmt::format("weight_map[\"{}\"] = {}: {}", name, json_excerpt(value), why));
      index.left_out_.push_back(name);
      continue;
    }
    file_ids.emplace(file, 0);
    good.emplace_back(&name, &file);
  }
  for (auto& [file, id] : file_ids) {
    id = static_cast<uint32_t>(index.files_.size());
    index.files_.push_back(file);
  }
  std::sort(index.left_out_.begin(), index.left_out_.end());
  index.entries_.reserve(good.size());
  for (const auto& [name, file] : good) index.entries_.push_back({*name, file_ids.find(*file)->second});
  return index;
}

ShardIndex ShardIndex::parse(std::string_view text, std::string_view label) { return parse_into(text, label, nullptr); }

ShardIndex ShardIndex::parse(std::string_view text, std::string_view label, std::vector<CheckpointError>& problems) {
  return parse_into(text, label, &problems);
}

ShardIndex ShardIndex::read(const std::filesystem::path& path) {
  std::string text;
  if (int error = read_whole_file(path.c_str(), kMaxIndexBytes, text); error != 0) {
    throw CheckpointError(Kind::kIo,
                          fmt::format("{}: cannot read: {}", path.string(), file_error_text(error, kMaxIndexBytes)));
  }
  return parse(text, path.string());
}

ShardIndex ShardIndex::read(const std::filesystem::path& path, std::vector<CheckpointError>& problems) {
  std::string text;
  if (int error = read_whole_file(path.c_str(), kMaxIndexBytes, text); error != 0) {
    problems.emplace_back(Kind::kIo,
                          fmt::format("{}: cannot read: {}", path.string(), file_error_text(error, kMaxIndexBytes)));
    return ShardIndex();
  }
  return parse(text, path.string(), problems);
}

}  // namespace kimirt::io
