#include "kimirt/cuda/tensor_map.h"

#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <mutex>

#include "kimirt/cuda/check.h"

namespace kimirt::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    cudaDriverEntryPointQueryResult q{};
    void* fn = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess) {
      encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    }
    (void)cudaGetLastError();
  });
  KIMIRT_CUDA_REQUIRE(encode, "tensor map: the driver offers no cuTensorMapEncodeTiled (a Hopper driver is needed)");
  return encode;
}

// Bytes per element of the types our kernels map; 0 for the others, whose size-bound rules are then left to the
// driver.
int element_bytes(CUtensorMapDataType type) {
  switch (type) {
    case CU_TENSOR_MAP_DATA_TYPE_UINT8:
      return 1;
    case CU_TENSOR_MAP_DATA_TYPE_UINT16:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
    case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16:
      return 2;
    case CU_TENSOR_MAP_DATA_TYPE_UINT32:
    case CU_TENSOR_MAP_DATA_TYPE_INT32:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ:
    case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32:
    case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ:
      return 4;
    case CU_TENSOR_MAP_DATA_TYPE_UINT64:
    case CU_TENSOR_MAP_DATA_TYPE_INT64:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT64:
      return 8;
    default:
      return 0;
  }
}

int swizzle_span_bytes(CUtensorMapSwizzle swizzle) {
  switch (swizzle) {
    case CU_TENSOR_MAP_SWIZZLE_32B:
      return 32;
    case CU_TENSOR_MAP_SWIZZLE_64B:
      return 64;
    case CU_TENSOR_MAP_SWIZZLE_128B:
    case CU_TENSOR_MAP_SWIZZLE_128B_ATOM_32B:
    case CU_TENSOR_MAP_SWIZZLE_128B_ATOM_32B_FLIP_8B:
    case CU_TENSOR_MAP_SWIZZLE_128B_ATOM_64B:
      return 128;
    default:
      return 0;
  }
}

}  // namespace

std::string tensor_map_problem(CUtensorMapDataType type, int rank, const void* base, const uint64_t* dims,
                               const uint64_t* strides_bytes, const uint32_t* box, CUtensorMapSwizzle swizzle) {
  if (rank < 1 || rank > 5) return cat("rank ", rank, " outside 1..5");
  if (reinterpret_cast<uintptr_t>(base) % 16 != 0) return cat("base address ", base, " not 16-byte aligned");
  for (int i = 0; i < rank; ++i) {
    if (dims[i] == 0 || dims[i] > (uint64_t{1} << 32)) return cat("dims[", i, "] = ", dims[i], " outside 1..2^32");
    if (box[i] == 0 || box[i] > 256) return cat("box[", i, "] = ", box[i], " outside 1..256");
  }
  for (int i = 0; i + 1 < rank; ++i) {
    if (strides_bytes[i] % 16 != 0 || strides_bytes[i] >= (uint64_t{1} << 40)) {
      return cat("strides_bytes[", i, "] = ", strides_bytes[i], " not a multiple of 16 below 2^40");
    }
  }
  const int elem = element_bytes(type);
  if (elem != 0) {
    const uint64_t inner = uint64_t{box[0]} * elem;
    if (inner % 16 != 0) return cat("box[0] = ", box[0], " elements = ", inner, " bytes, not a multiple of 16");
    const int span = swizzle_span_bytes(swizzle);
    if (span != 0 && inner > static_cast<uint64_t>(span)) {
      return cat("box[0] = ", box[0], " elements = ", inner, " bytes, past the swizzle's ", span, "-byte span");
    }
  }
  return {};
}

CUtensorMap make_tensor_map(CUtensorMapDataType type, int rank, const void* base, const uint64_t* dims,
                            const uint64_t* strides_bytes, const uint32_t* box, CUtensorMapSwizzle swizzle,
                            const std::string& what) {
  const std::string problem = tensor_map_problem(type, rank, base, dims, strides_bytes, box, swizzle);
  KIMIRT_CUDA_REQUIRE(problem.empty(), "tensor map for ", what, ": ", problem);
  const auto encode = tensor_map_encoder();
  cuuint64_t d[5];
  cuuint64_t s[4];
  cuuint32_t b[5], elem_strides[5];
  for (int i = 0; i < rank; ++i) {
    d[i] = dims[i];
    b[i] = box[i];
    elem_strides[i] = 1;
    if (i + 1 < rank) s[i] = strides_bytes[i];
  }
  CUtensorMap map;
  const CUresult r = encode(&map, type, static_cast<cuuint32_t>(rank), const_cast<void*>(base), d, s, b, elem_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) [[unlikely]] {
    // A refusal the rules above did not foresee: the whole shape, to compare with the driver's documentation.
    std::string shape;
    for (int i = 0; i < rank; ++i) {
      shape +=
          cat(i ? "; " : "", "dim ", dims[i], " box ", box[i], i + 1 < rank ? cat(" stride ", strides_bytes[i]) : "");
    }
    throw_invalid_argument(cat("tensor map for ", what, ": cuTensorMapEncodeTiled failed (error ", static_cast<int>(r),
                               ") for data type ", static_cast<int>(type), ", swizzle ", static_cast<int>(swizzle),
                               ", ", shape));
  }
  return map;
}

}  // namespace kimirt::cuda
