#include "kimirt/runtime/scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kimirt/base/error.h"

namespace kimirt::runtime {
namespace {

TEST(Scheduler, DecodesGoFirstThenPromptsInChunksInAdmissionOrder) {
  const SequenceWork running[] = {{100, false}, {0, true}, {30, false}, {0, true}};
  const auto plan = schedule_step(running, {.max_batch_tokens = 64, .prefill_chunk = 40});
  ASSERT_EQ(plan.size(), 4u);
  EXPECT_EQ(plan[0].sequence, 1u);
  EXPECT_EQ(plan[1].sequence, 3u);
  EXPECT_FALSE(plan[0].prefill);
  EXPECT_EQ(plan[0].num_tokens, 1);
  // 62 tokens left: the first prompt gets a whole chunk of 40, the second the remaining 22.
  EXPECT_EQ(plan[2].sequence, 0u);
  EXPECT_EQ(plan[2].num_tokens, 40);
  EXPECT_TRUE(plan[2].prefill);
  EXPECT_EQ(plan[3].sequence, 2u);
  EXPECT_EQ(plan[3].num_tokens, 22);
}

TEST(Scheduler, AShortPromptIsTakenWhole) {
  const SequenceWork running[] = {{7, false}};
  const auto plan = schedule_step(running, {.max_batch_tokens = 64, .prefill_chunk = 40});
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].num_tokens, 7);
}

TEST(Scheduler, NothingToRun) { EXPECT_TRUE(schedule_step({}, {}).empty()); }

TEST(Scheduler, ConfigErrorsNameTheField) {
  try {
    SchedulerConfig{.max_batch_tokens = 4, .prefill_chunk = 8}.validate(8);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("max_batch_tokens (4)"));
  }
  try {
    SchedulerConfig{.max_batch_tokens = 64, .prefill_chunk = 0}.validate(8);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("prefill_chunk"));
  }
}

}  // namespace
}  // namespace kimirt::runtime
