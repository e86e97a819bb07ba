// Helpers of the GPU tests: skip without a device, host<->device copies, bf16 on the host, random data,
// relative errors. Every test poisons its outputs (NaN) before the run and compares with a reference
// computed on the host from the same (bf16-rounded) inputs.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kimirt/cuda/check.h"
#include "kimirt/cuda/device.h"
#include "kimirt/cuda/memory.h"
#include "kimirt/cuda/random_fill.h"
#include "kimirt/tensor/float_convert.h"

// Without a device the GPU tests skip (CI compiles them on a machine without one). On the GPU machine the
// session sets KIMIRT_EXPECT_GPU, so that a broken driver or an empty CUDA_VISIBLE_DEVICES fails every test
// instead of turning the whole suite into a green run of skips.
#define KIMIRT_REQUIRE_GPU()                                                                          \
  do {                                                                                                \
    if (!::kimirt::cuda::gpu_available()) {                                                           \
      if (std::getenv("KIMIRT_EXPECT_GPU") != nullptr) FAIL() << "KIMIRT_EXPECT_GPU: no CUDA device"; \
      GTEST_SKIP() << "no CUDA device";                                                               \
    }                                                                                                 \
  } while (0)

// KIMIRT_EXPECT_GPUS=2 (the two-GPU machine's session sets it) turns the skip into a failure there as well.
#define KIMIRT_REQUIRE_TWO_GPUS()                                                                              \
  do {                                                                                                         \
    KIMIRT_REQUIRE_GPU();                                                                                      \
    if (::kimirt::cuda::device_count() < 2) {                                                                  \
      const char* expect = std::getenv("KIMIRT_EXPECT_GPUS");                                                  \
      if (expect != nullptr && std::atoi(expect) >= 2) FAIL() << "KIMIRT_EXPECT_GPUS: fewer than two devices"; \
      GTEST_SKIP() << "needs two CUDA devices";                                                                \
    }                                                                                                          \
  } while (0)

namespace kimirt::cuda::test {

// Runs rank(0) and rank(1) on two threads (the ranks of a two-GPU test, each making its device current),
// then rethrows the first exception either threw. A rank that fails before a collective leaves the other
// waiting in it: the test then times out rather than fails, so the failure is printed as it happens.
template <class Rank>
void on_two_ranks(Rank&& rank) {
  std::exception_ptr failure[2];
  const auto run = [&](int r) {
    try {
      rank(r);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d failed: %s\n", r, e.what());
      failure[r] = std::current_exception();
    } catch (...) {
      failure[r] = std::current_exception();
    }
  };
  std::thread t0(run, 0), t1(run, 1);
  t0.join();
  t1.join();
  for (const auto& f : failure)
    if (f) std::rethrow_exception(f);
}

// Holds `stream` for about `microseconds`: work queued behind it runs late, so that a missing wait on it
// shows. A host function that sleeps, not a spinning kernel: a kernel would take an SM, and a kernel of the
// other stream that wants every SM (a persistent grid) would then wait for it too, hiding the missing wait.
inline void hold_stream(cudaStream_t stream, int microseconds) {
  auto* us = new int(microseconds);
  const cudaError_t err = cudaLaunchHostFunc(
      stream,
      [](void* p) {
        const std::unique_ptr<int> us(static_cast<int*>(p));
        std::this_thread::sleep_for(std::chrono::microseconds(*us));
      },
      us);
  if (err != cudaSuccess) delete us;
  KIMIRT_CUDA_CHECK(err);
}

// A CUDA graph of the work that capture() queues on `stream` (thread-local capture), instantiated once;
// launch() replays it there. What a decode loop does with a step: capture once, replay with new inputs.
class CapturedGraph {
 public:
  template <class F>
  CapturedGraph(cudaStream_t stream, F&& capture) : stream_(stream) {
    KIMIRT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    capture();
    KIMIRT_CUDA_CHECK(cudaStreamEndCapture(stream, &graph_));
    KIMIRT_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
  }
  ~CapturedGraph() {  // checked without throwing: a failure still fails the test
    if (exec_) {
      EXPECT_EQ(cudaGraphExecDestroy(exec_), cudaSuccess);
    }
    if (graph_) {
      EXPECT_EQ(cudaGraphDestroy(graph_), cudaSuccess);
    }
  }
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  void launch() const { KIMIRT_CUDA_CHECK(cudaGraphLaunch(exec_, stream_)); }

 private:
  cudaStream_t stream_;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

inline std::vector<float> random_vec(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Rounds to bf16 in place and returns the bf16 codes.
inline std::vector<uint16_t> to_bf16(std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    out[i] = f32_to_bf16(v[i]);
    v[i] = bf16_to_f32(out[i]);
  }
  return out;
}

inline std::vector<float> from_bf16(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_f32(v[i]);
  return out;
}

template <typename T>
DeviceBuffer upload(const std::vector<T>& host) {
  DeviceBuffer buf(host.size() * sizeof(T) + 16);
  KIMIRT_CUDA_CHECK(cudaMemcpy(buf.data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return buf;
}

template <typename T>
std::vector<T> download(const void* dev, size_t n) {
  std::vector<T> host(n);
  KIMIRT_CUDA_CHECK(cudaDeviceSynchronize());
  KIMIRT_CUDA_CHECK(cudaMemcpy(host.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

inline DeviceBuffer poisoned(size_t bytes) {
  DeviceBuffer buf(bytes + 16);
  poison(buf.data(), buf.size(), nullptr);
  return buf;
}

// Runs `call` with `stream` captured: what it queues there (and on streams it forks from it) is recorded, not
// run. Returns the text of what it threw ("accepted" when nothing) and how many nodes it queued; a call meant to
// refuse before queuing leaves 0. Work it queues on other streams is neither captured nor counted.
template <typename F>
std::pair<std::string, size_t> queued_by(cudaStream_t stream, F call) {
  KIMIRT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  std::string what = "accepted";
  try {
    call();
  } catch (const std::exception& e) {
    what = e.what();
  }
  cudaGraph_t graph = nullptr;
  KIMIRT_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  size_t nodes = 0;
  KIMIRT_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
  KIMIRT_CUDA_CHECK(cudaGraphDestroy(graph));
  return {what, nodes};
}

// Scratch as NaN: every free byte of `arena`'s step region 0xff (NaN in bf16, f16 and f32; -1 as an integer),
// queued on `stream`. A step that reads scratch it did not write itself (nothing, an earlier step's values, or
// in a graph replay the eager warm-up's) then gives NaN rather than a plausible result. compute-sanitizer's
// initcheck cannot tell: it does not see the writes of tensor-copy (TMA) stores, which cuBLASLt's kernels and
// ours make (scripts/gpu_sanitize.sh). The arena's high-water mark then counts the whole region.
inline void poison_free_step(DeviceArena& arena, cudaStream_t stream) {
  const uint64_t mark = arena.mark(), bytes = arena.step_capacity() - arena.step_used();
  if (bytes > 0) poison(arena.allocate_step(bytes, "test.poison", 1), bytes, stream);
  arena.rewind(mark);
}

// ‖out − ref‖ / ‖ref‖; any NaN in out gives +inf.
// Values [first, first + count) of v: one sequence's (or row's) part of a flat result, compared on its own so that
// a short sequence's error cannot hide in a joint norm with a long one's.
inline std::vector<float> part(const std::vector<float>& v, int64_t first, int64_t count) {
  return std::vector<float>(v.begin() + first, v.begin() + first + count);
}

inline double rel_err(const std::vector<float>& out, const std::vector<float>& ref) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (std::isnan(out[i])) return INFINITY;
    const double d = static_cast<double>(out[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// The host's 1x128 activation quantization (scale amax / 448 per group of 128, 1 for an all-zero group; codes
// x / scale rounded to E4M3, saturated) against a kernel's codes q [mp, k] and scales sc [k / 128][mp]: the
// first difference, or "" when every code and scale is the host's. The padding rows m..mp-1 must hold what the
// FP8 GEMMs read there: codes 0 under scale 1.
inline std::string act_quant_mismatch(const std::vector<float>& x, int64_t m, int64_t k, int64_t mp,
                                      const std::vector<uint8_t>& q, const std::vector<float>& sc) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t g = 0; g < k / 128; ++g) {
      float amax = 0;
      for (int j = 0; j < 128; ++j) amax = std::max(amax, std::fabs(x[i * k + g * 128 + j]));
      const float s = amax > 0 ? amax / 448.0f : 1.0f;
      if (sc[g * mp + i] != s) {
        return "scale of row " + std::to_string(i) + " group " + std::to_string(g) + ": " +
               std::to_string(sc[g * mp + i]) + " for " + std::to_string(s);
      }
      for (int j = 0; j < 128; ++j) {
        const int64_t c = i * k + g * 128 + j;
        const uint8_t want = f32_to_e4m3(x[c] / s, Overflow::kSaturate);
        if (q[c] != want) {
          return "code of row " + std::to_string(i) + " column " + std::to_string(g * 128 + j) + ": " +
                 std::to_string(q[c]) + " for " + std::to_string(want);
        }
      }
    }
  for (int64_t i = m; i < mp; ++i)
    for (int64_t g = 0; g < k / 128; ++g) {
      if (sc[g * mp + i] != 1.0f) {
        return "scale of padding row " + std::to_string(i) + " group " + std::to_string(g) + ": " +
               std::to_string(sc[g * mp + i]) + " for 1";
      }
      for (int j = 0; j < 128; ++j) {
        if (q[i * k + g * 128 + j] != 0) {
          return "code of padding row " + std::to_string(i) + " column " + std::to_string(g * 128 + j) + ": " +
                 std::to_string(q[i * k + g * 128 + j]) + " for 0";
        }
      }
    }
  return "";
}

inline std::string shape(std::initializer_list<int64_t> dims) {
  std::string s = "[";
  for (int64_t d : dims) s += (s.size() > 1 ? ", " : "") + std::to_string(d);
  return s + "]";
}

}  // namespace kimirt::cuda::test
