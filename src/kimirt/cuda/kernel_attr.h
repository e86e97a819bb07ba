// Opting kernels into more than 48 KiB of dynamic shared memory, once per (kernel, device) rather than
// on every launch (the attribute call is a driver round trip, and a decode step launches hundreds of
// kernels).
#pragma once

namespace kimirt::cuda {

// cudaFuncSetAttribute(kernel, MaxDynamicSharedMemorySize, bytes) on the current device unless an equal
// or larger value was already set there. Thread-safe.
void ensure_dynamic_smem(const void* kernel, int bytes);

}  // namespace kimirt::cuda
