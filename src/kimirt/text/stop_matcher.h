// Stop strings on streamed text. Generated text arrives in arbitrary chunks, so a stop string may be cut
// between chunks ("<|im" + "_end|>", "\n\nUs" + "er:"). The matcher shows text only once it can no longer
// become part of a stop string, and ends the stream at the first stop string to be completed (of two completed
// by the same byte, the longer), which is not shown: the same text stops at the same place however it is cut.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kimirt::text {

class StopMatcher {
 public:
  struct Result {
    std::string text;      // safe to show now
    bool stopped = false;  // a stop string was found; `text` ends right before it
    std::string stop;      // the stop string found
  };

  // Throws kimirt::Error naming the index of an empty stop string (it would stop before any text) or of one that
  // is not UTF-8.
  explicit StopMatcher(std::vector<std::string> stops);

  // Feeds the next chunk (whole UTF-8 characters, as StreamDecoder emits). After a stop, returns empty
  // results.
  Result push(std::string_view chunk);
  // The stream ended without a stop: the text held back because it might have started a stop string.
  std::string finish();

  bool stopped() const { return stopped_; }
  size_t held_bytes() const { return held_.size(); }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace kimirt::text
