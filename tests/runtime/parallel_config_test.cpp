// A parallel configuration the engine cannot run is refused before anything is loaded, with a message that
// names the flag and says what would work; the names of the MoE paths and devices parse both ways.
#include "common/error_of.h"
#include "kimirt/runtime/parallel_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kimirt/base/error.h"
#include "kimirt/runtime/backend_factory.h"
#include "runtime/test_util.h"

namespace kimirt::runtime {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

using ::kimirt::test::error_of;

TEST(ParallelConfig, MappingsPutEpFastestAmongTheRanks) {
  const ParallelConfig pc{4, 2};
  EXPECT_EQ(pc.mapping(3), model::ParallelMapping::make(4, 3, 2));
  EXPECT_EQ(pc.mapping(3).ep_rank, 1);
  EXPECT_EQ(pc.mapping(3).moe_tp_rank(), 1);
  EXPECT_EQ(pc.effective_moe_comm(), MoeComm::kDirect);
  EXPECT_EQ((ParallelConfig{4, 4, true}).effective_moe_comm(), MoeComm::kAllToAll);
}

TEST(ParallelConfig, UnsupportedCombinationsAreRefused) {
  EXPECT_THAT(error_of([] { ParallelConfig{0, 1}.validate(); }), HasSubstr("--tp must be at least 1"));
  EXPECT_THAT(error_of([] {
                ParallelConfig{4, 3}.validate();
              }),
              AllOf(HasSubstr("--ep (3) must divide --tp (4)"), HasSubstr("moe_tp × moe_ep == tp")));
  EXPECT_THAT(error_of([] {
                ParallelConfig{4, 2, true}.validate();
              }),
              AllOf(HasSubstr("attention-DP"), HasSubstr("MoE tensor parallelism (moe_tp 2)"), HasSubstr("--ep 4")));
  EXPECT_THAT(error_of([] {
                ParallelConfig{4, 2, false, MoeComm::kAllToAll}.validate();
              }),
              AllOf(HasSubstr("--moe-comm all_to_all"), HasSubstr("--ep 4"), HasSubstr("--moe-comm direct")));
  EXPECT_EQ(error_of([] { ParallelConfig{4, 4, true, MoeComm::kAllToAll}.validate(); }), "(no error)");
}

TEST(ParallelConfig, WhatTheModelCannotSplitIsRefused) {
  const auto kl = testing::kl_tiny_config();  // 4 KDA/MLA heads, 8 experts, vocabulary 512
  EXPECT_THAT(error_of([&] { ParallelConfig{8, 1}.validate(kl); }), HasSubstr("does not divide the KDA heads (4)"));
  EXPECT_THAT(error_of([&] {
                ParallelConfig{3, 3, true}.validate(kl);
              }),
              HasSubstr("does not divide vocab_size (512)"));
  auto many = kl;
  many.vocab_size = 3 * 512;
  EXPECT_THAT(error_of([&] {
                ParallelConfig{3, 3, true}.validate(many);
              }),
              HasSubstr("ep_size (3) does not divide num_experts (8)"));
  // Attention-DP runs every head on each rank: 8 ranks are fine for 4 heads there.
  auto wide = kl;
  wide.num_experts = 16;
  wide.vocab_size = 1024;
  EXPECT_EQ(error_of([&] { ParallelConfig{8, 8, true}.validate(wide); }), "(no error)");
}

TEST(ParallelConfig, NamesOfPathsAndDevices) {
  EXPECT_EQ(parse_moe_comm("direct"), MoeComm::kDirect);
  EXPECT_EQ(parse_moe_comm(moe_comm_name(MoeComm::kAllToAll)), MoeComm::kAllToAll);
  EXPECT_THAT(error_of([] { parse_moe_comm("ring"); }), HasSubstr("--moe-comm: \"ring\""));
  EXPECT_EQ(parse_device("cpu"), Device::kCpu);
  EXPECT_EQ(parse_device(device_name(Device::kCuda)), Device::kCuda);
  EXPECT_THAT(error_of([] { parse_device("tpu"); }), HasSubstr("--device: \"tpu\""));
}

TEST(ParallelConfig, TheCudaDeviceSaysItCannotRunTheModelYet) {
  EXPECT_EQ(error_of([] { require_device(Device::kCpu); }), "(no error)");
  EXPECT_THAT(error_of([] { require_device(Device::kCuda); }),
              AllOf(HasSubstr("--device cuda"), HasSubstr("not implemented yet"), HasSubstr("--device cpu")));
}

}  // namespace
}  // namespace kimirt::runtime
