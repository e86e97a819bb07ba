// A checkpoint directory as released: config.json, then either model.safetensors.index.json and the shards
// it names, or a single model.safetensors; plus side files (tokenizer, generation config) looked up by
// name. Opening validates everything that can be checked without reading tensor bytes: every shard
// header in full, and the index against the headers (each key in exactly one shard, the shard the index
// names). Each shard is opened once and its descriptor kept for the loader.
//
// metadata.total_size is only compared, with a warning on mismatch: it is the writer's advisory sum, some
// writers compute it differently (shared tensors, padding), and nothing is read on its strength.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kimirt/io/io_error.h"
#include "kimirt/io/safetensors.h"
#include "kimirt/io/shard_index.h"

namespace kimirt::io {

struct CheckpointInspection;

class Checkpoint {
 public:
  struct TensorRef {
    const SafetensorsFile* shard;
    const TensorInfo* info;
  };

  // Throws CheckpointError, or SafetensorsError for a bad shard (naming the file and tensor).
  static Checkpoint open(const std::filesystem::path& dir);

  Checkpoint(Checkpoint&&) noexcept = default;
  Checkpoint& operator=(Checkpoint&&) noexcept = default;

  const std::filesystem::path& dir() const { return dir_; }
  // config.json as parsed (duplicate keys rejected); its meaning is the model layer's business.
  const nlohmann::json& config() const { return config_; }
  const std::vector<SafetensorsFile>& shards() const { return shards_; }  // sorted by file name
  // The index, or nullptr for a single-file checkpoint.
  const ShardIndex* index() const { return index_ ? &*index_ : nullptr; }

  size_t size() const { return by_name_.size(); }
  const TensorRef* find(std::string_view name) const;  // nullptr when absent
  const TensorRef& at(std::string_view name) const;    // throws kTensorNotFound naming the key
  std::vector<std::string> tensor_names() const;       // sorted
  uint64_t tensor_bytes() const;                       // sum over all tensors
  Tensor read_tensor(std::string_view name) const;

  // Side files by relative path ("tokenizer_config.json"); a path that is absolute or climbs out with
  // ".." is never inside: has_file says false, file_path throws kBadPath.
  bool has_file(std::string_view relative) const;
  std::filesystem::path file_path(std::string_view relative) const;

  // Findings that do not stop loading (total_size mismatch, unknown index keys, ignored files).
  const std::vector<std::string>& warnings() const { return warnings_; }

 private:
  friend class CheckpointBuilder;
  friend CheckpointInspection inspect_checkpoint_dir(const std::filesystem::path& dir);
  Checkpoint() = default;

  std::filesystem::path dir_;
  nlohmann::json config_;
  std::optional<ShardIndex> index_;
  std::vector<SafetensorsFile> shards_;
  std::vector<TensorRef> by_name_;  // sorted by name; points into shards_ (stable across moves)
  std::vector<std::string> warnings_;
};

struct CheckpointReport {
  std::vector<std::string> errors;  // each names the file and, where one is involved, the tensor or key
  std::vector<std::string> warnings;
  bool ok() const { return errors.empty(); }
};

// Every problem of a directory, not only the first (for `kimirt inspect`); never throws for bad input.
// A shard whose header is broken is reported with all its header problems and left out of the index
// cross-check, so its keys do not also show up as "missing".
CheckpointReport validate_checkpoint_dir(const std::filesystem::path& dir);

// validate_checkpoint_dir and, when it finds no error, the open Checkpoint from the same walk: the index and
// every shard header are parsed once (Checkpoint::open after validate_checkpoint_dir parses them twice).
struct CheckpointInspection {
  CheckpointReport report;
  std::optional<Checkpoint> checkpoint;  // set exactly when report.ok()
};
CheckpointInspection inspect_checkpoint_dir(const std::filesystem::path& dir);

}  // namespace kimirt::io
