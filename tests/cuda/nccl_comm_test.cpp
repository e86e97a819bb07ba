// NCCL with one rank on the GPU machine (the multi-GPU runs need a machine with several GPUs): every
// collective runs through NCCL for real and leaves the right bytes on the device.
#include "kimirt/cuda/nccl_comm.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <vector>

#include "kimirt/base/error.h"
#include "test_util.h"

namespace kimirt::cuda {
namespace {

TEST(NcclComm, OneRankCollectives) {
  KIMIRT_REQUIRE_GPU();
  auto comm = NcclComm::create(nccl_new_id(), 1, 0, 0);
  ASSERT_EQ(comm->size(), 1);
  const std::vector<float> values = {1.5f, -2.0f, 3.25f, 8.0f};
  auto buf = test::upload(values);
  comm->all_reduce_sum(buf.data(), values.size(), DType::kF32);
  KIMIRT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(test::download<float>(buf.data(), values.size()), values);
  EXPECT_EQ(comm->num_all_reduces(), 1u);

  auto gathered = test::upload(std::vector<float>(4, -1.0f));
  comm->all_gather(buf.data(), gathered.data(), 4, DType::kF32);
  const size_t counts[] = {4};
  auto moved = test::upload(std::vector<float>(4, -1.0f));
  comm->all_to_all_v(buf.data(), counts, moved.data(), counts, DType::kF32);
  KIMIRT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(test::download<float>(gathered.data(), 4), values);
  EXPECT_EQ(test::download<float>(moved.data(), 4), values);

  auto sub = comm->split(0, 0);
  EXPECT_EQ(sub->size(), 1);
  sub->all_reduce_sum(buf.data(), values.size(), DType::kF32);
  comm->barrier();
  EXPECT_EQ(test::download<float>(buf.data(), values.size()), values);
}

TEST(NcclComm, IdFileBootstrapWithOneRank) {
  KIMIRT_REQUIRE_GPU();
  const auto path = std::filesystem::temp_directory_path() / "kimirt-nccl-id-test";
  std::filesystem::remove(path);
  auto comm = NcclComm::from_id_file(path, 1, 0, 0);
  EXPECT_TRUE(std::filesystem::exists(path));
  EXPECT_EQ(comm->rank(), 0);
  std::filesystem::remove(path);
}

TEST(NcclComm, BadRankIsAnError) {
  KIMIRT_REQUIRE_GPU();
  EXPECT_THROW(NcclComm::create(nccl_new_id(), 2, 2, 0), Error);
}

}  // namespace
}  // namespace kimirt::cuda
