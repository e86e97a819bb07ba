// The harness and the entry point of the CUDA benchmarks.
#include "cuda_bench.h"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "kimirt/base/error.h"
#include "kimirt/cuda/check.h"
#include "kimirt/cuda/stream.h"

namespace kimirt::bench::cuda {

using kimirt::cuda::Event;

double Result::roofline_ratio() const {
  if (time_us <= 0) return 0.0;
  const double t_mem = bytes / (kCopyTBps * 1e12) * 1e6;
  const double t_flop = flops / (peak_tflops * 1e12) * 1e6;
  return std::max(t_mem, t_flop) / time_us;
}

void Context::add(Result r) {
  fmt::print("  {:<10} {:<58} {:>10.2f} us {:>9.1f} GB/s {:>8.1f} TFLOP/s  roofline {:>5.2f}  {}\n", r.suite, r.name,
             r.time_us, r.gbps(), r.tflops(), r.roofline_ratio(), r.note);
  std::fflush(stdout);
  results.push_back(std::move(r));
}

double time_us(Context& ctx, const std::function<void()>& fn, int reps, int samples, int warmup) {
  if (ctx.quick) samples = std::max(5, samples / 3);
  for (int i = 0; i < warmup; ++i) fn();
  KIMIRT_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
  std::vector<float> t;
  Event start(true), stop(true);
  for (int s = 0; s < samples; ++s) {
    start.record(ctx.stream);
    for (int r = 0; r < reps; ++r) fn();
    stop.record(ctx.stream);
    stop.synchronize();
    t.push_back(kimirt::cuda::elapsed_ms(start, stop) * 1000.0f / reps);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

L2Rotation l2_rotation(double bytes) {
  const int copies = static_cast<int>(std::clamp(std::ceil(256e6 / bytes), 1.0, 64.0));
  // Whole rounds of the copies: a graph of 6 calls over 5 copies would read copy 0 twice in a row (0 at its
  // end, 0 again at the next launch's start), the second time from L2.
  return {copies, copies * ((6 + copies - 1) / copies)};
}

std::vector<kimirt::cuda::DeviceBuffer> copies_of(const kimirt::cuda::DeviceBuffer& src, int n, cudaStream_t stream) {
  std::vector<kimirt::cuda::DeviceBuffer> v;
  for (int i = 0; i < n; ++i) {
    v.emplace_back(src.size());
    KIMIRT_CUDA_CHECK(cudaMemcpyAsync(v.back().data(), src.data(), src.size(), cudaMemcpyDeviceToDevice, stream));
  }
  return v;
}

std::vector<kimirt::cuda::DeviceBuffer> buffers(int n, uint64_t bytes) {
  std::vector<kimirt::cuda::DeviceBuffer> v;
  for (int i = 0; i < n; ++i) v.emplace_back(bytes);
  return v;
}

double time_rotated(Context& ctx, int copies, const std::function<void(int)>& op, int reps) {
  int call = 0;
  return time_us(
      ctx, [&] { op(call++ % copies); }, reps);
}

double graph_time_us(Context& ctx, int calls, const std::function<void(int)>& launch,
                     unsigned long long instantiate_flags, int reps) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  KIMIRT_CUDA_CHECK(cudaStreamBeginCapture(ctx.stream, cudaStreamCaptureModeThreadLocal));
  for (int r = 0; r < calls; ++r) launch(r);
  KIMIRT_CUDA_CHECK(cudaStreamEndCapture(ctx.stream, &graph));
  KIMIRT_CUDA_CHECK(cudaGraphInstantiateWithFlags(&exec, graph, instantiate_flags));
  const double us = time_us(
                        ctx, [&] { KIMIRT_CUDA_CHECK(cudaGraphLaunch(exec, ctx.stream)); }, reps) /
                    calls;
  KIMIRT_CUDA_CHECK(cudaGraphExecDestroy(exec));
  KIMIRT_CUDA_CHECK(cudaGraphDestroy(graph));
  return us;
}

std::vector<std::pair<std::string, Suite>>& mutable_suites() {
  static std::vector<std::pair<std::string, Suite>> s;
  return s;
}
void register_suite(const std::string& name, Suite suite) { mutable_suites().emplace_back(name, std::move(suite)); }
const std::vector<std::pair<std::string, Suite>>& suites() { return mutable_suites(); }

int run_main(int argc, char** argv) {
  CLI::App app{"kimirt-bench: CUDA kernel benchmarks (achieved GB/s, TFLOP/s and the ratio to the H200 ceilings)"};
  std::string only, json_path, table_path;
  bool quick = false;
  app.add_option("--only", only, "comma-separated suites (gemm, dense, mla, sampling, stream); default all");
  app.add_option("--json", json_path, "write the results as JSON to this file");
  app.add_option("--gemm-table", table_path,
                 "write the measured GEMM dispatch table (text) to this file (runs of the whole gemm suite)");
  app.add_flag("--quick", quick, "fewer samples");
  std::string filter;
  app.add_option("--filter", filter,
                 "run only the cases whose name contains this text (honoured by mla, gemm and stream; gemm writes "
                 "its table only without a filter; for profiling one kernel)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (!kimirt::cuda::gpu_available()) {
      fmt::print(stderr, "kimirt-bench: no CUDA device\n");
      return 1;
    }
    std::set<std::string> selected;
    std::stringstream ss(only);
    for (std::string s; std::getline(ss, s, ',');) {
      if (!s.empty()) selected.insert(s);
    }
    for (const auto& s : selected) {
      const bool known = std::any_of(suites().begin(), suites().end(), [&](const auto& p) { return p.first == s; });
      KIMIRT_CHECK(known, "--only: unknown suite \"{}\"", s);
    }
    Context ctx;
    ctx.device = kimirt::cuda::query_device(0);
    ctx.quick = quick;
    ctx.filter = filter;
    ctx.gemm_table_path = table_path;
    kimirt::cuda::Stream stream;
    ctx.stream = stream.get();
    fmt::print("{}\n", kimirt::cuda::describe(ctx.device));
    fmt::print("ceilings: copy {} TB/s, BF16 GEMM {} TFLOP/s, FP8 GEMM {} TFLOP/s\n", kCopyTBps, kBf16Tflops,
               kFp8Tflops);
    for (const auto& [name, suite] : suites()) {
      if (!selected.empty() && !selected.count(name)) continue;
      fmt::print("== {}\n", name);
      try {
        suite(ctx);
      } catch (const Error& e) {
        fmt::print("  {} FAILED: {}\n", name, e.what());
        ctx.results.push_back(Result{name, "FAILED", 0, 0, 0, e.what()});
      }
    }
    fmt::print("\n{:<10} {:<58} {:>10} {:>10} {:>9} {:>9}  {}\n", "suite", "case", "time us", "GB/s", "TFLOP/s",
               "roofline", "note");
    for (const Result& r : ctx.results) {
      fmt::print("{:<10} {:<58} {:>10.2f} {:>10.1f} {:>9.1f} {:>9.2f}  {}\n", r.suite, r.name, r.time_us, r.gbps(),
                 r.tflops(), r.roofline_ratio(), r.note);
    }
    if (!json_path.empty()) {
      nlohmann::json j;
      j["device"] = ctx.device.name;
      j["ceilings"] = {{"copy_TBps", kCopyTBps}, {"bf16_TFLOPs", kBf16Tflops}, {"fp8_TFLOPs", kFp8Tflops}};
      for (const Result& r : ctx.results) {
        j["results"].push_back({{"suite", r.suite},
                                {"name", r.name},
                                {"time_us", r.time_us},
                                {"bytes", r.bytes},
                                {"flops", r.flops},
                                {"GBps", r.gbps()},
                                {"TFLOPs", r.tflops()},
                                {"roofline_ratio", r.roofline_ratio()},
                                {"peak_TFLOPs", r.peak_tflops},
                                {"note", r.note}});
      }
      std::ofstream(json_path) << j.dump(1) << "\n";
    }
  } catch (const Error& e) {
    fmt::print(stderr, "kimirt-bench: {}\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace kimirt::bench::cuda

// Weak: if the CPU benchmarks bring their own main, theirs wins and should call run_main for "cuda".
__attribute__((weak)) int main(int argc, char** argv) { return kimirt::bench::cuda::run_main(argc, argv); }
