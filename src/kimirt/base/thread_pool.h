// A fixed pool of worker threads for data-parallel loops and independent jobs. One global pool serves
// the CPU kernels (sized by --threads); I/O uses its own threads (io::Loader).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kimirt {

class ThreadPool {
 public:
  // num_threads counts the caller: parallel_for runs one share on the calling thread, so a pool of 1
  // starts no worker at all. Throws an Error naming num_threads when the system cannot start them all.
  explicit ThreadPool(size_t num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t num_threads() const { return workers_.size() + 1; }

  // Splits [0, n) into contiguous ranges of at least `grain` items and calls fn(begin, end) on each,
  // on the workers and the caller; returns when all are done. The first exception thrown by fn is
  // rethrown here after every range has finished.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  // Process-wide pool for compute kernels.
  static ThreadPool& global();
  static void set_global_threads(size_t num_threads);

 private:
  void worker_loop();
  void stop();  // workers return once the queue is empty

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
};

// The CPUs this process may run on (its affinity mask), at least 1.
size_t hardware_threads();

}  // namespace kimirt
