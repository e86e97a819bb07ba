// Stop strings across chunk boundaries: held-back text, the stop completed first winning whatever the chunks,
// text that only looked like the start of a stop string being released, and the stop strings refused.
#include "kimirt/text/stop_matcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error_of.h"
#include "kimirt/base/error.h"

namespace kimirt::text {
namespace {

using kimirt::test::error_of;
using ::testing::HasSubstr;

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

// The stop completed first wins (of two completed by the same byte, the longer), so that every way of cutting
// the same text into chunks stops at the same place with the same stop: with the earliest start, "abcd" seen
// whole stopped on "abcd" and "abc" + "d" on "bc".
TEST(StopMatcher, TheSameTextStopsAlikeHoweverItIsCut) {
  const std::string text = "xxabcdyy";
  for (const auto& stops :
       std::vector<std::vector<std::string>>{{"bc", "abcd"}, {"abcd", "bc"}, {"abc", "bc"}, {"cd", "abc", "bcd"}}) {
    std::string want_text, want_stop;
    for (size_t cut1 = 0; cut1 <= text.size(); ++cut1) {
      for (size_t cut2 = cut1; cut2 <= text.size(); ++cut2) {
        StopMatcher m(stops);
        std::string shown, stop;
        for (const auto& piece : {text.substr(0, cut1), text.substr(cut1, cut2 - cut1), text.substr(cut2)}) {
          const auto r = m.push(piece);
          shown += r.text;
          if (r.stopped) {
            stop = r.stop;
            break;
          }
        }
        ASSERT_FALSE(stop.empty()) << stops[0] << " cut at " << cut1 << ", " << cut2;
        if (cut1 == 0 && cut2 == 0) want_text = shown, want_stop = stop;
        EXPECT_EQ(shown, want_text) << stops[0] << " cut at " << cut1 << ", " << cut2;
        EXPECT_EQ(stop, want_stop) << stops[0] << " cut at " << cut1 << ", " << cut2;
      }
    }
  }
  StopMatcher m({"bc", "abcd"});
  const auto r = m.push("abcd");
  EXPECT_EQ(r.stop, "bc");
  EXPECT_EQ(r.text, "a");
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

// A stop of a character's tail bytes would match inside the character (the tail of 中 inside 中) and cut the text
// shown in the middle of it.
TEST(StopMatcher, StopStringThatIsNotUtf8IsAnError) {
  EXPECT_THAT(error_of([] { StopMatcher({"ok", "\xb8\xad"}); }), HasSubstr("stop string 1 is not UTF-8 (byte 0)"));
  EXPECT_THAT(error_of([] { StopMatcher({"\xe4\xb8"}); }), HasSubstr("stop string 0 is not UTF-8 (byte 0)"));
  EXPECT_NO_THROW(StopMatcher({"中", "\n\n"}));
}

}  // namespace
}  // namespace kimirt::text
