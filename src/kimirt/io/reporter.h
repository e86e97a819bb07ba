// Either throws the first problem or collects them all, so that one code path serves the loader (fail fast)
// and `kimirt inspect` (report everything). E is an io error (io_error.h) built from a Kind, the file it is
// about, and the details of the problem.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kimirt::io {

template <typename E>
class Reporter {
 public:
  // sink == nullptr: throw the first problem.
  Reporter(std::string_view where, std::vector<E>* sink) : where_(where), sink_(sink) {}

  template <typename... Details>
  void operator()(typename E::Kind kind, Details&&... details) {
    E error(kind, where_, std::forward<Details>(details)...);
    if (sink_ == nullptr) throw error;
    sink_->push_back(std::move(error));
  }

 private:
  std::string where_;
  std::vector<E>* sink_;
};

}  // namespace kimirt::io
