// The progress bar's line: bytes with GB/s by default, or a count of named things and their rate (the prefill's
// tokens); drawn on stderr only when enabled, its last state once, with a newline.
#include "kimirt/base/progress.h"

#include <gtest/gtest.h>

#include <string>

namespace kimirt {
namespace {

TEST(ProgressBar, CountsBytesOrNamedThings) {
  ::testing::internal::CaptureStderr();
  {
    ProgressBar tokens("prefill", 2048, true, "tokens");
    tokens.add(512);
    tokens.finish();
    tokens.add(512);  // after finish: nothing more is drawn
  }
  std::string out = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(out.find("prefill ["), std::string::npos) << out;
  EXPECT_NE(out.find(" 25.0% 512 / 2048 tokens  "), std::string::npos) << out;
  EXPECT_NE(out.find(" tokens/s  ETA "), std::string::npos) << out;
  EXPECT_EQ(out.find("GB/s"), std::string::npos) << out;
  EXPECT_EQ(out.find(" 50.0%"), std::string::npos) << out;
  EXPECT_EQ(out.back(), '\n') << out;

  ::testing::internal::CaptureStderr();
  {
    ProgressBar bytes("loading", 4096, true);
    bytes.add(1024);
  }
  out = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(out.find(" 25.0% 1.00 KiB / 4.00 KiB  "), std::string::npos) << out;
  EXPECT_NE(out.find(" GB/s  ETA "), std::string::npos) << out;

  ::testing::internal::CaptureStderr();
  {
    ProgressBar quiet("loading", 4096, false);
    quiet.add(4096);
  }
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

}  // namespace
}  // namespace kimirt
