#include "kimirt/io/io_error.h"

#include <fmt/format.h>

namespace kimirt::io {
namespace {

std::string safetensors_message(const std::string& file, const std::string& tensor, std::string_view detail) {
  if (tensor.empty()) return fmt::format("{}: {}", file, detail);
  return fmt::format("{}: tensor '{}': {}", file, tensor, detail);
}

}  // namespace

SafetensorsError::SafetensorsError(Kind kind, std::string file, std::string tensor, std::string_view detail)
    : Error(safetensors_message(file, tensor, detail)),
      kind_(kind),
      file_(std::move(file)),
      tensor_(std::move(tensor)),
      detail_(detail) {}

std::string_view kind_name(SafetensorsError::Kind kind) {
  using K = SafetensorsError::Kind;
  switch (kind) {
    case K::kIo:
      return "io";
    case K::kTruncated:
      return "truncated";
    case K::kChanged:
      return "changed while read";
    case K::kHeaderTooSmall:
      return "header too small";
    case K::kHeaderTooLarge:
      return "header too large";
    case K::kInvalidHeaderLength:
      return "invalid header length";
    case K::kInvalidUtf8:
      return "invalid UTF-8";
    case K::kInvalidJson:
      return "invalid JSON";
    case K::kNotAnObject:
      return "not an object";
    case K::kDuplicateKey:
      return "duplicate key";
    case K::kInvalidEntry:
      return "invalid entry";
    case K::kUnknownDtype:
      return "unknown dtype";
    case K::kUnsupportedDtype:
      return "unsupported dtype";
    case K::kInvalidShape:
      return "invalid shape";
    case K::kOverflow:
      return "overflow";
    case K::kPartialByte:
      return "partial byte";
    case K::kInvalidOffsets:
      return "invalid offsets";
    case K::kOffsetsOutOfRange:
      return "offsets out of range";
    case K::kSizeMismatch:
      return "size mismatch";
    case K::kOverlap:
      return "overlap";
    case K::kGap:
      return "gap";
    case K::kTrailingBytes:
      return "trailing bytes";
    case K::kInvalidMetadata:
      return "invalid metadata";
    case K::kTensorNotFound:
      return "tensor not found";
    case K::kInvalidArgument:
      return "invalid argument";
  }
  return "?";
}

CheckpointError::CheckpointError(Kind kind, std::string_view message) : Error(std::string(message)), kind_(kind) {}

CheckpointError::CheckpointError(Kind kind, std::string_view where, std::string_view detail)
    : CheckpointError(kind, fmt::format("{}: {}", where, detail)) {}

std::string_view kind_name(CheckpointError::Kind kind) {
  using K = CheckpointError::Kind;
  switch (kind) {
    case K::kIo:
      return "io";
    case K::kNotADirectory:
      return "not a directory";
    case K::kMissingConfig:
      return "missing config";
    case K::kInvalidConfig:
      return "invalid config";
    case K::kInvalidJson:
      return "invalid JSON";
    case K::kDuplicateKey:
      return "duplicate key";
    case K::kInvalidIndex:
      return "invalid index";
    case K::kBadShardName:
      return "bad shard name";
    case K::kNoWeights:
      return "no weights";
    case K::kMissingShard:
      return "missing shard";
    case K::kKeyNotInShard:
      return "key not in shard";
    case K::kKeyNotInIndex:
      return "key not in index";
    case K::kWrongShard:
      return "wrong shard";
    case K::kKeyInTwoShards:
      return "key in two shards";
    case K::kTensorNotFound:
      return "tensor not found";
    case K::kBadPath:
      return "bad path";
  }
  return "?";
}

}  // namespace kimirt::io
