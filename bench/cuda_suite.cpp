// The CUDA benchmarks (bench/cuda/) as the `cuda` suite of kimirt-bench, in CUDA builds.
#ifdef KIMIRT_HAVE_CUDA
#include "bench_registry.h"
#include "cuda/cuda_bench.h"

namespace {
const kimirt::bench::RegisterSuite kCudaSuite(
    "cuda", "GPU kernels: GEMMs, dense ops, MLA, sampling (GB/s, TFLOP/s, ratio to the H200 ceilings)",
    kimirt::bench::cuda::run_main);
}  // namespace
#endif
