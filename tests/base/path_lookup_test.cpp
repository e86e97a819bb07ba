// Present, absent and "cannot tell" kept apart: a loop of symbolic links stands for every lookup that fails (a
// directory without search permission fails the same way for users other than root, which the suite may run as).
#include "kimirt/base/path_lookup.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <fstream>
#include <string>

#include "kimirt/base/error.h"

namespace kimirt {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

TEST(PathLookup, PresentAbsentAndFailed) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("kimirt_path_lookup_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "file") << "x";
  fs::create_symlink("file", dir / "link");
  fs::create_symlink("nowhere", dir / "dangling");
  fs::create_symlink("loop", dir / "loop");

  std::string why;
  EXPECT_EQ(look_up(dir / "file"), PathLookup::kPresent);
  EXPECT_EQ(look_up(dir / "link"), PathLookup::kPresent);
  EXPECT_EQ(look_up(dir), PathLookup::kPresent);
  EXPECT_EQ(look_up(dir / "absent"), PathLookup::kAbsent);
  EXPECT_EQ(look_up(dir / "dangling"), PathLookup::kAbsent);
  EXPECT_EQ(look_up(dir / "file" / "below"), PathLookup::kAbsent) << "ENOTDIR, as std::filesystem::exists has it";
  EXPECT_EQ(look_up(dir / "loop", &why), PathLookup::kFailed);
  EXPECT_FALSE(why.empty());
  EXPECT_EQ(look_up(dir / "loop" / "below"), PathLookup::kFailed);

  EXPECT_EQ(dangling_link_note(dir / "dangling"), " (a symbolic link to 'nowhere', which does not resolve)");
  EXPECT_EQ(dangling_link_note(dir / "absent"), "");
  EXPECT_EQ(dangling_link_note(dir / "link"), "") << "a link that resolves is not dangling";

  EXPECT_TRUE(path_exists(dir / "file"));
  EXPECT_FALSE(path_exists(dir / "absent"));
  try {
    path_exists(dir / "loop");
    FAIL() << "a failed lookup read as an answer";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr((dir / "loop").string() + ": cannot be looked up: "));
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kimirt
