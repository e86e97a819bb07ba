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
  // Writes where write_destination(path) says. Throws SafetensorsError naming the path; a replaced file is
  // complete or not there at all (no partial file is left behind).
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

// Where a write of `path` goes, decided before any byte is made (the CLI checks it before a run). Renaming a temp
// file over something that is not a regular file would replace it by one (as root, /dev/null became a file), so:
//   kStream   the path is this process's standard output or error (/dev/stdout, or the file or pipe they are):
//             the bytes go through that descriptor, at its position, after what was printed to it;
//   kInPlace  a FIFO or a character device: opened and written, it stays what it is;
//   kReplace  a regular file or nothing: a temp file beside
//             `target`, fsync, rename over it. `target` follows symbolic links only while they belong to this
//             user (a link another user planted in a shared directory is replaced itself, not followed, as the
//             kernel's protected_symlinks would have it); the replaced file keeps its permissions, a new one
//             gets 0644.
// Anything else (a directory, a block device, a socket) throws SafetensorsError(kIo) naming it.
struct WriteDestination {
  enum class Kind { kStream, kInPlace, kReplace } kind;
  std::string target;  // kReplace: the path renamed over; kInPlace: the path opened
  int fd = -1;         // kStream: 1 or 2
};
WriteDestination write_destination(const std::filesystem::path& path);

// Rank of a dtype in the safetensors crate's Dtype enum, which lists dtypes by increasing alignment; the
// serializer writes higher ranks first.
int safetensors_dtype_order(DType dtype);

}  // namespace kimirt::io
