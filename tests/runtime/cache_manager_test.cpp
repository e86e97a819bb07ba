#include "kimirt/runtime/cache_manager.h"

#include <gtest/gtest.h>

#include <set>

#include "kimirt/base/error.h"

namespace kimirt::runtime {
namespace {

TEST(CacheManager, GrowsReleasesAndRefuses) {
  CacheManager cm({.max_sequences = 2, .block_size = 4, .num_blocks = 5});
  cm.open(10);
  EXPECT_TRUE(cm.reserve(10, 9));  // 3 blocks
  EXPECT_EQ(cm.at(10).blocks.size(), 3u);
  EXPECT_TRUE(cm.reserve(10, 12));  // still 3
  EXPECT_EQ(cm.free_blocks(), 2);
  cm.open(11);
  EXPECT_FALSE(cm.reserve(11, 13));  // needs 4, only 2 free: nothing changes
  EXPECT_TRUE(cm.at(11).blocks.empty());
  EXPECT_EQ(cm.free_blocks(), 2);
  EXPECT_THROW(cm.open(12), Error);  // no slot
  EXPECT_THROW(cm.open(11), Error);  // already open
  std::set<int> slots = {cm.at(10).kda_slot, cm.at(11).kda_slot};
  EXPECT_EQ(slots, (std::set<int>{0, 1}));
  cm.release(10);
  EXPECT_EQ(cm.free_blocks(), 5);
  EXPECT_TRUE(cm.reserve(11, 13));
  EXPECT_THROW(cm.at(10), Error);
}

}  // namespace
}  // namespace kimirt::runtime
