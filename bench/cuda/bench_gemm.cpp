// GEMM benchmarks at Kimi K3 shapes: the skinny kernel against cuBLASLt for decode batches (and the
// dispatch table that follows from it), cuBLASLt BF16 at batch 64/256 and prefill 4096, and the FP8
// block-scale GEMM against BF16 at M = 4096.
#include <fmt/format.h>

#include <fstream>
#include <map>

#include "cuda_bench.h"
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

// Enough copies of W that the rotation over them does not fit the 50 MB L2.
int copies_for(uint64_t bytes) { return static_cast<int>(std::clamp<uint64_t>((256ull << 20) / bytes + 1, 1, 16)); }

void gemm_suite(Context& ctx) {
  DeviceBuffer ws(64 << 20), sws(16 << 20);
  GemmLt lt(ws.data(), ws.size());
  GemmTable table = GemmTable::builtin();
  const int sms = ctx.device.sm_count;
  const int64_t max_k = 12288, max_m = 4096;
  DeviceBuffer x(max_m * max_k * 2);
  fill_uniform(x.as<bf16>(), max_m * max_k, -1, 1, 1, ctx.stream);

  for (const Shape& s : kShapes) {
    const uint64_t wbytes = s.n * s.k * 2;
    const int copies = copies_for(wbytes);
    std::vector<DeviceBuffer> w;
    for (int c = 0; c < copies; ++c) {
      w.emplace_back(wbytes);
      fill_uniform(w.back().as<bf16>(), s.n * s.k, -0.05f, 0.05f, 10 + c, ctx.stream);
    }
    const size_t esize = s.out == OutType::kF32 ? 4 : 2;
    DeviceBuffer yy(16 * s.n * esize);
    int max_skinny = 0;
    bool still_winning = true;
    for (int64_t m : {1, 2, 4, 8, 16}) {
      int c = 0;
      const SkinnyGemmArgs base{x.as<bf16>(), s.k, w[0].as<bf16>(), s.k, yy.data(), s.out, s.n, m, s.n, s.k, 0.0f};
      const double t_skinny = time_us(ctx, [&] {
        SkinnyGemmArgs a = base;
        a.w = w[c++ % copies].as<bf16>();
        skinny_gemm(ctx.stream, a, sws.data(), sws.size(), sms);
      });
      c = 0;
      const double t_lt = time_us(ctx, [&] {
        lt.linear_bf16(ctx.stream, x.as<bf16>(), s.k, w[c++ % copies].as<bf16>(), s.k, yy.data(), s.out, s.n, m, s.n,
                       s.k);
      });
      const double bytes = wbytes + m * s.k * 2.0 + m * s.n * static_cast<double>(esize);
      const double flops = 2.0 * m * s.n * s.k;
      ctx.add({"gemm", fmt::format("skinny {} M={}", s.name, m), t_skinny, bytes, flops,
               fmt::format("cuBLASLt {:.2f} us", t_lt)});
      if (m == 1) ctx.add({"gemm", fmt::format("cuBLASLt {} M=1", s.name), t_lt, bytes, flops, ""});
      // The table keeps the largest M up to which the skinny kernel wins at every measured batch.
      if (still_winning && t_skinny <= t_lt) {
        max_skinny = static_cast<int>(m);
      } else {
        still_winning = false;
      }
    }
    table.set(s.n, s.k, max_skinny);
  }
  if (!ctx.gemm_table_path.empty()) {
    std::ofstream(ctx.gemm_table_path) << "# measured on " << ctx.device.name << " by kimirt-bench --only gemm\n"
                                       << table.to_text();
    fmt::print("  wrote GEMM dispatch table to {}\n", ctx.gemm_table_path);
  }

  // Larger batches through cuBLASLt (BF16) and the FP8 block-scale path at M = 4096.
  for (auto [n, k] : {std::pair<int64_t, int64_t>{7168, 7168}, {18432, 1536}, {12288, 7168}, {7168, 12288}}) {
    DeviceBuffer w(n * k * 2), out(max_m * n * 2);
    fill_uniform(w.as<bf16>(), n * k, -0.05f, 0.05f, 3, ctx.stream);
    for (int64_t m : {64, 256, 4096}) {
      const double t = time_us(ctx, [&] {
        lt.linear_bf16(ctx.stream, x.as<bf16>(), k, w.as<bf16>(), k, out.data(), OutType::kBF16, n, m, n, k);
      });
      ctx.add({"gemm", fmt::format("cuBLASLt bf16 {}x{} M={}", n, k, m), t, n * k * 2.0 + m * (k + n) * 2.0,
               2.0 * m * n * k, ""});
      if (m != 4096 || k % 128 != 0) continue;
      DeviceBuffer wq(n * k), wsc(fp8_w_scale_count(n, k) * 4), xq(fp8_pad_m(m) * k), xs(fp8_x_scale_count(m, k) * 4);
      quantize_fp8_weight(ctx.stream, w.as<bf16>(), n, k, wq.as<uint8_t>(), wsc.as<float>());
      quantize_fp8_act(ctx.stream, x.as<bf16>(), k, m, k, xq.as<uint8_t>(), xs.as<float>());
      const double t8 = time_us(ctx, [&] {
        lt.linear_fp8(ctx.stream, xq.as<uint8_t>(), xs.as<float>(), wq.as<uint8_t>(), wsc.as<float>(), out.as<bf16>(),
                      n, m, n, k, nullptr, 0);
      });
      Result r{"gemm",
               fmt::format("FP8 block {}x{} M={}", n, k, m),
               t8,
               n * k + m * k + m * n * 2.0,
               2.0 * m * n * k,
               fmt::format("{:.2f}x BF16, {:.2f} of FP8 peak", t / t8, 2.0 * m * n * k / t8 * 1e-6 / kFp8Tflops)};
      ctx.add(r);
      const double tq = time_us(ctx, [&] {
        quantize_fp8_act(ctx.stream, x.as<bf16>(), k, m, k, xq.as<uint8_t>(), xs.as<float>());
        lt.linear_fp8(ctx.stream, xq.as<uint8_t>(), xs.as<float>(), wq.as<uint8_t>(), wsc.as<float>(), out.as<bf16>(),
                      n, m, n, k, nullptr, 0);
      });
      ctx.add({"gemm", fmt::format("FP8 block + act quant {}x{} M={}", n, k, m), tq, n * k + m * k * 3.0 + m * n * 2.0,
               2.0 * m * n * k, fmt::format("{:.2f}x BF16", t / tq)});
    }
  }
}

const Registrar kRegister("gemm", gemm_suite);

}  // namespace
}  // namespace kimirt::bench::cuda
