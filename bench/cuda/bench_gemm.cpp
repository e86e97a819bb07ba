// GEMM benchmarks at Kimi K3 shapes: the skinny kernel against cuBLASLt for decode batches (and the
// dispatch table that follows from it), cuBLASLt BF16 and the two FP8 block-scale paths at M = 64, 256, 1024
// and 4096 (the table's FP8 rows), our FP8 kernel's configurations and the ceiling's 8192³ at M = 4096.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "cuda_bench.h"
#include "kimirt/cuda/fp8_block_gemm.h"
#include "kimirt/cuda/gemm_dispatch.h"
#include "kimirt/cuda/gemm_lt.h"
#include "kimirt/cuda/gemv.h"
#include "kimirt/cuda/memory.h"
#include "kimirt/cuda/quantize_fp8.h"
#include "kimirt/cuda/random_fill.h"

namespace kimirt::bench::cuda {
namespace {

using namespace kimirt::cuda;
using bf16 = __nv_bfloat16;

struct Shape {
  const char* name;
  int64_t n, k;
  OutType out;
};

// Decode-time weights of one K3 layer (full, TP = 1) and the LM head.
const Shape kShapes[] = {
    {"mla.q_a 1536x7168", 1536, 7168, OutType::kBF16},       {"mla.q_b 18432x1536", 18432, 1536, OutType::kBF16},
    {"mla.kv_a 576x7168", 576, 7168, OutType::kBF16},        {"g/o 12288x7168", 12288, 7168, OutType::kBF16},
    {"o_proj 7168x12288", 7168, 12288, OutType::kBF16},      {"shared gate_up 12288x7168", 12288, 7168, OutType::kBF16},
    {"shared down 7168x6144", 7168, 6144, OutType::kBF16},   {"latent down 3584x7168", 3584, 7168, OutType::kBF16},
    {"latent up 7168x3584", 7168, 3584, OutType::kBF16},     {"router 896x7168 f32", 896, 7168, OutType::kF32},
    {"lm_head 163840x7168 f32", 163840, 7168, OutType::kF32}};

void gemm_suite(Context& ctx) {
  DeviceBuffer ws(64 << 20), sws(16 << 20);
  GemmLt lt(ws.data(), ws.size());
  GemmTable table = GemmTable::builtin();
  const int sms = ctx.device.sm_count;
  const int64_t max_k = 12288, max_m = 4096;
  DeviceBuffer x(max_m * max_k * 2);
  fill_uniform(x.as<bf16>(), max_m * max_k, -1, 1, 1, ctx.stream);
  std::string sweep_report;

  // --filter: the skinny sweeps only when the filter is part of the word "skinny" (a filter naming one shape
  // skips them all; the M = 4096 cases are chosen by their own names below).
  const bool skinny = ctx.wants("skinny");
  for (const Shape& s : skinny ? std::span<const Shape>(kShapes) : std::span<const Shape>()) {
    const uint64_t wbytes = s.n * s.k * 2;
    const int copies = l2_rotation(static_cast<double>(wbytes)).copies;
    std::vector<DeviceBuffer> w;
    for (int c = 0; c < copies; ++c) {
      w.emplace_back(wbytes);
      fill_uniform(w.back().as<bf16>(), s.n * s.k, -0.05f, 0.05f, 10 + c, ctx.stream);
    }
    const size_t esize = s.out == OutType::kF32 ? 4 : 2;
    DeviceBuffer yy(16 * s.n * esize);
    auto args = [&](int64_t m) {
      return SkinnyGemmArgs{x.as<bf16>(), s.k, w[0].as<bf16>(), s.k, yy.data(), s.out, s.n, m, s.n, s.k, 0.0f};
    };
    auto time_skinny = [&](int64_t m, const SkinnyConfig& cfg) {
      int c = 0;
      const SkinnyGemmArgs base = args(m);
      return time_us(ctx, [&] {
        SkinnyGemmArgs a = base;
        a.w = w[c++ % copies].as<bf16>();
        skinny_gemm(ctx.stream, a, sws.data(), sws.size(), sms, cfg);
      });
    };
    // Every configuration of the skinny kernels at M = 1: the fastest goes into the table for M <= 2.
    std::string line = fmt::format("  sweep {} M=1:", s.name);
    double best = INFINITY;
    SkinnyConfig best_cfg;
    std::vector<SkinnyConfig> configs;
    for (int r : {1, 2})
      for (int sp : {1, 2, 4, 8}) configs.push_back(SkinnyConfig{SkinnyConfig::Kernel::kRows, r, sp});
    configs.push_back(SkinnyConfig{SkinnyConfig::Kernel::kMma, 0, 0});
    for (const SkinnyConfig& cfg : configs) {
      const double t = time_skinny(1, cfg);
      line += fmt::format(" {} {:.2f}", skinny_config_name(cfg), t);
      if (t < best) best = t, best_cfg = cfg;
    }
    const double bytes1 = wbytes + s.k * 2.0 + s.n * static_cast<double>(esize);
    line += fmt::format(" | best {} ({:.2f} of roofline), automatic {}\n", skinny_config_name(best_cfg),
                        bytes1 / (kCopyTBps * 1e12) * 1e6 / best, skinny_config_name(skinny_gemm_config(args(1), sms)));
    fmt::print("{}", line);
    sweep_report += line;

    int max_skinny = 0;
    bool still_winning = true;
    for (int64_t m : {1, 2, 4, 8, 16}) {
      const SkinnyConfig cfg = m <= 2 ? best_cfg : SkinnyConfig{SkinnyConfig::Kernel::kMma, 0, 0};
      const double t_skinny = time_skinny(m, cfg);
      int c = 0;
      const double t_lt = time_us(ctx, [&] {
        lt.linear_bf16(ctx.stream, x.as<bf16>(), s.k, w[c++ % copies].as<bf16>(), s.k, yy.data(), s.out, s.n, m, s.n,
                       s.k);
      });
      const double bytes = wbytes + m * s.k * 2.0 + m * s.n * static_cast<double>(esize);
      const double flops = 2.0 * m * s.n * s.k;
      ctx.add({"gemm", fmt::format("skinny {} M={}", s.name, m), t_skinny, bytes, flops,
               fmt::format("{}, cuBLASLt {:.2f} us", skinny_config_name(cfg), t_lt)});
      if (m == 1) ctx.add({"gemm", fmt::format("cuBLASLt {} M=1", s.name), t_lt, bytes, flops, ""});
      // The table keeps the largest M up to which the skinny kernel wins at every measured batch.
      if (still_winning && t_skinny <= t_lt) {
        max_skinny = static_cast<int>(m);
      } else {
        still_winning = false;
      }
    }
    table.set(s.n, s.k, max_skinny, best_cfg);
  }
  fmt::print("skinny kernel sweep (us per call):\n{}", sweep_report);

  // The per-head MLA absorption products of a decode step (96 heads, strided batches): q_nope·W_UK through
  // the transposed [heads, 512, 128] layout, and ō·W_UVᵀ from kv_b's value rows.
  if (skinny) {
    const int64_t heads = 96;
    // Weights rotated over copies, as the GEMVs above: one 12.6 MB W_UK would otherwise be read from L2.
    const int copies = l2_rotation(heads * 512 * 128 * 2.0).copies;
    std::vector<DeviceBuffer> wuks, kvbs;
    for (int c = 0; c < copies; ++c) {
      wuks.emplace_back(heads * 512 * 128 * 2);
      kvbs.emplace_back(heads * 256 * 512 * 2);
      fill_uniform(wuks.back().as<bf16>(), heads * 512 * 128, -0.05f, 0.05f, 31 + 2 * c, ctx.stream);
      fill_uniform(kvbs.back().as<bf16>(), heads * 256 * 512, -0.05f, 0.05f, 32 + 2 * c, ctx.stream);
    }
    DeviceBuffer q(heads * 192 * 2 * 16), o(heads * 512 * 2 * 16), y(heads * 576 * 2 * 16);
    fill_uniform(q.as<bf16>(), heads * 192 * 16, -1, 1, 33, ctx.stream);
    fill_uniform(o.as<bf16>(), heads * 512 * 16, -1, 1, 34, ctx.stream);
    for (int64_t m : {1, 4}) {
      SkinnyGemmArgs uk{q.as<bf16>(), heads * 192, nullptr, 128, y.data(), OutType::kBF16,
                        heads * 576,  m,           512,     128, 0.0f};
      uk.batch = heads, uk.stride_x = 192, uk.stride_w = 512 * 128, uk.stride_y = 576;
      int c = 0;
      const double t_uk = time_us(ctx, [&] {
        uk.w = wuks[c++ % copies].as<bf16>();
        skinny_gemm(ctx.stream, uk, sws.data(), sws.size(), sms);
      });
      const double t_uk_lt = time_us(ctx, [&] {
        lt.batched_bf16(ctx.stream, q.as<bf16>(), heads * 192, 192, kvbs[c++ % copies].as<bf16>(), 512, 256 * 512,
                        false, y.data(), OutType::kBF16, heads * 576, 576, m, 512, 128, heads);
      });
      ctx.add({"gemm", fmt::format("skinny batched W_UK 96x512x128 M={}", m), t_uk,
               heads * 512 * 128 * 2.0 + m * heads * (128 + 512) * 2.0, 2.0 * m * heads * 512 * 128,
               fmt::format("cuBLASLt (kv_b layout) {:.2f} us", t_uk_lt)});
      SkinnyGemmArgs uv{o.as<bf16>(), heads * 512, nullptr, 512, y.data(), OutType::kBF16,
                        heads * 128,  m,           128,     512, 0.0f};
      uv.batch = heads, uv.stride_x = 512, uv.stride_w = 256 * 512, uv.stride_y = 128;
      const double t_uv = time_us(ctx, [&] {
        uv.w = kvbs[c++ % copies].as<bf16>() + 128 * 512;
        skinny_gemm(ctx.stream, uv, sws.data(), sws.size(), sms);
      });
      ctx.add({"gemm", fmt::format("skinny batched W_UV 96x128x512 M={}", m), t_uv,
               heads * 128 * 512 * 2.0 + m * heads * (128 + 512) * 2.0, 2.0 * m * heads * 512 * 128, ""});
    }
  }

  // The ceiling's own shape (8192³: 694-794 TFLOP/s with PyTorch, ../shared/device/README.md), timed here as
  // the rows below are: back-to-back calls, whose clock the power cap sets after the first milliseconds (the
  // same algorithm runs 10-15% faster in the autotuner's short bursts). The BF16 rows at M = 4096 give their
  // ratio to this run's figure as well, which separates the GPU's state from the kernels.
  constexpr std::pair<int64_t, int64_t> kLargeShapes[] = {{7168, 7168}, {18432, 1536}, {12288, 7168}, {7168, 12288}};
  bool square = ctx.wants("cuBLASLt bf16 8192x8192 M=8192");
  for (auto [n, k] : kLargeShapes) {
    square = square || ctx.wants(fmt::format("cuBLASLt bf16 {}x{} M=4096", n, k)) ||
             ctx.wants(fmt::format("FP8 block {}x{} M=4096", n, k));
  }
  double square_tflops = 0.0;
  if (square) {
    const int64_t s = 8192;
    DeviceBuffer a(s * s * 2), b(s * s * 2), c(s * s * 2);
    fill_uniform(a.as<bf16>(), s * s, -1, 1, 4, ctx.stream);
    fill_uniform(b.as<bf16>(), s * s, -0.05f, 0.05f, 5, ctx.stream);
    const double t = time_us(ctx, [&] {
      lt.linear_bf16(ctx.stream, a.as<bf16>(), s, b.as<bf16>(), s, c.data(), OutType::kBF16, s, s, s, s);
    });
    square_tflops = 2.0 * s * s * s / t * 1e-6;
    ctx.add({"gemm", "cuBLASLt bf16 8192x8192 M=8192", t, 3.0 * s * s * 2, 2.0 * s * s * s,
             "the ceiling's shape, timed as the rows below"});
  }

  // Larger batches through cuBLASLt (BF16) and the FP8 block-scale paths at the same M: a decode batch (64,
  // 256), a prefill chunk (1024) and a long prefill (4096). Each FP8 row's faster path goes into the table at
  // its M; our kernel's other configurations are compared at M = 4096 only.
  for (auto [n, k] : kLargeShapes) {
    // The weights in l2_rotation's number of copies (for the FP8 weight's size, the smaller), call i taking copy
    // i % copies: at M = 64 and 256 the products are memory-bound, and a single 28-56 MB weight would be read from
    // L2 by every call after the first.
    const int wc = l2_rotation(static_cast<double>(n * k)).copies;
    std::vector<DeviceBuffer> w, wq, wsc;
    for (int c = 0; c < wc; ++c) {
      w.emplace_back(n * k * 2), wq.emplace_back(n * k), wsc.emplace_back(fp8_w_scale_count(n, k) * 4);
      fill_uniform(w.back().as<bf16>(), n * k, -0.05f, 0.05f, 3, ctx.stream);
      if (k % 128 == 0) {
        quantize_fp8_weight(ctx.stream, w.back().as<bf16>(), n, k, wq.back().as<uint8_t>(), wsc.back().as<float>());
      }
    }
    DeviceBuffer out(max_m * n * 2);
    int call = 0;
    const auto next = [&] { return call++ % wc; };
    for (int64_t m : {64, 256, 1024, 4096}) {
      // BF16 is the FP8 rows' baseline, so it runs whenever they do.
      if (!ctx.wants(fmt::format("cuBLASLt bf16 {}x{} M={}", n, k, m)) &&
          !ctx.wants(fmt::format("FP8 block {}x{} M={}", n, k, m)))
        continue;
      const double t = time_us(ctx, [&] {
        lt.linear_bf16(ctx.stream, x.as<bf16>(), k, w[next()].as<bf16>(), k, out.data(), OutType::kBF16, n, m, n, k);
      });
      const double tflops = 2.0 * m * n * k / t * 1e-6;
      ctx.add({"gemm", fmt::format("cuBLASLt bf16 {}x{} M={}", n, k, m), t, n * k * 2.0 + m * (k + n) * 2.0,
               2.0 * m * n * k,
               m == 4096 && square_tflops > 0 ? fmt::format("{:.2f} of this run's 8192³", tflops / square_tflops)
                                              : std::string()});
      if (k % 128 != 0) continue;
      DeviceBuffer xq(fp8_pad_m(m) * k), xs(fp8_x_scale_count(m, k) * 4);
      quantize_fp8_act(ctx.stream, x.as<bf16>(), k, m, k, xq.as<uint8_t>(), xs.as<float>());
      const double t8 = time_us(ctx, [&] {
        const int c = next();
        lt.linear_fp8(ctx.stream, xq.as<uint8_t>(), xs.as<float>(), wq[c].as<uint8_t>(), wsc[c].as<float>(),
                      out.as<bf16>(), n, m, n, k, nullptr, 0);
      });
      Result r{"gemm",
               fmt::format("FP8 block {}x{} M={}", n, k, m),
               t8,
               n * k + m * k + m * n * 2.0,
               2.0 * m * n * k,
               fmt::format("{:.2f}x BF16, {:.2f} of FP8 peak (activations quantized before)", t / t8,
                           2.0 * m * n * k / t8 * 1e-6 / kFp8Tflops),
               kFp8Tflops};
      ctx.add(r);
      std::vector<Fp8BlockGemmConfig> configs = {{1, 2}};  // the default first
      if (m == 4096) configs.insert(configs.end(), {{1, 1}, {2, 1}, {2, 2}});
      for (const Fp8BlockGemmConfig cfg : configs) {
        const double tk = time_us(ctx, [&] {
          const int c = next();
          fp8_block_gemm(ctx.stream, xq.as<uint8_t>(), xs.as<float>(), wq[c].as<uint8_t>(), wsc[c].as<float>(),
                         out.as<bf16>(), n, m, n, k, ctx.device.sm_count, cfg);
        });
        const int blocks = fp8_block_gemm_blocks(m, n, ctx.device.sm_count, cfg);
        // The default configuration (cluster 1, 2 in flight) against cuBLASLt decides the table's FP8 row.
        if (cfg.cluster == 1 && cfg.in_flight == 2) {
          table.set_fp8(n, k, m, tk <= t8 ? Fp8Path::kOurs : Fp8Path::kCublasLt);
        }
        ctx.add(
            {"gemm",
             fmt::format("FP8 block (ours, cluster {}, {} in flight) {}x{} M={}", cfg.cluster, cfg.in_flight, n, k, m),
             tk, n * k + m * k + m * n * 2.0, 2.0 * m * n * k,
             fmt::format("{:.2f}x BF16, {:.2f}x cuBLASLt FP8, {:.2f} of FP8 peak, {} blocks", t / tk, t8 / tk,
                         2.0 * m * n * k / tk * 1e-6 / kFp8Tflops, blocks),
             kFp8Tflops});
      }
      const double tq = time_us(ctx, [&] {
        const int c = next();
        quantize_fp8_act(ctx.stream, x.as<bf16>(), k, m, k, xq.as<uint8_t>(), xs.as<float>());
        lt.linear_fp8(ctx.stream, xq.as<uint8_t>(), xs.as<float>(), wq[c].as<uint8_t>(), wsc[c].as<float>(),
                      out.as<bf16>(), n, m, n, k, nullptr, 0);
      });
      // The quantization reads x (2 bytes per value) and writes xq (1), which the GEMM reads again.
      ctx.add({"gemm", fmt::format("FP8 block + act quant {}x{} M={}", n, k, m), tq, n * k + m * k * 4.0 + m * n * 2.0,
               2.0 * m * n * k,
               fmt::format("{:.2f}x BF16, {:.2f} of FP8 peak", t / tq, 2.0 * m * n * k / tq * 1e-6 / kFp8Tflops),
               kFp8Tflops});
    }
  }
  // Written once the FP8 rows are in too, and only from an unfiltered run: a filtered one would leave out
  // measured rows or pass builtin ones off as measured.
  if (ctx.filter.empty() && !ctx.gemm_table_path.empty()) {
    std::ofstream(ctx.gemm_table_path) << "# measured on " << ctx.device.name << " by kimirt-bench --only gemm\n"
                                       << table.to_text();
    fmt::print("  wrote GEMM dispatch table to {}\n", ctx.gemm_table_path);
  }
  // What autotuning chose at the prefill shapes (the decode shapes are listed too), and whether any plan
  // would have wanted more workspace than the 64 MiB given.
  fmt::print("cuBLASLt plans:\n{}", lt.plans_text());
}

const Registrar kRegister("gemm", gemm_suite);

}  // namespace
}  // namespace kimirt::bench::cuda
