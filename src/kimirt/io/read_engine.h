// The read engine: reads lists of byte ranges from files with large sequential preads into a bounded ring of
// staging buffers, several files at once, one I/O thread per file at a time, and hands the bytes to a sink
// piece by piece. It knows files and byte ranges, not tensors: the model layer's loader decides which ranges
// to read and where their bytes go.
//
// Memory is bounded by ReadOptions::staging_bytes whatever the file sizes: buffers are allocated on demand,
// never more than staging_bytes / buffer size of them, and a range longer than one buffer arrives in
// several pieces. Each file is read front to back (POSIX_FADV_SEQUENTIAL, the next read announced with
// WILLNEED while the current one is consumed) and its page cache is released with POSIX_FADV_DONTNEED when
// the engine is done with it, so that a checkpoint larger than RAM does not stay resident
// (spec checkpoints-and-loading §0.2, §1.6).
//
// Staging memory comes from a StagingAllocator, so that a CUDA backend can supply pinned memory
// (cudaHostAlloc) and upload from it asynchronously: an asynchronous sink is asked to fence a buffer before
// the engine fills it again.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kimirt/base/progress.h"
#include "kimirt/io/safetensors.h"

namespace kimirt::io {

class StagingAllocator {
 public:
  virtual ~StagingAllocator() = default;
  // `bytes` of memory aligned to at least 4096 bytes; throws kimirt::Error when there is none.
  virtual void* allocate(uint64_t bytes) = 0;
  virtual void deallocate(void* data, uint64_t bytes) noexcept = 0;
};

// Page-aligned pageable host memory: the staging memory without CUDA.
StagingAllocator& host_staging_allocator();

// Bytes [offset, offset + length) of a file (absolute offsets), tagged with the caller's id.
struct ByteRange {
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t id = 0;
};

struct FileRanges {
  const SafetensorsFile* file = nullptr;
  std::vector<ByteRange> ranges;  // ascending offsets, not overlapping
};

// Bytes [range_offset, range_offset + size) of range `id`, at `data` in staging buffer `staging_slot`.
struct Piece {
  uint64_t id = 0;
  uint64_t range_offset = 0;
  const uint8_t* data = nullptr;
  uint64_t size = 0;
  int staging_slot = 0;
};

class ReadSink {
 public:
  virtual ~ReadSink() = default;
  // Called from the I/O threads, several at once for different files. The pieces of one range arrive in
  // order, from one thread. `piece.data` may be reused as soon as consume() returns, unless asynchronous().
  virtual void consume(const Piece& piece) = 0;
  // True when consume() may leave work behind that still reads the staging memory (asynchronous device
  // copies); the engine then calls fence(slot) before it reuses or frees that buffer.
  virtual bool asynchronous() const { return false; }
  virtual void fence(int staging_slot) { (void)staging_slot; }
  // What piece `id` belongs to (a tensor's name), for an error met while reading its bytes; empty: unknown.
  virtual std::string describe(uint64_t id) const {
    (void)id;
    return {};
  }
};

struct ReadOptions {
  uint64_t staging_bytes = uint64_t{1} << 30;  // the bound on staging memory (at least 4096)
  // One pread, and one staging buffer, at most this. Small enough that a thread's buffers stay in the CPU
  // caches (the kernel's copy out of the page cache then runs at `cat` speed; 64 MiB buffers measured half
  // of it), large enough that syscalls and device copies per byte are negligible.
  uint64_t max_read_bytes = uint64_t{4} << 20;
  // Cold reads need a deeper queue than one buffer: the next this-many bytes of a file are announced with
  // POSIX_FADV_WILLNEED ahead of the reads (the kernel fetches them meanwhile).
  uint64_t read_ahead_bytes = uint64_t{64} << 20;
  uint64_t max_gap_bytes = uint64_t{64} << 10;  // ranges closer than this share a pread (the gap is discarded)
  int io_threads = 4;
  bool drop_page_cache = true;
  StagingAllocator* allocator = nullptr;  // nullptr: host_staging_allocator()
  ProgressBar* progress = nullptr;        // advanced by the bytes of each pread
};

struct ReadStats {
  uint64_t files = 0;
  uint64_t preads = 0;
  uint64_t bytes_read = 0;          // what the preads transferred (ranges and the gaps between them)
  uint64_t range_bytes = 0;         // what the sink received
  uint64_t buffer_bytes = 0;        // the size of one staging buffer
  uint64_t peak_staging_bytes = 0;  // the most staging memory allocated at once
  int threads = 0;
  double seconds = 0;
};

// Reads every range of every file and hands it to `sink`; files are taken in the order given. On the first
// error (a short read names the file: SafetensorsError kTruncated; a file modified while it was read, once its
// last range is read: kChanged; an exception from the sink) the other
// threads stop at their next read and the error is rethrown here once all have stopped.
ReadStats read_ranges(std::span<const FileRanges> files, ReadSink& sink, const ReadOptions& options);

}  // namespace kimirt::io
