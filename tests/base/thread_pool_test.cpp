#include "kimirt/base/thread_pool.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/limited_child.h"
#include "kimirt/base/error.h"
#include "kimirt/base/start_threads.h"

namespace kimirt {
namespace {

TEST(ThreadPool, CoversEveryIndexOnce) {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> hits(1000);
  pool.parallel_for(1000, 7, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
  });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

TEST(ThreadPool, RethrowsAfterAllRangesFinish) {
  ThreadPool pool(3);
  std::atomic<int> ran{0};
  EXPECT_THROW(pool.parallel_for(3, 1,
                                 [&](int64_t b, int64_t) {
                                   ran++;
                                   if (b == 1) fail("range {} failed", b);
                                 }),
               Error);
  EXPECT_EQ(ran.load(), 3);
}

// The first exception thrown is the one rethrown, also when the caller's own range throws later: a worker's
// range fails at once, the caller's (range 0) only after it has seen that failure.
TEST(ThreadPool, RethrowsTheFirstExceptionWhoeverThrewIt) {
  ThreadPool pool(2);
  std::atomic<bool> worker_failed{false};
  try {
    pool.parallel_for(2, 1, [&](int64_t b, int64_t) {
      if (b == 0) {
        while (!worker_failed.load()) std::this_thread::yield();
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        fail("the caller's range, second");
      }
      worker_failed = true;
      fail("a worker's range, first");
    });
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("first"), std::string::npos) << e.what();
  }
}

// What a child exits with: 0 when fn threw an Error containing `expected` (printed to stderr either way),
// 2 when it did not throw (the limit did not bite), 3 for another message.
template <typename Fn>
int error_code(Fn fn, const std::string& expected) {
  try {
    fn();
  } catch (const Error& e) {
    std::fprintf(stderr, "child: %s\n", e.what());
    return std::string(e.what()).find(expected) != std::string::npos ? 0 : 3;
  }
  return 2;
}

// 64 MiB of address space left: a handful of 8 MiB thread stacks, far from 1000.
constexpr uint64_t kHeadroom = uint64_t{64} << 20;

TEST(StartThreads, ARefusedThreadStopsAndJoinsTheOthersThenThrows) {
  if (!test::kAddressSpaceLimitWorks) GTEST_SKIP() << "sanitizer build: no address-space limit";
  const int code = test::run_in_limited_child(kHeadroom, [] {
    // Bodies that wait for every thread of the set, as ranks in a collective do: only stop() frees them.
    std::mutex m;
    std::condition_variable cv;
    bool stopped = false;
    std::atomic<int> returned{0};
    const int code = error_code(
        [&] {
          auto threads = start_threads(
              1000, "the test's set",
              [&](size_t) {
                std::unique_lock<std::mutex> lock(m);
                cv.wait(lock, [&] { return stopped; });
                returned++;
              },
              [&] {
                std::lock_guard<std::mutex> lock(m);
                stopped = true;
                cv.notify_all();
              });
          for (auto& t : threads) t.join();
        },
        "the test's set: only ");
    // The threads that did start were stopped and joined before the throw.
    return code == 0 && returned.load() == 0 ? 4 : code;
  });
  EXPECT_EQ(code, 0) << "2: all 1000 threads started; 3: another message; 4: none started; 134: std::terminate; "
                        "142: it hung";
}

TEST(ThreadPool, ThreadsTheSystemRefusesAreAnErrorNamingTheCount) {
  if (!test::kAddressSpaceLimitWorks) GTEST_SKIP() << "sanitizer build: no address-space limit";
  const int code =
      test::run_in_limited_child(kHeadroom, [] { return error_code([] { ThreadPool pool(1000); }, "1000 threads"); });
  EXPECT_EQ(code, 0) << "2: all 1000 threads started; 3: another message; 134: std::terminate; 142: it hung";
}

TEST(ThreadPool, HardwareThreadsAreTheCpusOfTheAffinityMask) {
  cpu_set_t before;
  ASSERT_EQ(sched_getaffinity(0, sizeof(before), &before), 0);
  EXPECT_EQ(hardware_threads(), static_cast<size_t>(CPU_COUNT(&before)));
  // A thread narrowed to one CPU (as taskset or mpirun's binding would narrow the process) counts one.
  size_t narrowed = 0;
  std::thread([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &before)) {
        CPU_SET(c, &one);
        break;
      }
    }
    if (sched_setaffinity(0, sizeof(one), &one) == 0) narrowed = hardware_threads();
  }).join();
  EXPECT_EQ(narrowed, 1u);
}

TEST(Error, ContextIsPrepended) {
  try {
    with_context("file a.safetensors", [] { fail("tensor {} is bad", "x"); });
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "file a.safetensors: tensor x is bad");
  }
}

}  // namespace
}  // namespace kimirt
