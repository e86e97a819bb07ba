// The set-up of a group of ranks: how many ranks a process runs (in-process threads, or one rank under
// mpirun, where --tp must agree with the launcher), and that a failing rank releases the ranks waiting for
// it in a collective and its own error is the one reported.
#include "kimirt/runtime/rank_group.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "common/error_of.h"
#include "common/limited_child.h"
#include "kimirt/base/error.h"
#include "kimirt/base/thread_pool.h"
#include "kimirt/comm/mpi_comm.h"

#ifdef KIMIRT_HAVE_CUDA
#include "kimirt/cuda/device.h"
#endif

namespace kimirt::runtime {
namespace {

using test::error_of;
using ::testing::HasSubstr;

TEST(RankGroup, RunsOneThreadPerRankWithItsOwnRank) {
  std::vector<int> seen(4, -1);
  run_local_ranks(4, [&](Comm& comm) {
    int64_t v = comm.rank();
    comm.all_reduce_sum(&v, 1, DType::kI64);
    EXPECT_EQ(v, 6);
    seen[static_cast<size_t>(comm.rank())] = comm.size();
  });
  EXPECT_EQ(seen, (std::vector<int>{4, 4, 4, 4}));
}

TEST(RankGroup, RanksWhoseThreadsCannotStartReleaseTheOthers) {
  if (!test::kAddressSpaceLimitWorks) GTEST_SKIP() << "sanitizer build: no address-space limit";
  // 64 MiB of address space left: a handful of thread stacks; the ranks that start wait in a barrier for
  // the ones that never will.
  const int code = test::run_in_limited_child(uint64_t{64} << 20, [] {
    try {
      run_local_ranks(1000, [](Comm& comm) { comm.barrier(); });
    } catch (const Error& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
      return std::string(e.what()).find("a group of 1000 ranks: only ") != std::string::npos ? 0 : 3;
    }
    return 2;
  });
  EXPECT_EQ(code, 0) << "2: every rank started; 3: another message; 134: std::terminate; 142: it hung";
}

TEST(RankGroup, AFailingRankReleasesTheOthersAndItsErrorIsRethrown) {
  std::string error;
  std::vector<std::string> others(3);
  try {
    run_local_ranks(3, [&](Comm& comm) {
      if (comm.rank() == 1) fail("rank one broke");
      try {
        float v = 1.0f;
        comm.all_reduce_sum(&v, 1, DType::kF32);  // would wait for rank 1 forever
      } catch (const Error& e) {
        others[static_cast<size_t>(comm.rank())] = e.what();
        throw;
      }
    });
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_EQ(error, "rank one broke");
  EXPECT_THAT(others[0], HasSubstr("aborted"));
  EXPECT_THAT(others[2], HasSubstr("rank 1 failed: rank one broke"));
}

#ifdef KIMIRT_HAVE_CUDA
// NCCL ranks cannot release each other: a failure is held back and printed only if the group hangs after
// it (DelayedReport). A group that ends says it once, through the error its caller gets.
TEST(RankGroup, OnGpusAFailureTheGroupOutlivesIsSaidOnce) {
  if (cuda::device_count() < 2) GTEST_SKIP() << "needs two GPUs";
  std::string error;
  testing::internal::CaptureStderr();
  try {
    run_ranks(plan_launch(Device::kCuda, 2), [](Comm& comm) {
      if (comm.rank() == 1) fail("rank one broke");
    });
  } catch (const Error& e) {
    error = e.what();
  }
  const std::string printed = testing::internal::GetCapturedStderr();
  EXPECT_EQ(error, "rank one broke");
  EXPECT_THAT(printed, ::testing::Not(HasSubstr("rank one broke")));
}
#endif

TEST(RankGroup, OutsideMpiTheRanksLiveInThisProcess) {
  if (launched_under_mpi()) GTEST_SKIP() << "this test program runs under an MPI launcher";
  const RankLaunch one = plan_launch(Device::kCpu, 0);
  EXPECT_EQ(one.world_size, 1);
  EXPECT_FALSE(one.per_process);
  const RankLaunch four = plan_launch(Device::kCpu, 4);
  EXPECT_EQ(four.world_size, 4);
  EXPECT_FALSE(four.per_process);
}

// Sets the variables mpirun gives each process, for the duration of a scope.
class FakeMpiLaunch {
 public:
  FakeMpiLaunch(int size, int rank) {
    setenv("OMPI_COMM_WORLD_SIZE", std::to_string(size).c_str(), 1);
    setenv("OMPI_COMM_WORLD_RANK", std::to_string(rank).c_str(), 1);
  }
  ~FakeMpiLaunch() {
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("OMPI_COMM_WORLD_RANK");
  }
};

TEST(RankGroup, OneMpiProcessWithoutMpiRunsItsRanksItself) {
  if (launched_under_mpi()) GTEST_SKIP() << "this test program runs under an MPI launcher";
  if (mpi_built()) GTEST_SKIP() << "built with MPI: a launched process is one rank";
  FakeMpiLaunch launch(1, 0);
  const RankLaunch l = plan_launch(Device::kCpu, 2);
  EXPECT_EQ(l.world_size, 2);
  EXPECT_FALSE(l.per_process);
}

TEST(RankGroup, UnderMpirunEachProcessIsOneRankAndTpMustAgree) {
  if (launched_under_mpi()) GTEST_SKIP() << "this test program runs under an MPI launcher";
  FakeMpiLaunch launch(2, 1);
  ASSERT_TRUE(launched_under_mpi());  // the environment says so, whatever the build
  if (!mpi_built()) {
    // The two processes could not meet: refused, where each used to run a whole group by itself.
    EXPECT_THAT(error_of([] { plan_launch(Device::kCpu, 0); }), HasSubstr("built without MPI"));
    return;
  }
  const RankLaunch l = plan_launch(Device::kCpu, 0);
  EXPECT_EQ(l.world_size, 2);
  EXPECT_TRUE(l.per_process);
  EXPECT_EQ(l.process_rank, 1);
  EXPECT_EQ(plan_launch(Device::kCpu, 2).world_size, 2);
  try {
    plan_launch(Device::kCpu, 4);
    ADD_FAILURE() << "--tp 4 under a launch of 2 processes was accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("--tp 4"));
    EXPECT_THAT(e.what(), HasSubstr("mpirun started 2"));
  }
}

TEST(RankGroup, DefaultThreadsShareTheHostBetweenTheProcessesMpirunStartedThere) {
  // Unbound processes each see all 64 CPUs: a quarter each, not 64 threads each.
  EXPECT_EQ(threads_per_process(64, 64, 4), 16u);
  // Bound to a 32-core socket that two of the four share: still a quarter of the host.
  EXPECT_EQ(threads_per_process(32, 64, 4), 16u);
  // Bound to one core each (OpenMPI's default for two processes): one thread, not a time-sliced 32.
  EXPECT_EQ(threads_per_process(1, 64, 2), 1u);
  // One process: its mask (taskset, a container's cpuset).
  EXPECT_EQ(threads_per_process(6, 64, 1), 6u);
  // More processes than CPUs, or nothing known: still one thread each.
  EXPECT_EQ(threads_per_process(64, 64, 200), 1u);
  EXPECT_EQ(threads_per_process(0, 0, 0), 1u);
  // In a container of 8 CPUs on a 64-CPU host, 4 unbound ranks: 2 each (the host's count gave them 8 each).
  EXPECT_EQ(threads_per_process(8, 8, 4), 2u);
  EXPECT_EQ(count_cpu_list("0-3,8,10-11"), 7u);
  EXPECT_EQ(count_cpu_list("5"), 1u);
  EXPECT_EQ(count_cpu_list(""), 0u);
  EXPECT_EQ(count_cpu_list("3-1"), 0u);
  EXPECT_EQ(count_cpu_list("0-x"), 0u);
}

TEST(RankGroup, DefaultThreadsUnderAFakeLaunchOfFourProcessesOnThisHost) {
  if (launched_under_mpi()) GTEST_SKIP() << "this test program runs under an MPI launcher";
  const size_t alone = default_threads();
  EXPECT_EQ(alone, hardware_threads());
  EXPECT_TRUE(default_threads_note().empty());
  FakeMpiLaunch launch(4, 0);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4", 1);
  // Against the cpuset when the kernel shows one (every test machine of ours is a container), else the online CPUs.
  size_t shared = static_cast<size_t>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  for (const char* path : {"/sys/fs/cgroup/cpuset/cpuset.effective_cpus", "/sys/fs/cgroup/cpuset.cpus.effective"}) {
    std::ifstream f(path);  // the code reads v2 first, then v1: here v1 first, and the last one found wins
    std::string list;
    if (f && std::getline(f, list) && count_cpu_list(list) > 0) shared = count_cpu_list(list);
  }
  EXPECT_EQ(default_threads(), std::max<size_t>(1, std::min(alone, shared / 4)));
  unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
}

}  // namespace
}  // namespace kimirt::runtime
