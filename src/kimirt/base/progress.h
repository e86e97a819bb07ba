// A one-line progress bar (bytes done, GB/s, ETA; or a count of `unit`s and their rate) drawn on stderr only when
// stderr is a terminal; quiet otherwise so that logs and CI output stay clean. Thread-safe: loader threads call
// add().
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "kimirt/base/timer.h"

namespace kimirt {

class ProgressBar {
 public:
  // `unit` empty: `total` and add() count bytes; else things of that name ("tokens").
  ProgressBar(std::string label, uint64_t total, bool enabled = stderr_is_terminal(), std::string unit = {});
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void add(uint64_t bytes);
  // Draws the final state and a newline (once).
  void finish();
  uint64_t done() const { return done_.load(); }

  static bool stderr_is_terminal();

 private:
  void draw(bool final);

  std::string label_;
  uint64_t total_;
  std::string unit_;
  bool enabled_;
  bool finished_ = false;
  std::atomic<uint64_t> done_{0};
  std::mutex mutex_;
  Timer timer_;
  double last_draw_ = -1.0;
};

// "1.50 GiB", "512.0 KiB": sizes for humans.
std::string format_bytes(uint64_t bytes);

}  // namespace kimirt
