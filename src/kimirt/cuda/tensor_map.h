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
// and are not written. `what` names the tensor in the error thrown when the driver refuses the map.
CUtensorMap make_tensor_map(CUtensorMapDataType type, int rank, const void* base, const uint64_t* dims,
                            const uint64_t* strides_bytes, const uint32_t* box, CUtensorMapSwizzle swizzle,
                            const std::string& what);

}  // namespace kimirt::cuda
