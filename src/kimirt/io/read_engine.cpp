#include "kimirt/io/read_engine.h"

#include <fcntl.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include "kimirt/base/error.h"
#include "kimirt/base/start_threads.h"
#include "kimirt/base/timer.h"

namespace kimirt::io {
namespace {

constexpr uint64_t kPage = 4096;

uint64_t round_up(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

class HostStagingAllocator final : public StagingAllocator {
 public:
  void* allocate(uint64_t bytes) override {
    void* p = std::aligned_alloc(kPage, round_up(bytes, kPage));
    KIMIRT_CHECK(p != nullptr, "out of host memory allocating a {}-byte staging buffer", bytes);
    return p;
  }
  void deallocate(void* data, uint64_t) noexcept override { std::free(data); }
};

// Buffers allocated on demand up to a fixed count. A buffer an asynchronous sink may still read from is
// "dirty": it is fenced before reuse, and the ring prefers clean or new buffers so that fences rarely wait.
class StagingRing {
 public:
  StagingRing(StagingAllocator& allocator, ReadSink& sink, uint64_t buffer_bytes, int max_buffers)
      : allocator_(allocator), sink_(sink), buffer_bytes_(buffer_bytes), max_buffers_(max_buffers) {
    buffers_.reserve(static_cast<size_t>(std::max(max_buffers, 0)));
  }
  ~StagingRing() {
    for (auto* b : buffers_) allocator_.deallocate(b, buffer_bytes_);
  }
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;

  struct Buffer {
    int slot;
    uint8_t* data;
  };
  // A buffer to fill, or nullopt once `stop` is set. Its address is read under the lock: another thread's
  // acquire may be growing the table at the same time.
  std::optional<Buffer> acquire(const std::atomic<bool>& stop) {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      if (stop.load()) return std::nullopt;
      if (!clean_.empty()) {
        const int slot = clean_.back();
        clean_.pop_back();
        return Buffer{slot, buffers_[static_cast<size_t>(slot)]};
      }
      if (static_cast<int>(buffers_.size()) < max_buffers_) {
        buffers_.push_back(static_cast<uint8_t*>(allocator_.allocate(buffer_bytes_)));
        return Buffer{static_cast<int>(buffers_.size()) - 1, buffers_.back()};
      }
      if (!dirty_.empty()) {
        const int slot = dirty_.front();  // the oldest: its copies have had the longest to finish
        dirty_.pop_front();
        uint8_t* data = buffers_[static_cast<size_t>(slot)];
        lock.unlock();
        sink_.fence(slot);
        return Buffer{slot, data};
      }
      wake_.wait(lock);
    }
  }

  void release(int slot) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (sink_.asynchronous()) {
        dirty_.push_back(slot);
      } else {
        clean_.push_back(slot);
      }
    }
    wake_.notify_one();
  }

  // Wakes every waiter (after `stop` was set).
  void interrupt() {
    { std::lock_guard<std::mutex> lock(mutex_); }
    wake_.notify_all();
  }

  // Waits for the asynchronous work still reading any buffer, so that they can be freed.
  void fence_all() {
    std::lock_guard<std::mutex> lock(mutex_);
    while (!dirty_.empty()) {
      sink_.fence(dirty_.front());
      clean_.push_back(dirty_.front());
      dirty_.pop_front();
    }
  }

  uint64_t peak_bytes() const { return buffers_.size() * buffer_bytes_; }

 private:
  StagingAllocator& allocator_;
  ReadSink& sink_;
  const uint64_t buffer_bytes_;
  const int max_buffers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<uint8_t*> buffers_;  // index = slot; grows under mutex_ (reserved: never reallocated)
  std::vector<int> clean_;
  std::deque<int> dirty_;
};

struct PieceRef {
  uint64_t id;
  uint64_t range_offset;
  uint64_t buffer_offset;
  uint64_t size;
};

struct Read {
  uint64_t offset = 0;
  uint64_t length = 0;
  std::vector<PieceRef> pieces;
};

// Walks a file's ranges and cuts them into preads of at most `buffer` bytes, merging ranges whose gap is at
// most `max_gap` and splitting ranges longer than a buffer.
class ReadCursor {
 public:
  ReadCursor(const std::vector<ByteRange>& ranges, uint64_t buffer, uint64_t max_gap)
      : ranges_(ranges), buffer_(buffer), max_gap_(max_gap) {
    skip_empty();
  }

  bool next(Read& out) {
    if (i_ == ranges_.size()) return false;
    out.offset = ranges_[i_].offset + done_;
    out.pieces.clear();
    uint64_t end = out.offset;
    while (i_ < ranges_.size()) {
      const ByteRange& r = ranges_[i_];
      const uint64_t pos = r.offset + done_;
      if (pos != end && (pos - end > max_gap_ || pos - out.offset >= buffer_)) break;
      const uint64_t take = std::min(r.length - done_, buffer_ - (pos - out.offset));
      out.pieces.push_back({r.id, done_, pos - out.offset, take});
      end = pos + take;
      done_ += take;
      if (done_ == r.length) {
        ++i_;
        done_ = 0;
        skip_empty();
      }
      if (end - out.offset == buffer_) break;
    }
    out.length = end - out.offset;
    return true;
  }

 private:
  // An empty range has no bytes to deliver; the caller accounts for it without the engine.
  void skip_empty() {
    while (i_ < ranges_.size() && ranges_[i_].length == 0) ++i_;
  }

  const std::vector<ByteRange>& ranges_;
  const uint64_t buffer_;
  const uint64_t max_gap_;
  size_t i_ = 0;
  uint64_t done_ = 0;
};

void check_ranges(const FileRanges& f) {
  KIMIRT_CHECK(f.file != nullptr, "read engine: a file entry without a file");
  uint64_t end = 0;
  for (const auto& r : f.ranges) {
    uint64_t stop = 0;
    KIMIRT_CHECK(!__builtin_add_overflow(r.offset, r.length, &stop) && stop <= f.file->file_size(),
                 "{}: range [{}, {}+{}) lies outside the {}-byte file", f.file->path().string(), r.offset, r.offset,
                 r.length, f.file->file_size());
    KIMIRT_CHECK(r.offset >= end, "{}: byte ranges overlap or are out of order at offset {}", f.file->path().string(),
                 r.offset);
    end = stop;
  }
}

void advise(const SafetensorsFile& file, uint64_t offset, uint64_t length, int advice) {
  // Advice only: a failure costs speed or page cache, never correctness.
  (void)::posix_fadvise(file.fd(), static_cast<off_t>(offset), static_cast<off_t>(length), advice);
}

class Engine {
 public:
  Engine(std::span<const FileRanges> files, ReadSink& sink, const ReadOptions& options, uint64_t buffer_bytes,
         int max_buffers)
      : files_(files),
        sink_(sink),
        options_(options),
        buffer_bytes_(buffer_bytes),
        ring_(options.allocator ? *options.allocator : host_staging_allocator(), sink, buffer_bytes, max_buffers) {}

  ReadStats run(int threads) {
    const Timer timer;
    std::vector<std::thread> workers;
    try {
      workers = start_threads(
          static_cast<size_t>(threads), "read engine", [this](size_t) { work(); },
          [this] {
            stop_.store(true);
            ring_.interrupt();
          });
    } catch (...) {
      fail_with(std::current_exception());  // the workers that did start are joined already
    }
    for (auto& w : workers) w.join();
    try {
      ring_.fence_all();  // nothing may still read a buffer when the ring frees it
    } catch (...) {
      if (!error_) error_ = std::current_exception();  // otherwise the first error is the one to report
    }
    if (error_) std::rethrow_exception(error_);
    ReadStats stats;
    stats.files = files_.size();
    stats.preads = preads_.load();
    stats.bytes_read = bytes_read_.load();
    stats.range_bytes = range_bytes_.load();
    stats.buffer_bytes = buffer_bytes_;
    stats.peak_staging_bytes = ring_.peak_bytes();
    stats.threads = threads;
    stats.seconds = timer.seconds();
    return stats;
  }

 private:
  void work() {
    for (;;) {
      const size_t f = next_file_.fetch_add(1);
      if (f >= files_.size() || stop_.load()) return;
      const FileRanges& file = files_[f];
      if (file.ranges.empty()) continue;
      try {
        read_file(file);
      } catch (...) {
        fail_with(std::current_exception());
      }
      if (options_.drop_page_cache) advise(*file.file, 0, 0, POSIX_FADV_DONTNEED);
      if (stop_.load()) return;
    }
  }

  void read_file(const FileRanges& file) {
    const SafetensorsFile& sf = *file.file;
    advise(sf, 0, 0, POSIX_FADV_SEQUENTIAL);
    ReadCursor cursor(file.ranges, buffer_bytes_, options_.max_gap_bytes);
    const uint64_t file_end = file.ranges.back().offset + file.ranges.back().length;
    uint64_t advised = 0;  // WILLNEED has been issued for the file's bytes before this offset
    Read read, next;
    bool have = cursor.next(read);
    while (have) {
      // Keep the kernel `read_ahead_bytes` ahead of this read (matters cold, costs nothing warm).
      const uint64_t want = std::min(file_end, read.offset + read.length + options_.read_ahead_bytes);
      const uint64_t from = std::max(advised, read.offset);
      // In steps of a quarter window (not one call per read), and once more for the file's tail.
      if (want > from && (advised < read.offset || want - from >= options_.read_ahead_bytes / 4 || want == file_end)) {
        advise(sf, from, want - from, POSIX_FADV_WILLNEED);
        advised = want;
      }
      const std::optional<StagingRing::Buffer> staged = ring_.acquire(stop_);
      if (!staged) return;
      const int slot = staged->slot;
      uint8_t* buffer = staged->data;
      try {
        read_named(sf, read, buffer);
        have = cursor.next(next);
        ++preads_;
        bytes_read_ += read.length;
        for (const auto& p : read.pieces) {
          sink_.consume(Piece{p.id, p.range_offset, buffer + p.buffer_offset, p.size, slot});
          range_bytes_ += p.size;
        }
      } catch (...) {
        ring_.release(slot);
        throw;
      }
      ring_.release(slot);
      if (options_.progress) options_.progress->add(read.length);
      std::swap(read, next);
      if (stop_.load()) return;
    }
    // Bytes of a file rewritten in place meanwhile may mix two versions: refused, naming the file.
    sf.check_unchanged();
  }

  // A failed read (the file shrank, an I/O error) names the tensor whose bytes it was reading, as its owner
  // calls it: the engine itself only knows byte ranges.
  void read_named(const SafetensorsFile& sf, const Read& read, uint8_t* buffer) {
    try {
      sf.read_bytes(read.offset, read.length, buffer);
    } catch (const SafetensorsError& e) {
      if (!e.tensor().empty() || read.pieces.empty()) throw;
      std::string name = sink_.describe(read.pieces.front().id);
      if (name.empty()) throw;
      if (read.pieces.size() > 1) name += fmt::format(" (and {} more ranges of this read)", read.pieces.size() - 1);
      throw e.naming(std::move(name));
    }
  }

  void fail_with(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = e;
    }
    stop_.store(true);
    ring_.interrupt();
  }

  std::span<const FileRanges> files_;
  ReadSink& sink_;
  const ReadOptions& options_;
  const uint64_t buffer_bytes_;
  StagingRing ring_;
  std::atomic<size_t> next_file_{0};
  std::atomic<bool> stop_{false};
  std::mutex error_mutex_;
  std::exception_ptr error_;
  std::atomic<uint64_t> preads_{0};
  std::atomic<uint64_t> bytes_read_{0};
  std::atomic<uint64_t> range_bytes_{0};
};

}  // namespace

StagingAllocator& host_staging_allocator() {
  static HostStagingAllocator allocator;
  return allocator;
}

ReadStats read_ranges(std::span<const FileRanges> files, ReadSink& sink, const ReadOptions& options) {
  KIMIRT_CHECK(options.staging_bytes >= kPage, "staging memory of {} bytes is too small (at least {})",
               options.staging_bytes, kPage);
  KIMIRT_CHECK(options.io_threads >= 1, "io_threads must be at least 1, got {}", options.io_threads);
  KIMIRT_CHECK(options.max_read_bytes >= kPage, "max_read_bytes of {} is too small (at least {})",
               options.max_read_bytes, kPage);
  uint64_t widest = 0;  // the longest single read any file could need
  size_t busy_files = 0;
  for (const auto& f : files) {
    check_ranges(f);
    if (f.ranges.empty()) continue;
    ++busy_files;
    widest = std::max(widest, f.ranges.back().offset + f.ranges.back().length - f.ranges.front().offset);
  }
  // An asynchronous sink keeps buffers busy after consume(), so it gets two per thread to overlap with.
  const uint64_t per_thread = sink.asynchronous() ? 2 : 1;
  const int threads = static_cast<int>(std::clamp<uint64_t>(busy_files, 1, static_cast<uint64_t>(options.io_threads)));
  uint64_t buffer = std::min(options.max_read_bytes, options.staging_bytes / (per_thread * threads));
  buffer = std::max(kPage, buffer / kPage * kPage);
  buffer = std::min(buffer, std::max(kPage, round_up(widest, kPage)));
  const int max_buffers = static_cast<int>(std::min<uint64_t>(options.staging_bytes / buffer, 1 << 20));
  Engine engine(files, sink, options, buffer, max_buffers);
  return engine.run(threads);
}

}  // namespace kimirt::io
