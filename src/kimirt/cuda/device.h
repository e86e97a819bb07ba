// What the GPU is: name, compute capability, SMs, memory. For `kimirt inspect --device`, for sizing the
// arena and for choosing launch shapes.
#pragma once

#include <cstdint>
#include <new>
#include <string>

namespace kimirt::cuda {

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int cc_major = 0;
  int cc_minor = 0;
  int sm_count = 0;
  uint64_t total_memory = 0;  // bytes
  uint64_t free_memory = 0;   // bytes, at the time of the query
  int l2_cache_bytes = 0;
  int smem_per_block_optin = 0;  // largest dynamic shared memory one block may request
  int memory_bus_bits = 0;
  int memory_clock_khz = 0;
};

// Number of visible CUDA devices; 0 (never an error) when there is no driver or no device, so that
// CPU-only machines can ask.
int device_count();
bool gpu_available();

// Whether `ordinal`'s primary context is inactive in this process, so that making it current would create it
// (cudaSetDevice does since CUDA 12), as a fresh thread's device 0 is until something uses it. False when the
// driver cannot tell.
bool context_unused(int ordinal);

// Throws kimirt::Error naming the ordinal when it does not exist. Leaves `ordinal` current when the thread's previous
// device has no active context in this process (see DeviceGuard), as reading the free memory needs it current.
DeviceInfo query_device(int ordinal = 0);

// Multi-line human-readable description ("NVIDIA H200, sm_90, 132 SMs, 139.8 GiB (138.9 free), ...").
std::string describe(const DeviceInfo& info);

// The kernels are built for sm_90a; refuse other devices with a clear message.
void require_supported(const DeviceInfo& info);

// The current device is per thread: an object bound to one GPU, called from threads that may have another
// current, must set it before every CUDA call it makes.
//
// DeviceGuard makes `ordinal` current for its lifetime, then restores the previous device unless that device's
// primary context is inactive in this process (context_unused): restoring it would create the context
// (cudaSetDevice does since CUDA 12), and a process driving GPU 1 must not grow one on GPU 0 (a fresh thread's
// current device); such a thread keeps `ordinal` current. A thread whose previous device is in use, by it or by
// another thread of the process, gets it back. On worker threads that only ever serve one device (the loader's I/O
// threads) use set_current_device. On a caller's thread (arena and upload set-up) it switches nothing when the
// caller has made the device current first, as a rank's thread does: callers driving one GPU should.
class DeviceGuard {
 public:
  explicit DeviceGuard(int ordinal);
  // For destructors and abandon paths, which cannot throw: a failed switch is ignored (the calls that follow
  // then fail and are ignored as well, which is all such a path can do).
  DeviceGuard(int ordinal, std::nothrow_t) noexcept;
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

// The calling thread's current device.
int current_device();
// Makes `ordinal` the calling thread's current device and leaves it so (see DeviceGuard for when).
void set_current_device(int ordinal);

}  // namespace kimirt::cuda
