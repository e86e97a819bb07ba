// Starting a set of threads that only work together, all or none: a thread the system refuses (no memory
// for its stack, no thread slot left) must not leave the others running, perhaps waiting for it forever, nor
// destroy a joinable std::thread (std::terminate).
#pragma once

#include <cstddef>
#include <functional>
#include <string_view>
#include <thread>
#include <vector>

namespace kimirt {

// Starts `count` threads running body(i). When thread i cannot start, calls stop() (which must make every
// running body return), joins the threads already started and throws a kimirt::Error
// "<what>: only <i> of <count> threads could start (<reason>)". body must not throw.
std::vector<std::thread> start_threads(size_t count, std::string_view what, const std::function<void(size_t)>& body,
                                       const std::function<void()>& stop);

}  // namespace kimirt
