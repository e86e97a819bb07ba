// Error checks for the CUDA runtime, cuBLASLt and NCCL, for kernel launches and for the arguments of the
// device ops. Every failure becomes a kimirt::Error naming the call (or the op and field), file:line and
// the library's own error string.
//
// This header is free of fmt on purpose: nvcc cannot compile fmt's consteval format strings, so .cu files
// pass plain strings (built with cat()) to throwing helpers that live in check.cpp.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <sstream>
#include <string>

namespace kimirt::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line);
// NCCL is linked by the communication layer, not here: its macro passes ncclGetErrorString's text in.
[[noreturn]] void throw_nccl_error(int result, const char* error_string, const char* call, const char* file, int line);
// A bad argument to a device op (shape, pointer alignment, capacity): the message names op and field.
[[noreturn]] void throw_invalid_argument(const std::string& message);

// Concatenates anything streamable: host-side message building without fmt.
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream s;
  (s << ... << args);
  return s.str();
}

}  // namespace kimirt::cuda

#define KIMIRT_CUDA_CHECK(call)                                                 \
  do {                                                                          \
    const cudaError_t kimirt_err_ = (call);                                     \
    if (kimirt_err_ != cudaSuccess) [[unlikely]] {                              \
      ::kimirt::cuda::throw_cuda_error(kimirt_err_, #call, __FILE__, __LINE__); \
    }                                                                           \
  } while (0)

// After every <<<...>>>: catches bad launch configurations (too much shared memory, grid too large) at the
// launch site instead of at the next unrelated synchronizing call.
#define KIMIRT_CUDA_CHECK_LAUNCH() KIMIRT_CUDA_CHECK(cudaGetLastError())

#define KIMIRT_CUBLAS_CHECK(call)                                                    \
  do {                                                                               \
    const cublasStatus_t kimirt_status_ = (call);                                    \
    if (kimirt_status_ != CUBLAS_STATUS_SUCCESS) [[unlikely]] {                      \
      ::kimirt::cuda::throw_cublas_error(kimirt_status_, #call, __FILE__, __LINE__); \
    }                                                                                \
  } while (0)

// Use where <nccl.h> is included.
#define KIMIRT_NCCL_CHECK(call)                                                                                 \
  do {                                                                                                          \
    const auto kimirt_nccl_ = (call);                                                                           \
    if (kimirt_nccl_ != ncclSuccess) [[unlikely]] {                                                             \
      ::kimirt::cuda::throw_nccl_error(static_cast<int>(kimirt_nccl_), ncclGetErrorString(kimirt_nccl_), #call, \
                                       __FILE__, __LINE__);                                                     \
    }                                                                                                           \
  } while (0)

// KIMIRT_CUDA_REQUIRE(cond, "op: field ", value, " must be ..."): the message is only built on failure.
#define KIMIRT_CUDA_REQUIRE(cond, ...)                                          \
  do {                                                                          \
    if (!(cond)) [[unlikely]] {                                                 \
      ::kimirt::cuda::throw_invalid_argument(::kimirt::cuda::cat(__VA_ARGS__)); \
    }                                                                           \
  } while (0)

namespace kimirt::cuda {

// A norm's epsilon: finite and >= 0 (a negative one gives NaN rows for any row with mean(x^2) below it, a NaN one
// NaN everywhere), checked by every norm op, naming it.
inline void check_norm_eps(const char* op, const char* field, float eps) {
  KIMIRT_CUDA_REQUIRE(std::isfinite(eps) && eps >= 0.0f, op, ": ", field, " ", eps, " must be a finite number >= 0");
}

}  // namespace kimirt::cuda
