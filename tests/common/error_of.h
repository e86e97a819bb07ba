// The message of the kimirt::Error a piece of code throws, for tests that check what an error names.
#pragma once

#include <string>
#include <utility>

#include "kimirt/base/error.h"

namespace kimirt::test {

// "(no error)" when fn returns normally; any other exception propagates (and fails the test).
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    std::forward<Fn>(fn)();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace kimirt::test
