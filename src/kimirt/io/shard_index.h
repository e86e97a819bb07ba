// model.safetensors.index.json: which shard file holds each tensor. Parsed strictly, because the index
// decides which files we open: a duplicate key, a non-string value or a file name that is not a plain
// "*.safetensors" name inside the checkpoint directory (path traversal, substitution) is an error.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kimirt/io/io_error.h"

namespace kimirt::io {

inline constexpr std::string_view kShardIndexFileName = "model.safetensors.index.json";

class ShardIndex {
 public:
  struct Entry {
    std::string name;  // tensor key
    uint32_t file;     // index into files()
  };

  // Throws CheckpointError (kInvalidJson, kDuplicateKey, kInvalidIndex, kBadShardName) naming `label`.
  static ShardIndex parse(std::string_view text, std::string_view label);
  // Collects every problem instead; entries with a problem are left out of the result.
  static ShardIndex parse(std::string_view text, std::string_view label, std::vector<CheckpointError>& problems);
  static ShardIndex read(const std::filesystem::path& path);
  static ShardIndex read(const std::filesystem::path& path, std::vector<CheckpointError>& problems);

  const std::vector<std::string>& files() const { return files_; }  // distinct shard names, sorted
  const std::vector<Entry>& entries() const { return entries_; }    // sorted by tensor name
  size_t size() const { return entries_.size(); }
  // Shard file of a tensor; nullptr when the index does not list it.
  const std::string* file_of(std::string_view tensor) const;
  // Whether the index lists `tensor` with a value that was reported and left out (not a string, a bad shard
  // name): such a tensor is not also "missing from the index".
  bool left_out(std::string_view tensor) const;
  // metadata.total_size when present: the writer's claim of the sum of tensor bytes.
  std::optional<uint64_t> total_size() const { return total_size_; }
  // Top-level keys other than weight_map and metadata (kept for warnings; not an error).
  const std::vector<std::string>& unknown_keys() const { return unknown_keys_; }

 private:
  static ShardIndex parse_into(std::string_view text, std::string_view label, std::vector<CheckpointError>* sink);

  std::vector<std::string> files_;
  std::vector<Entry> entries_;
  std::vector<std::string> left_out_;  // sorted
  std::optional<uint64_t> total_size_;
  std::vector<std::string> unknown_keys_;
};

// True for a plain shard file name: "*.safetensors", no directory part, no "..", no control characters.
// `why` says what is wrong otherwise.
bool is_plain_shard_name(std::string_view name, std::string* why = nullptr);

}  // namespace kimirt::io
