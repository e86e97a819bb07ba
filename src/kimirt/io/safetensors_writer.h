// Writes safetensors files that the reader here, the Rust crate and the Python package accept, laid out as
// the official serializer lays them out: entries sorted by descending dtype alignment and then by name
// (so each tensor starts aligned to its element size), the header padded with spaces to a multiple of 8,
// optional __metadata__ first. The file appears complete or not at all (temp file, fsync, rename).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "kimirt/io/io_error.h"
#include "kimirt/tensor/tensor.h"

namespace kimirt::io {

class SafetensorsWriter {
 public:
  // Copies the tensor's bytes (a strided view is gathered into row-major order), so the source may go
  // away before write(). Throws SafetensorsError(kInvalidArgument) for an empty, reserved or repeated name,
  // or bytes that do not match dtype x shape.
  void add(std::string name, const TensorView& view);
  void add(std::string name, DType dtype, Shape shape, std::span<const uint8_t> bytes);
  void set_metadata(std::string key, std::string value);

  size_t size() const { return entries_.size(); }
  // The padded JSON header exactly as it will be written.
  std::string header() const;
  // The whole file in memory (tests, fuzzing, small files).
  std::vector<uint8_t> serialize() const;
  // Writes `path` atomically: a temp file beside it (beside the file a symbolic link names), fsync, rename.
  // Throws SafetensorsError(kIo) naming the path; no partial file is left behind. A path naming neither a
  // regular file nor a directory (a FIFO, /dev/stdout) is written in place and stays what it is.
  void write(const std::filesystem::path& path) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<const Entry*> ordered() const;

  std::vector<Entry> entries_;
  std::set<std::string> names_;
  std::map<std::string, std::string> metadata_;
};

// Rank of a dtype in the safetensors crate's Dtype enum, which lists dtypes by increasing alignment; the
// serializer writes higher ranks first.
int safetensors_dtype_order(DType dtype);

}  // namespace kimirt::io
