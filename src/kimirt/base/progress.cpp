#include "kimirt/base/progress.h"

#include <unistd.h>

#include <cstdio>

#include <fmt/format.h>

namespace kimirt {

bool ProgressBar::stderr_is_terminal() { return ::isatty(STDERR_FILENO) == 1; }

ProgressBar::ProgressBar(std::string label, uint64_t total, bool enabled, std::string unit)
    : label_(std::move(label)), total_(total), unit_(std::move(unit)), enabled_(enabled) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::add(uint64_t bytes) {
  done_.fetch_add(bytes);
  if (enabled_) draw(false);
}

void ProgressBar::finish() {
  if (!enabled_) return;
  draw(true);
}

void ProgressBar::draw(bool final) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (finished_) return;
  const double now = timer_.seconds();
  // Redraw at most 10 times a second; a terminal is slower than a loader.
  if (!final && last_draw_ >= 0 && now - last_draw_ < 0.1) return;
  last_draw_ = now;
  const uint64_t done = done_.load();
  const double fraction = total_ ? static_cast<double>(done) / static_cast<double>(total_) : 1.0;
  const double rate = now > 0 ? static_cast<double>(done) / now : 0.0;  // per second
  const double eta = (rate > 0 && total_ > done) ? static_cast<double>(total_ - done) / rate : 0.0;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(fraction * kWidth);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kWidth, '.');
  const std::string amounts =
      unit_.empty() ? fmt::format("{} / {}  {:.2f} GB/s", format_bytes(done), format_bytes(total_), rate / 1e9)
                    : fmt::format("{} / {} {}  {:.1f} {}/s", done, total_, unit_, rate, unit_);
  std::string line = fmt::format("\r{} [{}] {:5.1f}% {}  ETA {:.0f}s ", label_, bar, fraction * 100.0, amounts, eta);
  std::fputs(line.c_str(), stderr);
  if (final) {
    std::fputc('\n', stderr);
    finished_ = true;
  }
  std::fflush(stderr);
}

std::string format_bytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  if (unit == 0) return fmt::format("{} B", bytes);
  return fmt::format("{:.2f} {}", value, kUnits[unit]);
}

}  // namespace kimirt
