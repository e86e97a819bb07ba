// Per-device cache of the dynamic shared memory limits already granted to kernels.
#include "kimirt/cuda/kernel_attr.h"

#include <map>
#include <mutex>
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

}  // namespace kimirt::cuda
