#include "kimirt/base/delayed_report.h"

#include <cstdio>
#include <utility>

#include "kimirt/base/printable.h"

namespace kimirt {
namespace {

void print_to_stderr(const std::string& message) {
  std::fprintf(stderr, "kimirt: error: %s\n", printable(message).c_str());
  std::fflush(stderr);
}

}  // namespace

DelayedReport::DelayedReport(std::chrono::milliseconds delay, Sink sink)
    : delay_(delay), sink_(sink ? std::move(sink) : Sink(print_to_stderr)) {}

DelayedReport::~DelayedReport() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    resolved_ = true;
  }
  resolved_cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
}

void DelayedReport::arm(const std::string& message) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (armed_ || resolved_) return;
  armed_ = true;
  try {
    watcher_ = std::thread([this, message] {
      std::unique_lock<std::mutex> lock(mutex_);
      if (resolved_cv_.wait_for(lock, delay_, [this] { return resolved_; })) return;
      lock.unlock();
      sink_(message);
    });
  } catch (...) {  // no thread (std::system_error), or no memory for it or the message's copy
    sink_(message);
  }
}

}  // namespace kimirt
