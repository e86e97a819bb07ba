// Held text is the longest suffix of what was seen that is a proper prefix of some stop string, so it is
// shorter than the longest stop string; the search per chunk is O((held + chunk) x stops). A held suffix
// starts with the first byte of a stop string, a character boundary, so held text never splits a
// UTF-8 character.
#include "kimirt/text/stop_matcher.h"

#include <algorithm>

#include "kimirt/base/error.h"
#include "kimirt/text/utf8.h"

namespace kimirt::text {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (size_t i = 0; i < stops_.size(); ++i) {
    KIMIRT_CHECK(!stops_[i].empty(), "stop string {} is empty", i);
    // Only whole characters: a stop made of a character's tail bytes would match inside that character and cut
    // the text shown in the middle of it.
    const size_t bad = find_invalid_utf8(stops_[i]);
    KIMIRT_CHECK(bad == stops_[i].size(), "stop string {} is not UTF-8 (byte {})", i, bad);
  }
}

StopMatcher::Result StopMatcher::push(std::string_view chunk) {
  Result result;
  if (stopped_) return result;
  std::string buffer = std::move(held_);
  held_.clear();
  buffer.append(chunk);

  // The stop that ends first, and of those the one that starts first: the one a byte-by-byte stream completes
  // first, so that the same text stops at the same place however it was cut into chunks (the earliest start
  // would pick "abcd" over "bc" in "abcd" seen whole, and "bc" when "d" came later).
  size_t first = std::string::npos, first_end = std::string::npos;
  const std::string* found = nullptr;
  for (const auto& stop : stops_) {
    const size_t at = buffer.find(stop);
    if (at == std::string::npos) continue;
    const size_t end = at + stop.size();
    if (end < first_end || (end == first_end && at < first)) {
      first = at;
      first_end = end;
      found = &stop;
    }
  }
  if (found != nullptr) {
    stopped_ = true;
    result.stopped = true;
    result.stop = *found;
    buffer.resize(first);
    result.text = std::move(buffer);
    return result;
  }

  size_t hold = 0;
  for (const auto& stop : stops_) {
    for (size_t k = std::min(buffer.size(), stop.size() - 1); k > hold; --k) {
      if (std::string_view(buffer).substr(buffer.size() - k) == std::string_view(stop).substr(0, k)) {
        hold = k;
        break;
      }
    }
  }
  held_ = buffer.substr(buffer.size() - hold);
  buffer.resize(buffer.size() - hold);
  result.text = std::move(buffer);
  return result;
}

std::string StopMatcher::finish() {
  std::string rest = std::move(held_);
  held_.clear();
  if (stopped_) return {};
  return rest;
}

}  // namespace kimirt::text
