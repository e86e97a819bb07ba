// A message printed only if what it is about is still unresolved after a while. A rank that fails while
// the others are blocked in a collective they can never finish leaves a group that hangs without a word;
// a group that ends reports the failure through its error. So the failure is held back: printed if the group
// has not ended within the delay, dropped when it has (a group that ends after the delay says it twice).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace kimirt {

class DelayedReport {
 public:
  using Sink = std::function<void(const std::string&)>;
  // sink: where an overdue message goes (default: "kimirt: error: <message>" on stderr).
  explicit DelayedReport(std::chrono::milliseconds delay, Sink sink = {});
  // Resolves: a pending message is dropped, the watcher joined.
  ~DelayedReport();
  DelayedReport(const DelayedReport&) = delete;
  DelayedReport& operator=(const DelayedReport&) = delete;

  // Holds `message` for the delay; only the first call counts. Thread-safe. When no watcher thread can
  // start, the message goes to the sink at once (said early rather than never).
  void arm(const std::string& message);

 private:
  std::chrono::milliseconds delay_;
  Sink sink_;
  std::mutex mutex_;
  std::condition_variable resolved_cv_;
  bool resolved_ = false;
  bool armed_ = false;
  std::thread watcher_;
};

}  // namespace kimirt
