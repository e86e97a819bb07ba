#include "kimirt/runtime/cache_manager.h"

#include <gtest/gtest.h>

#include <cstdint>
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

// Needs beyond int: 2^32 tokens in blocks of one narrowed to 0 blocks needed (2^31 to a negative count), and the
// reservation succeeded without a block; near INT64_MAX the rounding up overflowed. Refused, nothing changed.
TEST(CacheManager, RefusesNeedsBeyondIntWithoutChangingAnything) {
  CacheManager cm({.max_sequences = 1, .block_size = 1, .num_blocks = 3});
  cm.open(1);
  for (const int64_t tokens : {int64_t{1} << 31, int64_t{1} << 32, (int64_t{1} << 32) + 2, INT64_MAX}) {
    EXPECT_FALSE(cm.reserve(1, tokens)) << tokens;
    EXPECT_TRUE(cm.at(1).blocks.empty()) << tokens;
    EXPECT_EQ(cm.free_blocks(), 3) << tokens;
  }
  CacheManager wide({.max_sequences = 1, .block_size = 64, .num_blocks = 3});
  wide.open(1);
  EXPECT_EQ(wide.blocks_needed(1, INT64_MAX), INT64_MAX / 64 + 1);
  EXPECT_FALSE(wide.reserve(1, INT64_MAX));
  EXPECT_TRUE(wide.reserve(1, 129));  // 3 blocks
  EXPECT_EQ(wide.free_blocks(), 0);
}

}  // namespace
}  // namespace kimirt::runtime
