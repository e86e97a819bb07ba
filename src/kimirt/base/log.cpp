#include "kimirt/base/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "kimirt/base/error.h"
#include "kimirt/base/printable.h"

namespace kimirt::log {
namespace {

Level initial_level() {
  const char* env = std::getenv("KIMIRT_LOG");
  if (env == nullptr || *env == '\0') return Level::kInfo;
  try {
    return parse_level(env);
  } catch (const Error&) {
    std::fprintf(stderr, "[kimirt warn] KIMIRT_LOG=%s is not one of debug|info|warn|error|off; using info\n", env);
    return Level::kInfo;
  }
}

std::atomic<Level>& current() {
  static std::atomic<Level> value{initial_level()};
  return value;
}

}  // namespace

Level level() { return current().load(std::memory_order_relaxed); }
void set_level(Level l) { current().store(l, std::memory_order_relaxed); }

Level parse_level(std::string_view name) {
  if (name == "debug") return Level::kDebug;
  if (name == "info") return Level::kInfo;
  if (name == "warn") return Level::kWarn;
  if (name == "error") return Level::kError;
  if (name == "off") return Level::kOff;
  fail("log level '{}' is not one of debug|info|warn|error|off", name);
}

void write(Level l, std::string_view message) {
  static std::mutex mutex;
  static constexpr const char* kNames[] = {"debug", "info", "warn", "error", "off"};
  const std::string shown = printable(message);  // names read from files, escaped
  std::lock_guard<std::mutex> lock(mutex);
  std::fprintf(stderr, "[kimirt %s] %s\n", kNames[static_cast<int>(l)], shown.c_str());
}

}  // namespace kimirt::log
