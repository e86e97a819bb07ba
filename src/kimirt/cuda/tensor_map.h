// Tensor maps: the descriptors of the bulk tensor copies (TMA) that the Hopper kernels issue. Encoding one
// is a driver call (cuTensorMapEncodeTiled, found through the runtime's entry-point query so that nothing
// links libcuda directly); the map is then passed to the kernel as a __grid_constant__ parameter.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>

namespace kimirt::cuda {

// A tensor of rank `rank` (1..5): dims innermost first (elements), strides of dims 1.. in bytes (multiples
// of 16), the box copied per request, the shared-memory swizzle. Elements outside the tensor read as zeros
// and are not written. `what` names the tensor in the error thrown when the map breaks a rule below or the
// driver refuses it.
CUtensorMap make_tensor_map(CUtensorMapDataType type, int rank, const void* base, const uint64_t* dims,
                            const uint64_t* strides_bytes, const uint32_t* box, CUtensorMapSwizzle swizzle,
                            const std::string& what);

// The first rule of cuTensorMapEncodeTiled's (non-interleaved) that the arguments break, in words naming the
// field, its value and the limit; empty when none (the driver may still refuse for a reason not listed here).
// Rules: rank 1..5; base 16-byte aligned; every dim in 1..2^32 and box in 1..256; strides multiples of 16 below
// 2^40; the box's inner row a multiple of 16 bytes and, under a swizzle, within its 32/64/128-byte span.
std::string tensor_map_problem(CUtensorMapDataType type, int rank, const void* base, const uint64_t* dims,
                               const uint64_t* strides_bytes, const uint32_t* box, CUtensorMapSwizzle swizzle);

}  // namespace kimirt::cuda
