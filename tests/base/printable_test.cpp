// Text from files shown on a terminal: control characters escaped, length capped at a character boundary.
#include "kimirt/base/printable.h"

#include <gtest/gtest.h>

#include <string>

namespace kimirt {
namespace {

TEST(Printable, ControlCharactersAreEscapedAndLengthIsCapped) {
  EXPECT_EQ(printable("plain 中文\ttab\nline"), "plain 中文\ttab\nline");
  EXPECT_EQ(printable(std::string("a\x1b]0;title\x07z", 12)), "a\\x1b]0;title\\x07z");
  EXPECT_EQ(printable(std::string("nul\0x\x7f", 6)), "nul\\x00x\\x7f");
  EXPECT_EQ(printable("csi \xc2\x9b"
                      "2J, nbsp \xc2\xa0"),
            "csi \\u009b2J, nbsp \xc2\xa0");
  // 10 bytes kept at most, never half a character: 中 is 3 bytes.
  EXPECT_EQ(printable("abcdefgh中中", 10), "abcdefgh... (6 more bytes)");
  EXPECT_EQ(printable(std::string(20, 'x'), 10), "xxxxxxxxxx... (10 more bytes)");
  EXPECT_EQ(printable("short", 10), "short");
  // A cut after an escape followed by a lone continuation byte (invalid UTF-8) keeps the escape.
  EXPECT_EQ(printable("\x01\x80xyz", 4), "\\x01... (4 more bytes)");
  EXPECT_EQ(printable("\x01中", 5), "\\x01... (3 more bytes)");
}

}  // namespace
}  // namespace kimirt
