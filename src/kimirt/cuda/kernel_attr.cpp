// Per-device caches of the dynamic shared memory limits granted to kernels and of cluster occupancy; the
// launch configuration's attributes.
#include "kimirt/cuda/kernel_attr.h"

#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "kimirt/cuda/check.h"

namespace kimirt::cuda {

void ensure_dynamic_smem(const void* kernel, int bytes) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, int> granted;
  int device = 0;
  KIMIRT_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  int& have = granted[{kernel, device}];
  if (have >= bytes) return;
  KIMIRT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  have = bytes;
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

int max_active_clusters(const void* kernel, int blocks, int threads, int smem) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int, int, int>, int> cache;
  int device = 0;
  KIMIRT_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  auto [it, fresh] = cache.try_emplace({device, kernel, blocks, threads, smem}, 0);
  if (fresh) {
    // A grid of 1024 clusters of `blocks`: whole clusters of a compiled-in shape too (up to 1024 blocks).
    LaunchConfig config(dim3(static_cast<unsigned>(blocks) * 1024), threads, smem, nullptr);
    config.cluster(blocks);
    const cudaError_t err = cudaOccupancyMaxActiveClusters(&it->second, kernel, config.get());
    if (err != cudaSuccess) cache.erase(it);
    KIMIRT_CUDA_CHECK(err);
  }
  return it->second;
}

int max_blocks_per_sm(const void* kernel, int threads, int smem) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int, int>, int> cache;
  int device = 0;
  KIMIRT_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  auto [it, fresh] = cache.try_emplace({device, kernel, threads, smem}, 0);
  if (fresh) {
    const cudaError_t err =
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&it->second, kernel, threads, static_cast<size_t>(smem));
    if (err != cudaSuccess) cache.erase(it);
    KIMIRT_CUDA_CHECK(err);
  }
  return it->second;
}

}  // namespace kimirt::cuda
