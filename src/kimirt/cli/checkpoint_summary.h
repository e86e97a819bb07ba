// What `kimirt inspect` finds in a checkpoint directory: the model (from config.json), the shards, the
// bytes per dtype, the quantized weights and their scales, and every problem. Kept apart from the
// printing so that the JSON and the text output say the same things.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kimirt/cli/value_check.h"
#include "kimirt/model/config.h"
#include "kimirt/model/schema.h"

namespace kimirt::cli {

struct ShardSummary {
  std::string file;
  uint64_t bytes = 0;
  size_t tensors = 0;
};

struct CheckpointSummary {
  std::filesystem::path dir;
  std::optional<model::ModelConfig> config;
  std::vector<ShardSummary> shards;
  size_t tensors = 0;
  uint64_t tensor_bytes = 0;
  std::map<std::string, uint64_t> bytes_per_dtype;   // "BF16" -> bytes
  std::map<std::string, size_t> weights_per_format;  // "mxfp4" -> count of weights stored so
  size_t not_read = 0;  // tensors a text model never reads (vision tower, projector): not counted above
  uint64_t parameters = 0;                           // logical parameter count of the schema
  // The parameters with the formats the checkpoint stores them in (null when config or tensors could not be
  // read): what `inspect --device` sizes the weights from.
  std::shared_ptr<const model::Schema> schema;
  std::vector<std::string> side_files;  // tokenizer files, generation config, ...
  std::string chat_template;            // one line; empty when no family is known
  std::optional<ValueCheck> values;     // with --check-values, when the structure had no error
  std::vector<std::string> errors;
  std::vector<std::string> warnings;

  bool ok() const { return errors.empty(); }
  nlohmann::json to_json() const;
  std::string to_text() const;
};

// Never throws for bad input: every problem found ends up in `errors`. With `check_values`, a checkpoint whose
// structure has no error is then read whole and every NaN or infinite value counted (value_check.h): a tensor
// holding any is an error.
CheckpointSummary summarize_checkpoint(const std::filesystem::path& dir, bool check_values = false);

}  // namespace kimirt::cli
