// CUDA benchmark harness: registry of suites, CUDA-event timing (warm-up, then the median of many
// samples), results with their ratio to the measured ceilings of the H200 (shared/device/README.md).
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <string>
#include <vector>

#include "kimirt/cuda/device.h"
#include "kimirt/cuda/memory.h"

namespace kimirt::bench::cuda {

// Measured on the H200 with PyTorch (device/README.md, 2026-11-29).
inline constexpr double kCopyTBps = 4.25;     // device-to-device copy, bytes read + written
inline constexpr double kBf16Tflops = 794.0;  // BF16 GEMM 8192³, upper end of 694–794
inline constexpr double kFp8Tflops = 1456.0;  // FP8 GEMM 8192³, per-tensor scales

struct Result {
  std::string suite;
  std::string name;
  double time_us = 0.0;
  double bytes = 0.0;  // moved (read + written)
  double flops = 0.0;
  std::string note;
  double peak_tflops = kBf16Tflops;  // the tensor ceiling of the math done (kFp8Tflops for FP8 GEMMs)
  double gbps() const { return time_us > 0 ? bytes / time_us * 1e-3 : 0.0; }
  double tflops() const { return time_us > 0 ? flops / time_us * 1e-6 : 0.0; }
  // Fraction of the roofline: max(bytes / copy bandwidth, flops / tensor peak) / time.
  double roofline_ratio() const;
};

struct Context {
  kimirt::cuda::DeviceInfo device;
  cudaStream_t stream = nullptr;
  bool quick = false;
  std::string gemm_table_path;  // where the GEMM suite writes its dispatch table ("" = don't)
  std::string filter;           // --filter: run only the cases whose name contains this ("" = all)
  bool wants(const std::string& case_name) const {
    return filter.empty() || case_name.find(filter) != std::string::npos;
  }
  std::vector<Result> results;
  void add(Result r);
};

// Median time of fn() in microseconds: `warmup` calls, then `samples` samples of `reps` back-to-back
// calls each, timed with CUDA events on ctx.stream.
double time_us(Context& ctx, const std::function<void()>& fn, int reps = 10, int samples = 15, int warmup = 3);

// How many copies of an operand of `bytes` a timed graph rotates over, so that a call does not find its bytes in
// the 50-60 MB L2 from the calls before (256 MB in all, 1 to 64 copies), and how many calls the graph holds
// (whole rounds of the copies, at least 6 calls, so that the graph launch's own latency is amortized). Below
// 4 MB the 64 copies hold less than 256 MB, and below about 0.9 MB they fit in L2 together: such operands (the
// decode-batch rows of the dense ops, the router at 64 tokens or fewer, sampling at B=1) are read partly or
// wholly from L2, as in a decode step their producer's output would be. None is evidence for a target.
struct L2Rotation {
  int copies, calls;
};
L2Rotation l2_rotation(double bytes);

// `n` buffers holding what `src` holds (an input in l2_rotation's copies), or `n` fresh ones of `bytes` (outputs).
std::vector<kimirt::cuda::DeviceBuffer> copies_of(const kimirt::cuda::DeviceBuffer& src, int n, cudaStream_t stream);
std::vector<kimirt::cuda::DeviceBuffer> buffers(int n, uint64_t bytes);

// time_us of op(c), call i taking c = i % copies: the ops that claim DRAM bandwidth rotate their operands over
// l2_rotation's copies, so that no call finds them in L2 from the call before.
double time_rotated(Context& ctx, int copies, const std::function<void(int)>& op, int reps = 10);

// Time per call of `calls` calls of launch(r) (r = 0 .. calls - 1) captured as one CUDA graph on ctx.stream, as a
// decode step runs them: device time without the host's launch overhead. The graph is instantiated with
// `instantiate_flags` and each sample times `reps` launches of it.
double graph_time_us(Context& ctx, int calls, const std::function<void(int)>& launch,
                     unsigned long long instantiate_flags = 0, int reps = 4);

using Suite = std::function<void(Context&)>;
void register_suite(const std::string& name, Suite suite);
const std::vector<std::pair<std::string, Suite>>& suites();

struct Registrar {
  Registrar(const std::string& name, Suite suite) { register_suite(name, std::move(suite)); }
};

int run_main(int argc, char** argv);

}  // namespace kimirt::bench::cuda
