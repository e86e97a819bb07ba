// kernel_attr.h's reservation that keeps a kernel's blocks one per SM, on a kernel light enough that two of
// its 1024-thread blocks would otherwise share an SM (the capped GEMV grid relies on this when its registers
// no longer fill the SM). Checked by the occupancy query and by watching where and when the blocks ran.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <vector>

#include "kimirt/cuda/kernel_attr.h"
#include "test_util.h"

namespace kimirt::cuda {
namespace {

using test::download;

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// Each block holds its SM for `spin_ns` and records which SM that was, and when.
__global__ void __launch_bounds__(1024) hold_sm_kernel(uint32_t* sm, uint64_t* start, uint64_t* end, uint64_t spin_ns) {
  const uint64_t t0 = global_ns();
  while (global_ns() - t0 < spin_ns) {
  }
  if (threadIdx.x != 0) return;
  uint32_t id;
  asm volatile("mov.u32 %0, %smid;" : "=r"(id));
  sm[blockIdx.x] = id;
  start[blockIdx.x] = t0;
  end[blockIdx.x] = global_ns();
}

// Whether two blocks ran on one SM at the same time, for a grid of `blocks` launched with `smem` bytes.
bool blocks_shared_an_sm(int blocks, int smem) {
  DeviceBuffer sm(blocks * 4), start(blocks * 8), end(blocks * 8);
  hold_sm_kernel<<<blocks, 1024, smem>>>(sm.as<uint32_t>(), start.as<uint64_t>(), end.as<uint64_t>(), 20'000);
  KIMIRT_CUDA_CHECK_LAUNCH();
  KIMIRT_CUDA_CHECK(cudaDeviceSynchronize());
  const auto ids = download<uint32_t>(sm.data(), blocks);
  const auto t0 = download<uint64_t>(start.data(), blocks), t1 = download<uint64_t>(end.data(), blocks);
  std::map<uint32_t, std::vector<std::pair<uint64_t, uint64_t>>> by_sm;
  for (int b = 0; b < blocks; ++b) by_sm[ids[b]].emplace_back(t0[b], t1[b]);
  for (auto& [id, runs] : by_sm) {
    std::sort(runs.begin(), runs.end());
    for (size_t i = 1; i < runs.size(); ++i) {
      if (runs[i].first < runs[i - 1].second) return true;
    }
  }
  return false;
}

TEST(KernelAttr, SharedMemoryKeepsBlocksOnePerSm) {
  KIMIRT_REQUIRE_GPU();
  const void* kernel = reinterpret_cast<const void*>(hold_sm_kernel);
  const int sms = query_device(0).sm_count;
  const int fit = max_blocks_per_sm(kernel, 1024, 0);
  if (fit < 2) GTEST_SKIP() << "an SM holds only " << fit << " block(s) of 1024 threads here";
  // Two waves' worth of blocks: unreserved, some SM runs two at once (the check can see sharing) ...
  EXPECT_TRUE(blocks_shared_an_sm(fit * sms, 0));
  // ... reserved, no SM ever does.
  const int smem = smem_for_one_block_per_sm(kernel, 1024);
  EXPECT_GT(smem, 0);
  EXPECT_EQ(max_blocks_per_sm(kernel, 1024, smem), 1);
  EXPECT_FALSE(blocks_shared_an_sm(fit * sms, smem));
  EXPECT_EQ(smem_for_one_block_per_sm(kernel, 1024), smem);  // cached, same answer
}

}  // namespace
}  // namespace kimirt::cuda
