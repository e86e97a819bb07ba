#include "kimirt/io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>

#include <fmt/format.h>

namespace kimirt::io {
namespace {

using Kind = SafetensorsError::Kind;

// What open() learns before it parses the header; shared with find_safetensors_file_problems.
struct RawHeader {
  UniqueFd fd;
  FileStamp stamp;  // taken before the first byte is read
  uint64_t file_size = 0;
  uint64_t header_size = 0;
  std::string bytes;
};

RawHeader read_raw_header(const std::filesystem::path& path) {
  const std::string label = path.string();
  RawHeader raw;
  if (const int error = open_regular_file(path.c_str(), raw.fd, raw.file_size)) {
    throw SafetensorsError(
        Kind::kIo, label, "",
        error == EISDIR || error == EINVAL ? "not a regular file" : "cannot open: " + errno_text(error));
  }
  if (const int error = file_stamp(raw.fd.get(), raw.stamp)) {
    throw SafetensorsError(Kind::kIo, label, "", "cannot stat: " + errno_text(error));
  }

  uint8_t prefix[8] = {};
  const uint64_t want = std::min<uint64_t>(8, raw.file_size);
  IoResult got = pread_full(raw.fd.get(), prefix, want, 0);
  if (got.error != 0) throw SafetensorsError(Kind::kIo, label, "", "cannot read: " + errno_text(got.error));
  raw.header_size = check_safetensors_header_length(std::span<const uint8_t>(prefix, got.bytes), raw.file_size, label);

  raw.bytes.resize(raw.header_size);
  got = pread_full(raw.fd.get(), raw.bytes.data(), raw.header_size, 8);
  if (got.error != 0) throw SafetensorsError(Kind::kIo, label, "", "cannot read the header: " + errno_text(got.error));
  if (got.bytes != raw.header_size) {
    throw SafetensorsError(Kind::kTruncated, label, "",
                           fmt::format("file ended after {} of the {} header bytes", got.bytes, raw.header_size));
  }
  return raw;
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  RawHeader raw = read_raw_header(path);
  SafetensorsFile file;
  file.path_ = path;
  file.file_size_ = raw.file_size;
  file.data_offset_ = 8 + raw.header_size;
  file.header_ = parse_safetensors_header(raw.bytes, raw.file_size - file.data_offset_, path.string());
  file.fd_ = std::move(raw.fd);
  file.stamp_ = raw.stamp;

  const auto& tensors = file.header_.tensors;
  file.by_name_.resize(tensors.size());
  for (uint32_t i = 0; i < tensors.size(); ++i) file.by_name_[i] = i;
  std::sort(file.by_name_.begin(), file.by_name_.end(),
            [&](uint32_t a, uint32_t b) { return tensors[a].name < tensors[b].name; });
  return file;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  const auto& tensors = header_.tensors;
  auto it = std::lower_bound(by_name_.begin(), by_name_.end(), name,
                             [&](uint32_t i, std::string_view n) { return tensors[i].name < n; });
  if (it == by_name_.end() || tensors[*it].name != name) return nullptr;
  return &tensors[*it];
}

const TensorInfo& SafetensorsFile::at(std::string_view name) const {
  if (const TensorInfo* info = find(name)) return *info;
  throw SafetensorsError(Kind::kTensorNotFound, path_.string(), std::string(name), "no such tensor in this file");
}

void SafetensorsFile::read(const TensorInfo& info, void* dst) const {
  uint64_t stop = 0;
  if (info.end < info.begin || __builtin_add_overflow(data_offset_, info.end, &stop) || stop > file_size_) {
    throw SafetensorsError(Kind::kInvalidArgument, path_.string(), info.name,
                           fmt::format("data range [{}, {}) is not inside this file", info.begin, info.end));
  }
  read_range(data_offset_ + info.begin, info.nbytes(), dst, info.name);
}

void SafetensorsFile::read_bytes(uint64_t absolute_offset, uint64_t n, void* dst) const {
  uint64_t stop = 0;
  if (__builtin_add_overflow(absolute_offset, n, &stop) || stop > file_size_) {
    throw SafetensorsError(Kind::kInvalidArgument, path_.string(), "",
                           fmt::format("bytes [{}, {}+{}) are not inside the {}-byte file", absolute_offset,
                                       absolute_offset, n, file_size_));
  }
  read_range(absolute_offset, n, dst, "");
}

Tensor SafetensorsFile::read_tensor(std::string_view name) const {
  const TensorInfo& info = at(name);
  Tensor tensor(info.dtype, info.shape);
  read(info, tensor.data());
  return tensor;
}

void SafetensorsFile::read_range(uint64_t offset, uint64_t n, void* dst, std::string_view tensor) const {
  const IoResult got = pread_full(fd_.get(), dst, n, offset);
  if (got.error != 0) {
    throw SafetensorsError(Kind::kIo, path_.string(), std::string(tensor),
                           fmt::format("read of bytes [{}, {}) failed: {}", offset, offset + n, errno_text(got.error)));
  }
  if (got.bytes != n) {
    throw SafetensorsError(Kind::kTruncated, path_.string(), std::string(tensor),
                           fmt::format("file ended at byte {} while reading bytes [{}, {}): was it truncated after "
                                       "it was opened?",
                                       offset + got.bytes, offset, offset + n));
  }
}

void SafetensorsFile::check_unchanged() const {
  FileStamp now;
  if (const int error = file_stamp(fd_.get(), now)) {
    throw SafetensorsError(Kind::kIo, path_.string(), "", "cannot stat: " + errno_text(error));
  }
  if (now == stamp_) return;
  const auto time = [](int64_t sec, int64_t nsec) { return fmt::format("{}.{:09}", sec, nsec); };
  throw SafetensorsError(
      Kind::kChanged, path_.string(), "",
      fmt::format("the file changed while it was read (size {} -> {} bytes, modified {} -> {}, status changed {} -> "
                  "{}): the bytes read may mix its old and new contents; load it again once it is written",
                  stamp_.size, now.size, time(stamp_.mtime_sec, stamp_.mtime_nsec), time(now.mtime_sec, now.mtime_nsec),
                  time(stamp_.ctime_sec, stamp_.ctime_nsec), time(now.ctime_sec, now.ctime_nsec)));
}

std::vector<SafetensorsError> find_safetensors_file_problems(const std::filesystem::path& path) {
  RawHeader raw;
  try {
    raw = read_raw_header(path);
  } catch (const SafetensorsError& e) {
    return {e};
  }
  return find_safetensors_header_problems(raw.bytes, raw.file_size - 8 - raw.header_size, path.string());
}

}  // namespace kimirt::io
