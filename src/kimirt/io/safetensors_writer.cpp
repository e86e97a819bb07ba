#include "kimirt/io/safetensors_writer.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "kimirt/base/strict_json.h"
#include "kimirt/io/posix_file.h"
#include "kimirt/io/safetensors_header.h"

namespace kimirt::io {
namespace {

using Kind = SafetensorsError::Kind;
constexpr std::string_view kWriterLabel = "safetensors writer";

[[noreturn]] void invalid(const std::string& name, std::string_view detail) {
  throw SafetensorsError(Kind::kInvalidArgument, std::string(kWriterLabel), name, detail);
}

// Bytes of dtype x shape under the reader's rules (no negative dimension, no overflow even past a zero
// dimension, whole bytes), so that whatever the writer accepts the reader accepts back.
uint64_t checked_bytes(const std::string& name, DType dtype, const Shape& shape) {
  int64_t numel = 1;
  int64_t extent = 1;
  for (int64_t d : shape) {
    if (d < 0) invalid(name, fmt::format("negative dimension in shape {}", shape_str(shape)));
    bool overflow = __builtin_mul_overflow(numel, d, &numel);
    if (d != 0) overflow |= __builtin_mul_overflow(extent, d, &extent);
    if (overflow) invalid(name, fmt::format("element count of shape {} overflows", shape_str(shape)));
  }
  uint64_t bits = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(extent), static_cast<uint64_t>(dtype_bits(dtype)), &bits)) {
    invalid(name, fmt::format("byte size of {} {} overflows", dtype_name(dtype), shape_str(shape)));
  }
  auto bytes = dtype_bytes(dtype, static_cast<uint64_t>(numel));
  if (!bytes) invalid(name, fmt::format("{} {} is not a whole number of bytes", dtype_name(dtype), shape_str(shape)));
  return *bytes;
}

// Copies a strided view into row-major order, one element at a time (writer input is small or already
// contiguous; this is not a hot path).
void gather(const TensorView& view, uint8_t* out) {
  const size_t elem = static_cast<size_t>(dtype_bits(view.dtype()) / 8);
  const int rank = view.rank();
  std::vector<int64_t> index(static_cast<size_t>(rank), 0);
  const int64_t numel = view.numel();
  const auto* base = static_cast<const uint8_t*>(view.data());
  for (int64_t n = 0; n < numel; ++n) {
    int64_t offset = 0;
    for (int d = 0; d < rank; ++d) offset += index[static_cast<size_t>(d)] * view.strides()[static_cast<size_t>(d)];
    std::memcpy(out + static_cast<size_t>(n) * elem, base + offset * static_cast<int64_t>(elem), elem);
    for (int d = rank - 1; d >= 0; --d) {
      if (++index[static_cast<size_t>(d)] < view.shape()[static_cast<size_t>(d)]) break;
      index[static_cast<size_t>(d)] = 0;
    }
  }
}

// Removes the temp file unless the write got as far as the rename.
class TempFile {
 public:
  explicit TempFile(std::string path) : path_(std::move(path)) {}
  ~TempFile() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  void keep() { path_.clear(); }

 private:
  std::string path_;
};

}  // namespace

int safetensors_dtype_order(DType dtype) {
  // BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ, I16, U16, F16,
  // BF16, I32, U32, F32, C64, F64, I64, U64 (safetensors 0.6+; spec §4.2).
  switch (dtype) {
    case DType::kBool:
      return 0;
    case DType::kF4:
      return 1;
    case DType::kU8:
      return 4;
    case DType::kI8:
      return 5;
    case DType::kF8E5M2:
      return 6;
    case DType::kF8E4M3:
      return 7;
    case DType::kF8E8M0:
      return 8;
    case DType::kI16:
      return 11;
    case DType::kU16:
      return 12;
    case DType::kF16:
      return 13;
    case DType::kBF16:
      return 14;
    case DType::kI32:
      return 15;
    case DType::kU32:
      return 16;
    case DType::kF32:
      return 17;
    case DType::kF64:
      return 19;
    case DType::kI64:
      return 20;
    case DType::kU64:
      return 21;
  }
  KIMIRT_ASSERT(false);
}

void SafetensorsWriter::add(std::string name, DType dtype, Shape shape, std::span<const uint8_t> bytes) {
  if (name.empty()) invalid(name, "empty tensor name");
  if (name == "__metadata__") invalid(name, "the name __metadata__ is reserved");
  if (find_invalid_utf8(name)) invalid(name, "tensor name is not valid UTF-8");
  if (names_.count(name) != 0) invalid(name, "added twice");
  const uint64_t want = checked_bytes(name, dtype, shape);
  if (bytes.size() != want) {
    invalid(name,
            fmt::format("{} {} takes {} bytes, given {}", dtype_name(dtype), shape_str(shape), want, bytes.size()));
  }
  names_.insert(name);
  entries_.push_back(Entry{std::move(name), dtype, std::move(shape), {bytes.begin(), bytes.end()}});
}

void SafetensorsWriter::add(std::string name, const TensorView& view) {
  const uint64_t n = checked_bytes(name, view.dtype(), view.shape());
  if (view.is_contiguous() || n == 0) {
    add(std::move(name), view.dtype(), view.shape(),
        std::span<const uint8_t>(static_cast<const uint8_t*>(view.data()), n));
    return;
  }
  std::vector<uint8_t> packed(n);
  gather(view, packed.data());
  add(std::move(name), view.dtype(), view.shape(), packed);
}

void SafetensorsWriter::set_metadata(std::string key, std::string value) {
  if (find_invalid_utf8(key) || find_invalid_utf8(value)) invalid("", "__metadata__ strings must be valid UTF-8");
  metadata_[std::move(key)] = std::move(value);
}

std::vector<const SafetensorsWriter::Entry*> SafetensorsWriter::ordered() const {
  std::vector<const Entry*> order;
  for (const Entry& e : entries_) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    const int ra = safetensors_dtype_order(a->dtype), rb = safetensors_dtype_order(b->dtype);
    if (ra != rb) return ra > rb;
    return a->name < b->name;
  });
  return order;
}

std::string SafetensorsWriter::header() const {
  std::string out = "{";
  if (!metadata_.empty()) out += "\"__metadata__\":" + nlohmann::json(metadata_).dump();
  uint64_t offset = 0;
  for (const Entry* e : ordered()) {
    if (out.size() > 1) out += ',';
    const uint64_t end = offset + e->bytes.size();
    out += fmt::format("{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                       nlohmann::json(e->name).dump(), dtype_name(e->dtype), fmt::join(e->shape, ","), offset, end);
    offset = end;
  }
  out += '}';
  out.append((8 - out.size() % 8) % 8, ' ');
  if (out.size() > kMaxSafetensorsHeaderSize) {
    invalid("",
            fmt::format("the header would take {} bytes, over the limit of {}", out.size(), kMaxSafetensorsHeaderSize));
  }
  return out;
}

std::vector<uint8_t> SafetensorsWriter::serialize() const {
  const std::string head = header();
  const auto order = ordered();
  size_t total = 8 + head.size();
  for (const Entry* e : order) total += e->bytes.size();
  std::vector<uint8_t> file(total);
  const uint64_t n = head.size();
  for (size_t i = 0; i < 8; ++i) file[i] = static_cast<uint8_t>(n >> (8 * i));
  size_t at = 8;
  std::memcpy(file.data() + at, head.data(), head.size());
  at += head.size();
  for (const Entry* e : order) {
    if (!e->bytes.empty()) std::memcpy(file.data() + at, e->bytes.data(), e->bytes.size());
    at += e->bytes.size();
  }
  return file;
}

WriteDestination write_destination(const std::filesystem::path& path) {
  const std::string label = path.string();
  auto fail = [&](std::string what) { throw SafetensorsError(Kind::kIo, label, "", std::move(what)); };
  struct stat st {};
  if (::stat(label.c_str(), &st) == 0) {
    for (const int fd : {1, 2}) {
      struct stat s {};
      if (::fstat(fd, &s) == 0 && s.st_dev == st.st_dev && s.st_ino == st.st_ino) {
        return {WriteDestination::Kind::kStream, label, fd};
      }
    }
    if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)) return {WriteDestination::Kind::kInPlace, label, -1};
    if (S_ISDIR(st.st_mode)) fail("is a directory; give the file to write");
    if (!S_ISREG(st.st_mode)) {
      fail(S_ISBLK(st.st_mode) ? "is a block device: give a file to write"
                               : "is neither a file, a FIFO nor a character device: give a file to write");
    }
  }
  // The user's own symbolic links are followed, hop by hop (a dangling one names the file to create); the first
  // link owned by someone else is where the rename goes.
  std::filesystem::path target = path;
  for (int hop = 0; hop < 40; ++hop) {
    struct stat ls {};
    if (::lstat(target.c_str(), &ls) != 0 || !S_ISLNK(ls.st_mode) || ls.st_uid != ::geteuid()) break;
    std::error_code ec;
    const std::filesystem::path next = std::filesystem::read_symlink(target, ec);
    if (ec) break;
    target = next.is_absolute() ? next : target.parent_path() / next;
  }
  return {WriteDestination::Kind::kReplace, target.string(), -1};
}

void SafetensorsWriter::write(const std::filesystem::path& path) const {
  const std::string label = path.string();
  const std::string head = header();
  auto fail_io = [&](std::string_view what, int error) {
    throw SafetensorsError(Kind::kIo, label, "", fmt::format("{}: {}", what, errno_text(error)));
  };
  auto write_all = [&](int fd) {
    uint8_t prefix[8];
    const uint64_t n = head.size();
    for (int i = 0; i < 8; ++i) prefix[i] = static_cast<uint8_t>(n >> (8 * i));
    IoResult r = write_full(fd, prefix, sizeof(prefix));
    if (r.error == 0) r = write_full(fd, head.data(), head.size());
    for (const Entry* e : ordered()) {
      if (r.error != 0) break;
      r = write_full(fd, e->bytes.data(), e->bytes.size());
    }
    if (r.error != 0) fail_io("write failed", r.error);
  };

  const WriteDestination to = write_destination(path);
  if (to.kind == WriteDestination::Kind::kStream) {
    std::fflush(to.fd == 1 ? stdout : stderr);  // what was printed first comes first
    write_all(to.fd);
    return;
  }
  if (to.kind == WriteDestination::Kind::kInPlace) {
    UniqueFd fd(::open(to.target.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd.valid()) fail_io("cannot open it for writing", errno);
    write_all(fd.get());
    if (::close(fd.release()) != 0) fail_io("close failed", errno);
    return;
  }
  struct stat existing {};
  const bool replaces = ::stat(to.target.c_str(), &existing) == 0 && S_ISREG(existing.st_mode);
  std::string temp_name = to.target + ".tmp.XXXXXX";
  UniqueFd fd(::mkstemp(temp_name.data()));
  if (!fd.valid()) fail_io("cannot create a temp file beside it", errno);
  TempFile temp(temp_name);
  // mkstemp creates 0600: a new checkpoint is meant to be shared like any file written with open(), a replaced
  // file keeps the permissions its owner gave it.
  if (::fchmod(fd.get(), replaces ? (existing.st_mode & 07777) : 0644) != 0) fail_io("cannot set permissions", errno);
  write_all(fd.get());
  if (::fsync(fd.get()) != 0) fail_io("fsync failed", errno);
  if (::close(fd.release()) != 0) fail_io("close failed", errno);
  if (::rename(temp_name.c_str(), to.target.c_str()) != 0) fail_io("cannot rename the temp file into place", errno);
  temp.keep();
}

}  // namespace kimirt::io
