// Stop strings across chunk boundaries: held-back text, the earliest stop winning, and text that only
// looked like the start of a stop string being released.
#include "kimirt/text/stop_matcher.h"

#include <gtest/gtest.h>

#include "kimirt/base/error.h"

namespace kimirt::text {
namespace {

TEST(StopMatcher, MatchesAcrossChunks) {
  StopMatcher m({"<|im_end|>"});
  auto r = m.push("Hello <|im");
  EXPECT_EQ(r.text, "Hello ");
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(m.held_bytes(), 4u);
  r = m.push("_end|> and more");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(r.stop, "<|im_end|>");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.push("ignored").text, "");
  EXPECT_EQ(m.finish(), "");
}

TEST(StopMatcher, ReleasesTextThatStopsLookingLikeAStop) {
  StopMatcher m({"\n\nUser:"});
  EXPECT_EQ(m.push("a\n").text, "a");
  EXPECT_EQ(m.push("\nUs").text, "");
  EXPECT_EQ(m.push("ually").text, "\n\nUsually");
  EXPECT_EQ(m.push("\n\nUse").text, "");
  EXPECT_EQ(m.finish(), "\n\nUse");
}

TEST(StopMatcher, EarliestStopWinsAndTextBeforeItIsKept) {
  StopMatcher m({"STOP", "ST", "xyz"});
  const auto r = m.push("abc xyz then STOP");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "abc ");
  EXPECT_EQ(r.stop, "xyz");
}

TEST(StopMatcher, SingleCharacterChunksOfMultibyteText) {
  StopMatcher m({"。\n"});
  std::string shown;
  for (const char* chunk : {"你", "好", "。", "再", "见", "。", "\n", "后"}) {
    const auto r = m.push(chunk);
    shown += r.text;
    if (r.stopped) break;
  }
  EXPECT_EQ(shown, "你好。再见");
}

TEST(StopMatcher, NoStopsPassesEverythingThrough) {
  StopMatcher m({});
  EXPECT_EQ(m.push("anything").text, "anything");
  EXPECT_EQ(m.held_bytes(), 0u);
}

TEST(StopMatcher, EmptyStopStringIsAnError) { EXPECT_THROW(StopMatcher({"ok", ""}), Error); }

}  // namespace
}  // namespace kimirt::text
