#include "kimirt/io/posix_file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include <fmt/format.h>

namespace kimirt::io {
namespace {

// Linux moves at most 0x7ffff000 bytes per call; asking for 1 GiB keeps each call well inside that.
constexpr uint64_t kMaxChunk = uint64_t{1} << 30;

}  // namespace

void UniqueFd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

IoResult pread_full(int fd, void* dst, uint64_t n, uint64_t offset) {
  IoResult result;
  auto* out = static_cast<uint8_t*>(dst);
  while (result.bytes < n) {
    const uint64_t want = std::min(n - result.bytes, kMaxChunk);
    const ssize_t got = ::pread(fd, out + result.bytes, want, static_cast<off_t>(offset + result.bytes));
    if (got < 0) {
      if (errno == EINTR) continue;
      result.error = errno;
      return result;
    }
    if (got == 0) return result;  // EOF
    result.bytes += static_cast<uint64_t>(got);
  }
  return result;
}

IoResult write_full(int fd, const void* src, uint64_t n) {
  IoResult result;
  const auto* in = static_cast<const uint8_t*>(src);
  while (result.bytes < n) {
    const uint64_t want = std::min(n - result.bytes, kMaxChunk);
    const ssize_t put = ::write(fd, in + result.bytes, want);
    if (put < 0) {
      if (errno == EINTR) continue;
      result.error = errno;
      return result;
    }
    result.bytes += static_cast<uint64_t>(put);
  }
  return result;
}

int open_regular_file(const char* path, UniqueFd& fd, uint64_t& size) {
  UniqueFd f(::open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!f.valid()) return errno;
  struct stat st {};
  if (::fstat(f.get(), &st) != 0) return errno;
  if (!S_ISREG(st.st_mode)) return S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
  const int flags = ::fcntl(f.get(), F_GETFL);
  if (flags < 0 || ::fcntl(f.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) return errno;
  size = static_cast<uint64_t>(st.st_size);
  fd = std::move(f);
  return 0;
}

int file_stamp(int fd, FileStamp& stamp) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return errno;
  stamp.device = static_cast<uint64_t>(st.st_dev);
  stamp.inode = static_cast<uint64_t>(st.st_ino);
  stamp.size = static_cast<uint64_t>(st.st_size);
  stamp.mtime_sec = static_cast<int64_t>(st.st_mtim.tv_sec);
  stamp.mtime_nsec = static_cast<int64_t>(st.st_mtim.tv_nsec);
  stamp.ctime_sec = static_cast<int64_t>(st.st_ctim.tv_sec);
  stamp.ctime_nsec = static_cast<int64_t>(st.st_ctim.tv_nsec);
  return 0;
}

int read_whole_file(const char* path, uint64_t max_bytes, std::string& out) {
  UniqueFd fd;
  uint64_t size = 0;
  if (const int error = open_regular_file(path, fd, size)) return error;
  if (size > max_bytes) return EFBIG;
  out.resize(size);
  const IoResult r = pread_full(fd.get(), out.data(), size, 0);
  if (r.error != 0) return r.error;
  out.resize(r.bytes);  // a file that shrank meanwhile is read as it now is
  return 0;
}

std::string errno_text(int error) {
  char buffer[256];
  // GNU strerror_r may return a static string instead of filling the buffer.
  const char* text = ::strerror_r(error, buffer, sizeof(buffer));
  return text;
}

std::string file_error_text(int error, uint64_t max_bytes) {
  if (error == EINVAL) return "not a regular file";
  if (error == EFBIG && max_bytes > 0) {
    return fmt::format("larger than the {} MiB limit for this file", max_bytes >> 20);
  }
  return errno_text(error);
}

}  // namespace kimirt::io
