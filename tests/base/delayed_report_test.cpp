// DelayedReport: a message is printed only when its matter is still unresolved after the delay.
#include "kimirt/base/delayed_report.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kimirt {
namespace {

using std::chrono::milliseconds;

struct Captured {
  std::mutex mutex;
  std::vector<std::string> messages;
  DelayedReport::Sink sink() {
    return [this](const std::string& m) {
      std::lock_guard<std::mutex> lock(mutex);
      messages.push_back(m);
    };
  }
  std::vector<std::string> get() {
    std::lock_guard<std::mutex> lock(mutex);
    return messages;
  }
};

TEST(DelayedReport, ResolvedInTimeSaysNothing) {
  Captured c;
  const auto start = std::chrono::steady_clock::now();
  {
    DelayedReport report(milliseconds(60000), c.sink());
    report.arm("rank 1 failed");
  }  // resolved long before the delay: the watcher wakes and leaves at once
  EXPECT_TRUE(c.get().empty());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10))
      << "the destructor waited out the delay";
}

TEST(DelayedReport, OverdueMessageIsSaidOnceFirstWins) {
  Captured c;
  DelayedReport report(milliseconds(20), c.sink());
  std::thread other([&] { report.arm("rank 0 failed"); });
  other.join();
  report.arm("rank 1 failed");  // a later failure of the same group: the first one is the report
  for (int i = 0; i < 500 && c.get().empty(); ++i) std::this_thread::sleep_for(milliseconds(10));
  std::this_thread::sleep_for(milliseconds(50));
  ASSERT_EQ(c.get().size(), 1u);
  EXPECT_EQ(c.get()[0], "rank 0 failed");
}

TEST(DelayedReport, NeverArmedSaysNothing) {
  Captured c;
  { DelayedReport report(milliseconds(1), c.sink()); }
  EXPECT_TRUE(c.get().empty());
}

}  // namespace
}  // namespace kimirt
