// A safetensors file opened for reading: the header is validated in full at open (safetensors_header.h),
// the descriptor is kept, and tensor bytes are read with pread on demand, never by reading or mapping the
// whole file (a multi-hundred-GB checkpoint must not become resident page cache we cannot drop). The
// const read functions may be called from several threads at once (pread has no shared file position).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "kimirt/io/io_error.h"
#include "kimirt/io/posix_file.h"
#include "kimirt/io/safetensors_header.h"
#include "kimirt/tensor/tensor.h"

namespace kimirt::io {

class SafetensorsFile {
 public:
  // Opens and validates; throws SafetensorsError naming the file (and tensor) on any problem.
  static SafetensorsFile open(const std::filesystem::path& path);

  SafetensorsFile(SafetensorsFile&&) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept = default;

  const std::filesystem::path& path() const { return path_; }
  uint64_t file_size() const { return file_size_; }
  uint64_t header_size() const { return data_offset_ - 8; }
  uint64_t data_offset() const { return data_offset_; }  // 8 + N: where data_offsets count from

  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }  // in data order
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const TensorInfo* find(std::string_view name) const;  // nullptr when absent
  const TensorInfo& at(std::string_view name) const;    // throws kTensorNotFound naming file and tensor

  uint64_t absolute_offset(const TensorInfo& info) const { return data_offset_ + info.begin; }

  // Reads the tensor's bytes into dst (info.nbytes() bytes). `info` must describe a range of this file.
  void read(const TensorInfo& info, void* dst) const;
  // Reads n bytes at an absolute file offset: for the loader's large reads spanning several tensors.
  void read_bytes(uint64_t absolute_offset, uint64_t n, void* dst) const;
  Tensor read_tensor(std::string_view name) const;

  // For the loader (posix_fadvise, a second O_DIRECT descriptor on path()). Owned by this object.
  int fd() const { return fd_.get(); }

  // Throws SafetensorsError kChanged, naming the file, when its stamp (io/posix_file.h: identity, size, modification
  // and status change times) is no longer what it was when open() read its header: the file was rewritten in place,
  // so bytes read from it may mix old and new contents. Readers call it after their last read of the file.
  void check_unchanged() const;

 private:
  SafetensorsFile() = default;
  void read_range(uint64_t offset, uint64_t n, void* dst, std::string_view tensor) const;

  std::filesystem::path path_;
  UniqueFd fd_;
  FileStamp stamp_;
  uint64_t file_size_ = 0;
  uint64_t data_offset_ = 0;
  SafetensorsHeader header_;
  std::vector<uint32_t> by_name_;  // indices into header_.tensors, sorted by name
};

// Every problem of one file, for tools that must report them all (an unreadable or truncated file gives
// one). Empty when SafetensorsFile::open would succeed.
std::vector<SafetensorsError> find_safetensors_file_problems(const std::filesystem::path& path);

}  // namespace kimirt::io
