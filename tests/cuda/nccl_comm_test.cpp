// NCCL with one rank, and with two ranks (threads, one GPU each) where the machine has two GPUs: every
// collective runs through NCCL for real and leaves the right bytes on the device.
#include "kimirt/cuda/nccl_comm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <future>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "kimirt/base/error.h"
#include "kimirt/cuda/check.h"
#include "kimirt/cuda/device.h"
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

// Rank 0 writes the id, and removes it once every rank has joined: a later launch on the same path must not
// read this one's id. A second bootstrap on the path works the same way.
TEST(NcclComm, IdFileBootstrapWithOneRank) {
  KIMIRT_REQUIRE_GPU();
  const auto path = std::filesystem::temp_directory_path() / "kimirt-nccl-id-test";
  std::filesystem::remove(path);
  for (int launch = 0; launch < 2; ++launch) {
    auto comm = NcclComm::from_id_file(path, 1, 0, 0);
    EXPECT_EQ(comm->rank(), 0);
    EXPECT_FALSE(std::filesystem::exists(path)) << "launch " << launch << ": the id outlived the bootstrap";
  }
}

// Every collective of rank r of a two-rank group on its own GPU, with rank r holding (r + 1)·(i + 1) at i:
// each result is known in closed form.
void check_two_rank_collectives(NcclComm* comm, int r) {
  EXPECT_EQ(comm->device(), r);
  EXPECT_EQ(comm->rank(), r);
  EXPECT_EQ(comm->size(), 2);
  const auto seq = [&](int n, float base) {
    std::vector<float> v(n);
    for (int i = 0; i < n; ++i) v[i] = base * static_cast<float>(i + 1);
    return v;
  };
  auto buf = test::upload(seq(4, r + 1.0f));
  comm->all_reduce_sum(buf.data(), 4, DType::kF32);
  // Each rank gathers its own values (not the all-reduced ones, the same on both): rank order and slots show.
  auto own = test::upload(seq(4, r + 1.0f)), gathered = test::upload(std::vector<float>(8, -1.0f));
  comm->all_gather(own.data(), gathered.data(), 4, DType::kF32);
  auto send8 = test::upload(seq(8, r + 1.0f)), scattered = test::upload(std::vector<float>(4, -1.0f));
  comm->reduce_scatter_sum(send8.data(), scattered.data(), 4, DType::kF32);
  auto bcast = test::upload(seq(4, r + 1.0f));
  comm->broadcast(bcast.data(), 4, DType::kF32, 1);
  // Rank 0 sends 1 value to itself and 2 to rank 1; rank 1 sends 3 to rank 0 and 1 to itself.
  const std::vector<size_t> send_counts = r == 0 ? std::vector<size_t>{1, 2} : std::vector<size_t>{3, 1};
  const std::vector<size_t> recv_counts = r == 0 ? std::vector<size_t>{1, 3} : std::vector<size_t>{2, 1};
  std::vector<float> a2a(4);
  for (int k = 0; k < 4; ++k) a2a[k] = 10.0f * r + k;
  auto a2a_send = test::upload(a2a), a2a_recv = test::upload(std::vector<float>(4, -1.0f));
  comm->all_to_all_v(a2a_send.data(), send_counts, a2a_recv.data(), recv_counts, DType::kF32);
  comm->barrier();
  std::vector<float> reduced = seq(4, 3.0f), all = seq(4, 1.0f), bc = seq(4, 2.0f);
  const std::vector<float> second = seq(4, 2.0f);
  all.insert(all.end(), second.begin(), second.end());
  std::vector<float> sc(4);
  for (int i = 0; i < 4; ++i) sc[i] = 3.0f * static_cast<float>(4 * r + i + 1);
  EXPECT_EQ(test::download<float>(buf.data(), 4), reduced) << "all_reduce_sum, rank " << r;
  EXPECT_EQ(test::download<float>(gathered.data(), 8), all) << "all_gather, rank " << r;
  EXPECT_EQ(test::download<float>(scattered.data(), 4), sc) << "reduce_scatter_sum, rank " << r;
  EXPECT_EQ(test::download<float>(bcast.data(), 4), bc) << "broadcast from rank 1, rank " << r;
  const std::vector<float> want_a2a = r == 0 ? std::vector<float>{0, 10, 11, 12} : std::vector<float>{1, 2, 13};
  EXPECT_EQ(test::download<float>(a2a_recv.data(), want_a2a.size()), want_a2a) << "all_to_all_v, rank " << r;
  auto alone = comm->split(r, 0);
  EXPECT_EQ(alone->size(), 1);
}

TEST(NcclComm, TwoRanksOnTwoGpus) {
  KIMIRT_REQUIRE_TWO_GPUS();
  const NcclId id = nccl_new_id();
  test::on_two_ranks([&](int r) {
    KIMIRT_CUDA_CHECK(cudaSetDevice(r));
    check_two_rank_collectives(NcclComm::create(id, 2, r, r).get(), r);
  });
}

// The in-process group's communicators, made by one call; then used from a thread per rank, as run_ranks does.
TEST(NcclComm, CreateAllOnTwoGpus) {
  KIMIRT_REQUIRE_TWO_GPUS();
  KIMIRT_CUDA_CHECK(cudaSetDevice(1));
  const int devices[] = {0, 1};
  auto comms = NcclComm::create_all(devices);
  ASSERT_EQ(comms.size(), 2u);
  EXPECT_EQ(current_device(), 1) << "the caller's device is left current";
  test::on_two_ranks([&](int r) {
    KIMIRT_CUDA_CHECK(cudaSetDevice(r));
    check_two_rank_collectives(comms[static_cast<size_t>(r)].get(), r);
  });
  KIMIRT_CUDA_CHECK(cudaSetDevice(0));
}

// Devices the group cannot use are refused before NCCL is called, naming the rank and the device.
TEST(NcclComm, CreateAllRefusesDevicesItCannotUse) {
  KIMIRT_REQUIRE_GPU();
  const int n = device_count();
  const auto message = [](std::span<const int> devices) {
    try {
      NcclComm::create_all(devices);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(message({}).find("at least one device"), std::string::npos) << message({});
  const int missing[] = {0, n};
  EXPECT_NE(message(missing).find(fmt::format("rank 1's device {} is not one of", n)), std::string::npos)
      << message(missing);
  const int negative[] = {-1};
  EXPECT_NE(message(negative).find("rank 0's device -1"), std::string::npos) << message(negative);
  const int twice[] = {0, 0};
  EXPECT_NE(message(twice).find("ranks 0 and 1 are both on device 0"), std::string::npos) << message(twice);
}

// A set-up that fails on one device (here: no memory left on GPU 1) fails the whole call and returns. With a
// thread per rank calling ncclCommInitRank, rank 1 got its error and rank 0 was still waiting for it 60 s later
// (docs/PERF.md, 2026-11-30, machine DL). The communicators NCCL made before the failure are aborted.
TEST(NcclComm, CreateAllFailingOnOneDeviceReturns) {
  KIMIRT_REQUIRE_TWO_GPUS();
  const int devices[] = {0, 1};
  // A set-up and its teardown first: what NCCL keeps for the process's later communicators is then taken.
  EXPECT_EQ(NcclComm::create_all(devices).size(), 2u);
  const auto free_on_0 = [] {
    const DeviceGuard on_zero(0);
    size_t free_bytes = 0, total = 0;
    KIMIRT_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    return free_bytes;
  };
  const size_t free_before = free_on_0();
  void* hog = nullptr;
  {
    const DeviceGuard on_one(1);
    size_t free_bytes = 0, total = 0;
    KIMIRT_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    // All but 1 MiB, taken in one piece (what the driver keeps back may refuse the last few MiB).
    for (size_t ask = free_bytes - (size_t{1} << 20); ask > (size_t{1} << 30); ask -= size_t{64} << 20) {
      if (cudaMalloc(&hog, ask) == cudaSuccess) break;
      (void)cudaGetLastError();
      hog = nullptr;
    }
    ASSERT_NE(hog, nullptr) << "could not fill GPU 1";
  }
  auto result = std::async(std::launch::async, [&devices] {
    try {
      NcclComm::create_all(devices);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  });
  if (result.wait_for(std::chrono::seconds(120)) != std::future_status::ready) {
    std::fprintf(stderr, "NcclComm.CreateAllFailingOnOneDeviceReturns: create_all still blocked after 120 s\n");
    std::_Exit(1);  // the future's destructor would wait for the blocked call
  }
  const std::string error = result.get();
  {
    const DeviceGuard on_one(1);
    KIMIRT_CUDA_CHECK(cudaFree(hog));
  }
  EXPECT_NE(error.find("setting up 2 ranks on devices 0, 1 failed"), std::string::npos) << error;
  // The communicator rank 0 had made is gone with its device memory, and the group sets up once the memory is
  // back.
  const size_t free_after = free_on_0();
  EXPECT_LE(free_before - std::min(free_before, free_after), size_t{4} << 20)
      << "GPU 0 lost " << (free_before - std::min(free_before, free_after)) / 1024 << " KiB to the failed set-up";
  std::fprintf(stderr, "GPU 0 free before / after the failed set-up: %zu / %zu bytes\n", free_before, free_after);
  EXPECT_EQ(NcclComm::create_all(devices).size(), 2u);
}

TEST(NcclComm, BadRankIsAnError) {
  KIMIRT_REQUIRE_GPU();
  EXPECT_THROW(NcclComm::create(nccl_new_id(), 2, 2, 0), Error);
}

// A negative split color is refused with a message naming it, as the host communicators do (NCCL would hand
// back no communicator for -1).
TEST(NcclComm, NegativeSplitColorIsAnError) {
  KIMIRT_REQUIRE_GPU();
  auto comm = NcclComm::create(nccl_new_id(), 1, 0, 0);
  for (const int color : {-1, -7}) {
    try {
      comm->split(color, 0);
      ADD_FAILURE() << "color " << color << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("color"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(comm->split(0, 0)->size(), 1) << "the communicator still splits after a refusal";
}

}  // namespace
}  // namespace kimirt::cuda
