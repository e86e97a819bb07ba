// Thin POSIX helpers shared by the reader and the writer: an owning file descriptor and read/write loops
// that survive short transfers and EINTR. They report errno rather than throwing, so each caller can
// raise its own error naming its file and tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kimirt::io {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = other.release();
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset();

 private:
  int fd_ = -1;
};

struct IoResult {
  uint64_t bytes = 0;  // transferred before EOF or the error
  int error = 0;       // errno, 0 when none
};

// Reads n bytes at offset, looping over short reads and EINTR. bytes < n with error == 0 means EOF.
IoResult pread_full(int fd, void* dst, uint64_t n, uint64_t offset);
// Writes all n bytes at the current position, looping over short writes and EINTR.
IoResult write_full(int fd, const void* src, uint64_t n);

// Opens `path` for reading when it is a regular file: 0 and the descriptor and its size, or an errno (EISDIR for
// a directory, EINVAL for any other kind). A FIFO or a device is refused without blocking (a FIFO without a
// writer blocks a plain open forever), since the open itself does not wait (O_NONBLOCK, cleared afterwards).
int open_regular_file(const char* path, UniqueFd& fd, uint64_t& size);

// What tells a file's contents apart from outside: its identity, size and last modification. A file rewritten in
// place keeps its inode, and its size too when every tensor keeps its shape, but not its modification time (to the
// file system's granularity: nanoseconds on ext4 and XFS, a second or two on some others). The status change time
// too: a copy that puts the old modification time back (touch -d, rsync -a --inplace) still moves it, and no
// program can set it (a chmod or a new hard link moves it as well: such a load is refused, to be run again).
struct FileStamp {
  uint64_t device = 0, inode = 0, size = 0;
  int64_t mtime_sec = 0, mtime_nsec = 0;
  int64_t ctime_sec = 0, ctime_nsec = 0;
  bool operator==(const FileStamp&) const = default;
};
// The stamp of an open descriptor (fstat): 0, or an errno.
int file_stamp(int fd, FileStamp& stamp);

// Reads a whole (small) regular file into `out`. Returns 0, an errno as open_regular_file does, or EFBIG when it
// has more than max_bytes.
int read_whole_file(const char* path, uint64_t max_bytes, std::string& out);

// strerror text for an errno value (thread-safe).
std::string errno_text(int error);
// The text for an error of open_regular_file or read_whole_file: EINVAL there means "not a regular file", and
// EFBIG from read_whole_file(max_bytes) that the file is over that limit (not a file system's "File too large").
std::string file_error_text(int error, uint64_t max_bytes = 0);

}  // namespace kimirt::io
