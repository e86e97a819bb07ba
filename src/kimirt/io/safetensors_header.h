// The safetensors header as a pure function over bytes: everything that can be checked without the file
// (spec/checkpoints-and-loading.md §4). At least as strict as the Rust `safetensors` crate, and more: no
// duplicate keys at any level, exact entry fields, known dtypes, order-independent overflow checks, and a
// data section covered exactly by tensors. The fuzz targets call these functions directly.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kimirt/io/io_error.h"
#include "kimirt/tensor/dtype.h"
#include "kimirt/tensor/tensor.h"

namespace kimirt::io {

// The crate's MAX_HEADER_SIZE: a larger header is refused before anything is allocated for it.
inline constexpr uint64_t kMaxSafetensorsHeaderSize = 100'000'000;

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t begin = 0;  // byte offsets relative to the start of the data section; END is one past the last
  uint64_t end = 0;

  uint64_t nbytes() const { return end - begin; }
  int64_t numel() const { return shape_numel(shape); }
};

struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;  // in data order (ascending offsets; ties by name)
  std::map<std::string, std::string> metadata;
};

// Parses and validates the N header bytes of a file whose data section (what follows the header) has
// `data_size` bytes. Throws SafetensorsError naming `file_label` and, where one is at fault, the tensor.
SafetensorsHeader parse_safetensors_header(std::string_view header_bytes, uint64_t data_size,
                                           std::string_view file_label);

// The same checks, but every problem is returned instead of the first thrown (for `kimirt inspect`).
// Empty when the header is valid. Problems that follow from an earlier one are not repeated.
std::vector<SafetensorsError> find_safetensors_header_problems(std::string_view header_bytes, uint64_t data_size,
                                                               std::string_view file_label);

// Decodes the 8-byte little-endian header length from the start of a file of `file_size` bytes and checks
// it: at most kMaxSafetensorsHeaderSize and 8 + N within the file. `first_bytes` holds the file's first
// min(8, file_size) bytes. Returns N.
uint64_t check_safetensors_header_length(std::span<const uint8_t> first_bytes, uint64_t file_size,
                                         std::string_view file_label);

struct ParsedSafetensors {
  uint64_t header_size = 0;  // N
  SafetensorsHeader header;
  uint64_t data_offset() const { return 8 + header_size; }
};

// A whole safetensors file held in memory (tests, fuzzing, small tools).
ParsedSafetensors parse_safetensors_buffer(std::span<const uint8_t> file_bytes, std::string_view file_label);

}  // namespace kimirt::io
