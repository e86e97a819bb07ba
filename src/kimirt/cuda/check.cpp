// The throwing side of check.h: formats the failure and raises kimirt::Error.
#include "kimirt/cuda/check.h"

#include "kimirt/base/error.h"

namespace kimirt::cuda {

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  // The runtime also keeps a failed call's error as the thread's last error, which the next launch check
  // (cudaGetLastError) would report as its own: a caller that catches this error and goes on would see it again,
  // blamed on an unrelated kernel. Cleared here (a sticky error, which breaks the context, stays regardless).
  (void)cudaGetLastError();
  fail("CUDA error {} ({}): {} in {} at {}:{}", cudaGetErrorName(err), static_cast<int>(err), cudaGetErrorString(err),
       call, file, line);
}

void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  fail("cuBLASLt error {} ({}): {} in {} at {}:{}", cublasLtGetStatusName(status), static_cast<int>(status),
       cublasLtGetStatusString(status), call, file, line);
}

void throw_nccl_error(int result, const char* error_string, const char* call, const char* file, int line) {
  fail("NCCL error {}: {} in {} at {}:{}", result, error_string ? error_string : "(no text)", call, file, line);
}

void throw_invalid_argument(const std::string& message) { throw Error(message); }

}  // namespace kimirt::cuda
