#include "kimirt/base/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "kimirt/base/error.h"

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
