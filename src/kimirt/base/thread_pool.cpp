#include "kimirt/base/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <vector>

#include "kimirt/base/error.h"
#include "kimirt/base/start_threads.h"

namespace kimirt {

size_t hardware_threads() {
  // The affinity mask, not the machine: taskset, a container's cpuset or mpirun's binding may allow this process
  // fewer CPUs than the machine has, and threads beyond them only take turns on the same cores.
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0) {
    const int n = CPU_COUNT(&allowed);
    if (n > 0) return static_cast<size_t>(n);
  }
  // More CPUs than a cpu_set_t holds (EINVAL), or no mask to read.
  return std::max<size_t>(1, std::thread::hardware_concurrency());
}

ThreadPool::ThreadPool(size_t num_threads) {
  KIMIRT_CHECK(num_threads >= 1, "thread count must be at least 1, got {}", num_threads);
  workers_ = start_threads(
      num_threads - 1, fmt::format("a thread pool of {} threads", num_threads), [this](size_t) { worker_loop(); },
      [this] { stop(); });
}

ThreadPool::~ThreadPool() {
  stop();
  for (auto& t : workers_) t.join();
}

void ThreadPool::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
}

void ThreadPool::worker_loop() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      if (stopping_ && jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t max_chunks = (n + grain - 1) / grain;
  const int64_t chunks = std::min<int64_t>(max_chunks, static_cast<int64_t>(num_threads()));
  if (chunks <= 1) {
    fn(0, n);
    return;
  }
  struct Shared {
    std::atomic<int64_t> remaining;
    std::mutex mutex;
    std::condition_variable done;
    std::exception_ptr error;
  };
  auto shared = std::make_shared<Shared>();
  shared->remaining = chunks - 1;
  auto range = [n, chunks](int64_t i) { return std::pair<int64_t, int64_t>{n * i / chunks, n * (i + 1) / chunks}; };
  // The jobs hold `fn` by reference: none may be left queued if this call unwinds. So they are built first,
  // and queued all or none (an allocation failing half-way takes back those already queued, which no worker
  // can have taken while the lock is held).
  std::vector<std::function<void()>> mine;
  mine.reserve(static_cast<size_t>(chunks - 1));
  for (int64_t i = 1; i < chunks; ++i) {
    mine.emplace_back([shared, &fn, r = range(i)] {
      try {
        fn(r.first, r.second);
      } catch (...) {
        std::lock_guard<std::mutex> l(shared->mutex);
        if (!shared->error) shared->error = std::current_exception();
      }
      if (shared->remaining.fetch_sub(1) == 1) {
        std::lock_guard<std::mutex> l(shared->mutex);
        shared->done.notify_all();
      }
    });
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const size_t before = jobs_.size();
    try {
      for (auto& job : mine) jobs_.push_back(std::move(job));
    } catch (...) {
      jobs_.resize(before);
      throw;
    }
  }
  wake_.notify_all();
  // The caller's range records its exception as the workers' do: the first one thrown wins, whoever threw it.
  try {
    auto r = range(0);
    fn(r.first, r.second);
  } catch (...) {
    std::lock_guard<std::mutex> l(shared->mutex);
    if (!shared->error) shared->error = std::current_exception();
  }
  {
    std::unique_lock<std::mutex> lock(shared->mutex);
    shared->done.wait(lock, [&] { return shared->remaining.load() == 0; });
  }
  if (shared->error) std::rethrow_exception(shared->error);
}

namespace {
std::unique_ptr<ThreadPool>& global_slot() {
  static std::unique_ptr<ThreadPool> pool;
  return pool;
}
std::mutex& global_mutex() {
  static std::mutex m;
  return m;
}
}  // namespace

ThreadPool& ThreadPool::global() {
  std::lock_guard<std::mutex> lock(global_mutex());
  auto& slot = global_slot();
  if (!slot) slot = std::make_unique<ThreadPool>(hardware_threads());
  return *slot;
}

void ThreadPool::set_global_threads(size_t num_threads) {
  std::lock_guard<std::mutex> lock(global_mutex());
  auto& slot = global_slot();
  if (slot && slot->num_threads() == num_threads) return;
  slot = std::make_unique<ThreadPool>(num_threads);
}

}  // namespace kimirt
