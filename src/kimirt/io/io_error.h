// The errors of the io layer. Each carries a Kind, so that callers (and tests) can tell a gap in a
// safetensors file from an overlap or a missing shard without parsing the message, and a message that
// names the file and, where one is involved, the tensor or index key.
#pragma once

#include <string>
#include <string_view>

#include "kimirt/base/error.h"

namespace kimirt::io {

class SafetensorsError : public Error {
 public:
  enum class Kind {
    kIo,                   // open, stat or read failed (errno in the message), or not a regular file
    kTruncated,            // a read met end of file: the file shrank after its header was checked
    kChanged,              // the file was modified (rewritten in place) while it was read
    kHeaderTooSmall,       // fewer than 8 bytes
    kHeaderTooLarge,       // header length over 100,000,000
    kInvalidHeaderLength,  // 8 + header length overflows or runs past the end of the file
    kInvalidUtf8,          // the header is not valid UTF-8
    kInvalidJson,          // syntax error, nesting too deep, or padding that is not spaces
    kNotAnObject,          // the header is not a JSON object
    kDuplicateKey,         // a key twice in one JSON object, at any level
    kInvalidEntry,         // a tensor entry that is not {"dtype", "shape", "data_offsets"} exactly
    kUnknownDtype,         // a dtype string safetensors does not define
    kUnsupportedDtype,     // a dtype safetensors defines but kimirt does not load (C64, F6_E2M3, ...)
    kInvalidShape,         // a dimension that is negative, not an integer, or over 2^63 - 1
    kOverflow,             // element count or byte size does not fit in 64 bits
    kPartialByte,          // a sub-byte dtype (F4) whose elements do not fill whole bytes
    kInvalidOffsets,       // data_offsets not two non-negative integers, or END < BEGIN
    kOffsetsOutOfRange,    // END past the end of the data section
    kSizeMismatch,         // END - BEGIN differs from the bytes of shape x dtype
    kOverlap,              // two tensors share bytes
    kGap,                  // bytes of the data section that belong to no tensor
    kTrailingBytes,        // the data section goes on after the last tensor
    kInvalidMetadata,      // __metadata__ is not an object of strings
    kTensorNotFound,       // lookup of a name the file does not hold
    kInvalidArgument,      // the writer was given something it cannot write
  };

  SafetensorsError(Kind kind, std::string file, std::string tensor, std::string_view detail);

  Kind kind() const { return kind_; }
  const std::string& file() const { return file_; }
  // Empty when the problem is not about one tensor.
  const std::string& tensor() const { return tensor_; }
  // The same error about `tensor` (a reader of byte ranges learns the name from the range's owner).
  SafetensorsError naming(std::string tensor) const {
    return SafetensorsError(kind_, file_, std::move(tensor), detail_);
  }

 private:
  Kind kind_;
  std::string file_;
  std::string tensor_;
  std::string detail_;
};

std::string_view kind_name(SafetensorsError::Kind kind);

class CheckpointError : public Error {
 public:
  enum class Kind {
    kIo,              // a directory or file that cannot be read
    kNotADirectory,   // the checkpoint path is not a directory
    kMissingConfig,   // no config.json
    kInvalidConfig,   // config.json is not a JSON object (or not JSON)
    kInvalidJson,     // the index is not valid JSON or not valid UTF-8
    kDuplicateKey,    // a key twice in one JSON object of config.json or the index
    kInvalidIndex,    // the index does not have the shape {"weight_map": {name: file}, "metadata": {...}}
    kBadShardName,    // a shard file name in the index that is not a plain *.safetensors name (path traversal)
    kNoWeights,       // neither model.safetensors.index.json nor model.safetensors
    kMissingShard,    // the index names a file the directory does not have
    kKeyNotInShard,   // the index maps a key to a shard that does not hold it
    kKeyNotInIndex,   // a shard holds a key the index does not list
    kWrongShard,      // the index maps a key to one shard, but another shard holds it
    kKeyInTwoShards,  // two shards hold the same key
    kTensorNotFound,  // lookup of a key the checkpoint does not hold
    kBadPath,         // has_file / file_path given a path that leaves the directory
  };

  CheckpointError(Kind kind, std::string_view message);
  // "<where>: <detail>"
  CheckpointError(Kind kind, std::string_view where, std::string_view detail);
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

std::string_view kind_name(CheckpointError::Kind kind);

}  // namespace kimirt::io
