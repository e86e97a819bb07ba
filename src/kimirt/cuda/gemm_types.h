// Shared vocabulary of the GEMM entry points.
#pragma once

namespace kimirt::cuda {

// Element type of a GEMM's output (inputs are BF16 or E4M3; accumulation is always fp32).
enum class OutType { kBF16, kF32 };

}  // namespace kimirt::cuda
