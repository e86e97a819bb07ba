// Kernel attributes and launch configurations: opting kernels into more than 48 KiB of dynamic shared
// memory once per (kernel, device) rather than on every launch (the attribute call is a driver round trip,
// and a decode step launches hundreds of kernels); the cudaLaunchKernelEx configuration with the launch
// attributes our kernels use (thread-block clusters, programmatic dependent launch); the number of
// clusters, or of blocks per SM, that fit on the device, and the shared memory that keeps blocks one per SM.
#pragma once

#include <cuda_runtime_api.h>

namespace kimirt::cuda {

// cudaFuncSetAttribute(kernel, MaxDynamicSharedMemorySize, bytes) on the current device unless an equal
// or larger value was already set there. Thread-safe.
void ensure_dynamic_smem(const void* kernel, int bytes);

// A launch configuration for cudaLaunchKernelEx: grid, threads, dynamic shared memory and stream, plus
//   cluster(n)           blocks in clusters of n along x (n > 1; 1 adds nothing);
//   overlap_previous()   programmatic dependent launch: the kernel may start before the stream's previous
//                        kernel has ended and must wait for it (griddepcontrol.wait) before using its output;
//   cooperative()        every block resident at once, or the launch fails.
// cfg.attrs points into the object, so it is neither copied nor moved.
class LaunchConfig {
 public:
  LaunchConfig(dim3 grid, int threads, int smem, cudaStream_t stream);
  LaunchConfig(const LaunchConfig&) = delete;
  LaunchConfig& operator=(const LaunchConfig&) = delete;
  LaunchConfig& cluster(int blocks);
  LaunchConfig& overlap_previous(bool on = true);
  LaunchConfig& cooperative(bool on = true);
  const cudaLaunchConfig_t* get() const { return &cfg_; }

 private:
  cudaLaunchAttribute& add(cudaLaunchAttributeID id);
  cudaLaunchConfig_t cfg_{};
  cudaLaunchAttribute attrs_[3]{};
};

// Clusters of `blocks` blocks of `kernel` (threads and dynamic shared memory per block) that can be resident
// at once on the current device: a cluster must fit on one GPC, so with one block per SM this can be below
// SMs / blocks. blocks = 1 for a kernel whose cluster shape is compiled in (__cluster_dims__): the query
// takes it from the kernel. Cached per (device, kernel, blocks, threads, smem); throws when the query fails.
int max_active_clusters(const void* kernel, int blocks, int threads, int smem);

// Blocks of `kernel` (threads and dynamic shared memory per block) that one SM of the current device holds
// at once. Cached per (device, kernel, threads, smem); throws when the query fails.
int max_blocks_per_sm(const void* kernel, int threads, int smem);

// Dynamic shared memory to launch `kernel` with (blocks of `threads` threads) so that an SM holds exactly one
// of its blocks, for a grid that must keep as many SMs as it has blocks: 0 when its registers or static shared
// memory already see to that, else more than half of an SM's (the kernel is opted in to it). Cached per
// (device, kernel, threads); throws when no amount gives exactly one.
int smem_for_one_block_per_sm(const void* kernel, int threads);

}  // namespace kimirt::cuda
