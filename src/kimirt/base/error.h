// Errors with context. Every failure that a user can cause (a malformed file, a missing tensor, a bad
// request) is reported as a kimirt::Error whose message names the file, tensor or field at fault.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace kimirt {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Memory the machine cannot give, found before allocating it (the message says how much was needed and how
// much there is). A caller that knows which flag or setting asked for the memory may catch it to name that.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

// Runs fn(); an Error thrown inside gets `context` prepended ("context: message"), so that a low-level
// reader need not know which checkpoint, layer or request it is serving. `context` is a string, or a callable
// returning one, called only when fn throws: on a hot path the context then costs nothing until it is needed.
template <typename Context, typename Fn>
decltype(auto) with_context(const Context& context, Fn&& fn) {
  try {
    return std::forward<Fn>(fn)();
  } catch (const Error& e) {
    if constexpr (std::is_invocable_v<const Context&>) {
      throw Error(std::string(context()) + ": " + e.what());
    } else {
      throw Error(std::string(context) + ": " + e.what());
    }
  }
}

}  // namespace kimirt

// KIMIRT_CHECK(cond, "format {}", args...): fails with the formatted message when cond is false.
#define KIMIRT_CHECK(cond, ...)    \
  do {                             \
    if (!(cond)) [[unlikely]] {    \
      ::kimirt::fail(__VA_ARGS__); \
    }                              \
  } while (0)

// For invariants of the code itself (not of its input): names the source line.
#define KIMIRT_ASSERT(cond)                                                            \
  do {                                                                                 \
    if (!(cond)) [[unlikely]] {                                                        \
      ::kimirt::fail("internal error: {} failed at {}:{}", #cond, __FILE__, __LINE__); \
    }                                                                                  \
  } while (0)
