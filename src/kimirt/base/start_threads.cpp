#include "kimirt/base/start_threads.h"

#include <exception>
#include <string>

#include "kimirt/base/error.h"

namespace kimirt {

std::vector<std::thread> start_threads(size_t count, std::string_view what, const std::function<void(size_t)>& body,
                                       const std::function<void()>& stop) {
  std::vector<std::thread> threads;
  std::string reason;
  try {
    threads.reserve(count);
    // Each thread gets a copy of body: the caller's may be a temporary.
    for (size_t i = 0; i < count; ++i) threads.emplace_back([body, i] { body(i); });
    return threads;
  } catch (const std::exception& e) {
    // std::system_error (EAGAIN: no thread slot, or no memory for the stack) or std::bad_alloc.
    reason = e.what();
  }
  stop();
  for (auto& t : threads) t.join();
  fail("{}: only {} of {} threads could start ({})", what, threads.size(), count, reason);
}

}  // namespace kimirt
