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

}  // namespace

CUtensorMap make_tensor_map(CUtensorMapDataType type, int rank, const void* base, const uint64_t* dims,
                            const uint64_t* strides_bytes, const uint32_t* box, CUtensorMapSwizzle swizzle,
                            const std::string& what) {
  KIMIRT_CUDA_REQUIRE(rank >= 1 && rank <= 5, "tensor map: rank ", rank, " outside 1..5 for ", what);
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
  KIMIRT_CUDA_REQUIRE(r == CUDA_SUCCESS, "tensor map: cuTensorMapEncodeTiled failed (error ", static_cast<int>(r),
                      ") for ", what);
  return map;
}

}  // namespace kimirt::cuda
