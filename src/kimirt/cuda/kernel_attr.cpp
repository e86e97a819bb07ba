// Per-device caches of the dynamic shared memory limits granted to kernels, of occupancy (clusters, blocks
// per SM) and of the reservation that keeps a kernel's blocks one per SM; the launch configuration's
// attributes.
#include "kimirt/cuda/kernel_attr.h"

#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "kimirt/cuda/check.h"

namespace kimirt::cuda {

void ensure_dynamic_smem(const void* kernel, int bytes) {
  int device = 0;
  KIMIRT_CUDA_CHECK(cudaGetDevice(&device));
  // Every launch asks: a thread's own copy of what it has seen granted answers without the lock, which the
  // rank threads of one process would otherwise take in turn on every launch.
  thread_local std::map<std::pair<const void*, int>, int> seen;
  int& known = seen[{kernel, device}];
  if (known >= bytes) return;
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, int> granted;
  std::lock_guard<std::mutex> lock(mu);
  int& have = granted[{kernel, device}];
  if (have < bytes) {
    KIMIRT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    have = bytes;
  }
  known = have;
}

LaunchConfig::LaunchConfig(dim3 grid, int threads, int smem, cudaStream_t stream) {
  cfg_.gridDim = grid;
  cfg_.blockDim = dim3(static_cast<unsigned>(threads));
  cfg_.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg_.stream = stream;
  cfg_.attrs = attrs_;
  cfg_.numAttrs = 0;
}

cudaLaunchAttribute& LaunchConfig::add(cudaLaunchAttributeID id) {
  for (unsigned i = 0; i < cfg_.numAttrs; ++i) {
    if (attrs_[i].id == id) return attrs_[i];
  }
  KIMIRT_CUDA_REQUIRE(cfg_.numAttrs < sizeof(attrs_) / sizeof(attrs_[0]), "LaunchConfig: too many attributes");
  cudaLaunchAttribute& a = attrs_[cfg_.numAttrs++];
  a = cudaLaunchAttribute{};
  a.id = id;
  return a;
}

LaunchConfig& LaunchConfig::cluster(int blocks) {
  KIMIRT_CUDA_REQUIRE(blocks >= 1, "LaunchConfig: cluster of ", blocks, " blocks");
  if (blocks > 1) {
    cudaLaunchAttribute& a = add(cudaLaunchAttributeClusterDimension);
    a.val.clusterDim.x = static_cast<unsigned>(blocks);
    a.val.clusterDim.y = 1;
    a.val.clusterDim.z = 1;
  }
  return *this;
}

LaunchConfig& LaunchConfig::overlap_previous(bool on) {
  if (on) add(cudaLaunchAttributeProgrammaticStreamSerialization).val.programmaticStreamSerializationAllowed = 1;
  return *this;
}

LaunchConfig& LaunchConfig::cooperative(bool on) {
  if (on) add(cudaLaunchAttributeCooperative).val.cooperative = 1;
  return *this;
}

namespace {

// The value `compute` gives for `key` on the current device, computed once per (device, key) under one lock
// per call site; a failing computation (it throws) leaves no entry, so a later call tries again.
template <typename Key, typename Compute>
int cached_per_device(std::mutex& mu, std::map<std::pair<int, Key>, int>& cache, const Key& key, Compute compute) {
  int device = 0;
  KIMIRT_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  const auto it = cache.find({device, key});
  if (it != cache.end()) return it->second;
  const int value = compute(device);
  cache.emplace(std::pair{device, key}, value);
  return value;
}

}  // namespace

int max_active_clusters(const void* kernel, int blocks, int threads, int smem) {
  static std::mutex mu;
  static std::map<std::pair<int, std::tuple<const void*, int, int, int>>, int> cache;
  return cached_per_device(mu, cache, std::tuple{kernel, blocks, threads, smem}, [&](int) {
    // A grid of 1024 clusters of `blocks`: whole clusters of a compiled-in shape too (up to 1024 blocks).
    LaunchConfig config(dim3(static_cast<unsigned>(blocks) * 1024), threads, smem, nullptr);
    config.cluster(blocks);
    int clusters = 0;
    KIMIRT_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, config.get()));
    return clusters;
  });
}

int max_blocks_per_sm(const void* kernel, int threads, int smem) {
  static std::mutex mu;
  static std::map<std::pair<int, std::tuple<const void*, int, int>>, int> cache;
  return cached_per_device(mu, cache, std::tuple{kernel, threads, smem}, [&](int) {
    int blocks = 0;
    KIMIRT_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, static_cast<size_t>(smem)));
    return blocks;
  });
}

int smem_for_one_block_per_sm(const void* kernel, int threads) {
  static std::mutex mu;
  static std::map<std::pair<int, std::tuple<const void*, int>>, int> cache;
  return cached_per_device(mu, cache, std::tuple{kernel, threads}, [&](int device) {
    int reserve = 0;
    if (max_blocks_per_sm(kernel, threads, 0) > 1) {
      // Two blocks then need more than the SM holds, whatever each also takes (static shared memory, the
      // system's per-block reservation): each asks for more than half of it.
      int per_sm = 0;
      KIMIRT_CUDA_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
      reserve = per_sm / 2 + 16;
      ensure_dynamic_smem(kernel, reserve);
    }
    const int blocks = max_blocks_per_sm(kernel, threads, reserve);
    KIMIRT_CUDA_REQUIRE(blocks == 1, "smem_for_one_block_per_sm: ", blocks, " blocks of ", threads,
                        " threads per SM with ", reserve, " bytes of dynamic shared memory (want exactly 1)");
    return reserve;
  });
}

}  // namespace kimirt::cuda
