// Device queries through the CUDA runtime.
#include "kimirt/cuda/device.h"

#include <cuda.h>

#include <fmt/format.h>

#include "kimirt/base/error.h"
#include "kimirt/cuda/check.h"

namespace kimirt::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    // No driver / no device: clear the sticky error so later calls are not confused by it.
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

bool gpu_available() { return device_count() > 0; }

bool context_unused(int ordinal) {
  using DeviceGet = CUresult (*)(CUdevice*, int);
  using GetState = CUresult (*)(CUdevice, unsigned int*, int*);
  static const auto entry = [](const char* name) -> void* {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return fn;
  };
  static const auto device_get = reinterpret_cast<DeviceGet>(entry("cuDeviceGet"));
  static const auto get_state = reinterpret_cast<GetState>(entry("cuDevicePrimaryCtxGetState"));
  if (!device_get || !get_state) return false;
  CUdevice device{};
  unsigned int flags = 0;
  int active = 0;
  return device_get(&device, ordinal) == CUDA_SUCCESS && get_state(device, &flags, &active) == CUDA_SUCCESS &&
         active == 0;
}

DeviceInfo query_device(int ordinal) {
  const int n = device_count();
  KIMIRT_CHECK(ordinal >= 0 && ordinal < n, "CUDA device {} does not exist ({} device(s) visible)", ordinal, n);
  cudaDeviceProp prop{};
  KIMIRT_CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal));
  DeviceInfo info;
  info.ordinal = ordinal;
  info.name = prop.name;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  info.sm_count = prop.multiProcessorCount;
  info.total_memory = prop.totalGlobalMem;
  info.l2_cache_bytes = prop.l2CacheSize;
  info.smem_per_block_optin = static_cast<int>(prop.sharedMemPerBlockOptin);
  info.memory_bus_bits = prop.memoryBusWidth;
  KIMIRT_CUDA_CHECK(cudaDeviceGetAttribute(&info.memory_clock_khz, cudaDevAttrMemoryClockRate, ordinal));
  // The free memory needs the device current. The previous device is made current again only when its context
  // is active in this process: a rank's thread that asks about its GPU before making it current must not grow a context
  // (and its hundreds of MB) on GPU 0, which another rank's arena was sized on.
  int current = 0;
  KIMIRT_CUDA_CHECK(cudaGetDevice(&current));
  const bool restore = current != ordinal && !context_unused(current);
  if (current != ordinal) KIMIRT_CUDA_CHECK(cudaSetDevice(ordinal));
  size_t free_bytes = 0, total_bytes = 0;
  const cudaError_t err = cudaMemGetInfo(&free_bytes, &total_bytes);
  if (restore) KIMIRT_CUDA_CHECK(cudaSetDevice(current));
  KIMIRT_CUDA_CHECK(err);
  info.free_memory = free_bytes;
  return info;
}

std::string describe(const DeviceInfo& info) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  return fmt::format(
      "device {}: {}, sm_{}{}, {} SMs\n"
      "  memory: {:.1f} GiB total, {:.1f} GiB free, {}-bit bus at {} MHz\n"
      "  L2: {:.1f} MiB, shared memory per block (opt-in): {} KiB",
      info.ordinal, info.name, info.cc_major, info.cc_minor, info.sm_count, info.total_memory / kGiB,
      info.free_memory / kGiB, info.memory_bus_bits, info.memory_clock_khz / 1000,
      info.l2_cache_bytes / (1024.0 * 1024.0), info.smem_per_block_optin / 1024);
}

void require_supported(const DeviceInfo& info) {
  KIMIRT_CHECK(info.cc_major == 9 && info.cc_minor == 0,
               "CUDA device {} ({}) has compute capability {}.{}; this build targets sm_90a (Hopper) only",
               info.ordinal, info.name, info.cc_major, info.cc_minor);
}

namespace {

void switch_to(int ordinal) {
  const cudaError_t err = cudaSetDevice(ordinal);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    fail("CUDA device {}: cannot make it current ({})", ordinal, cudaGetErrorString(err));
  }
}

}  // namespace

DeviceGuard::DeviceGuard(int ordinal) {
  KIMIRT_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ == ordinal) return;
  switch_to(ordinal);
  switched_ = true;
}

DeviceGuard::DeviceGuard(int ordinal, std::nothrow_t) noexcept {
  if (cudaGetDevice(&previous_) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  if (previous_ == ordinal) return;
  switched_ = cudaSetDevice(ordinal) == cudaSuccess;
  if (!switched_) (void)cudaGetLastError();
}

DeviceGuard::~DeviceGuard() {
  if (switched_ && !context_unused(previous_)) (void)cudaSetDevice(previous_);
}

int current_device() {
  int ordinal = 0;
  KIMIRT_CUDA_CHECK(cudaGetDevice(&ordinal));
  return ordinal;
}

void set_current_device(int ordinal) {
  if (current_device() != ordinal) switch_to(ordinal);
}

}  // namespace kimirt::cuda
