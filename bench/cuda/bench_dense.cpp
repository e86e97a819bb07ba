// Memory-bound dense ops at K3 sizes (prefill 4096 tokens and decode batches): bytes moved against the
// 4.25 TB/s copy ceiling.
#include <fmt/format.h>

#include "cuda_bench.h"
#include "kimirt/cuda/attn_res.h"
#include "kimirt/cuda/check.h"
#include "kimirt/cuda/embedding.h"
#include "kimirt/cuda/gemm_lt.h"
#include "kimirt/cuda/memory.h"
#include "kimirt/cuda/quantize_fp8.h"
#include "kimirt/cuda/random_fill.h"
#include "kimirt/cuda/rms_norm.h"
#include "kimirt/cuda/router.h"
#include "kimirt/cuda/situ.h"

namespace kimirt::bench::cuda {
namespace {

using namespace kimirt::cuda;
using bf16 = __nv_bfloat16;

void dense_suite(Context& ctx) {
  const int64_t H = 7168;
  for (int64_t t : {4096, 256, 64, 8, 1}) {
    DeviceBuffer x(t * H * 2), r(t * H * 2), out(t * H * 2), w(H * 2);
    fill_uniform(x.as<bf16>(), t * H, -1, 1, 1, ctx.stream);
    fill_uniform(r.as<bf16>(), t * H, -1, 1, 2, ctx.stream);
    fill_uniform(w.as<bf16>(), H, 0.5f, 1.5f, 3, ctx.stream);
    double us =
        time_us(ctx, [&] { rms_norm(ctx.stream, x.as<bf16>(), H, w.as<bf16>(), out.as<bf16>(), H, t, H, 1e-5f); });
    ctx.add({"dense", fmt::format("rms_norm [{}, {}]", t, H), us, 2.0 * t * H * 2, 0, ""});
    us = time_us(ctx, [&] {
      add_rms_norm(ctx.stream, x.as<bf16>(), H, r.as<bf16>(), H, r.as<bf16>(), H, w.as<bf16>(), out.as<bf16>(), H, t, H,
                   1e-5f);
    });
    ctx.add({"dense", fmt::format("add_rms_norm [{}, {}]", t, H), us, 4.0 * t * H * 2, 0, ""});
    // The same norm writing an FP8 GEMM's input (E4M3 codes and a scale per 128) instead of bf16.
    {
      DeviceBuffer q(fp8_pad_m(t) * H), s(fp8_x_scale_count(t, H) * 4);
      us = time_us(ctx, [&] {
        rms_norm_fp8(ctx.stream, x.as<bf16>(), H, w.as<bf16>(), q.as<uint8_t>(), s.as<float>(), t, H, 1e-5f);
      });
      ctx.add({"dense", fmt::format("rms_norm [{}, {}] fp8 out", t, H), us, t * H * (2.0 + 1.0 + 4.0 / 128), 0, ""});
      // With the residual: x and r read, the sum written back over r, the codes and scales written.
      us = time_us(ctx, [&] {
        add_rms_norm_fp8(ctx.stream, x.as<bf16>(), H, r.as<bf16>(), H, r.as<bf16>(), H, w.as<bf16>(), q.as<uint8_t>(),
                         s.as<float>(), t, H, 1e-5f);
      });
      ctx.add(
          {"dense", fmt::format("add_rms_norm [{}, {}] fp8 out", t, H), us, t * H * (6.0 + 1.0 + 4.0 / 128), 0, ""});
    }

    // AttnRes over 9 candidates (the final mix) + norm.
    const int count = 9;
    std::vector<DeviceBuffer> cand;
    std::vector<const bf16*> ptrs;
    for (int i = 0; i < count; ++i) {
      cand.emplace_back(t * H * 2);
      fill_uniform(cand.back().as<bf16>(), t * H, -1, 1, 10 + i, ctx.stream);
      ptrs.push_back(cand.back().as<bf16>());
    }
    DeviceBuffer u(H * 4);
    fill_uniform(u.as<float>(), H, -0.05f, 0.05f, 4, ctx.stream);
    for (auto [kernel, name] :
         {std::pair{AttnResKernel::kPipelined, "pipelined"}, {AttnResKernel::kPerToken, "per token"}}) {
      us = time_us(ctx, [&] {
        attn_res_mix_norm(ctx.stream, ptrs.data(), count, H, t, H, u.as<float>(), 1e-5f, w.as<bf16>(), 1e-5f,
                          x.as<bf16>(), out.as<bf16>(), H, kernel);
      });
      ctx.add({"dense", fmt::format("attn_res 9 cand + norm [{}, {}] {}", t, H, name), us, (count + 2.0) * t * H * 2, 0,
               ""});
    }

    // SiTU on the shared experts' [gate | up] (2 × 6144) and on the dense MLP (2 × 33792).
    for (int64_t width : {6144, 33792}) {
      if (t == 4096 && width == 33792) continue;  // 1.1 GB of input; the 6144 case is the same kernel
      DeviceBuffer gu(t * 2 * width * 2), o(t * width * 2), q(fp8_pad_m(t) * width), s(fp8_x_scale_count(t, width) * 4);
      fill_uniform(gu.as<bf16>(), t * 2 * width, -6, 6, 5, ctx.stream);
      const Glu act{Glu::Kind::kSitu, 4.0f, 25.0f};
      us = time_us(ctx, [&] {
        glu(ctx.stream, act, gu.as<bf16>(), gu.as<bf16>() + width, 2 * width, o.as<bf16>(), width, t, width);
      });
      ctx.add({"dense", fmt::format("situ [{}, 2x{}] bf16", t, width), us, 3.0 * t * width * 2, 0, ""});
      us = time_us(ctx, [&] {
        glu_fp8(ctx.stream, act, gu.as<bf16>(), gu.as<bf16>() + width, 2 * width, q.as<uint8_t>(), s.as<float>(), t,
                width);
      });
      ctx.add({"dense", fmt::format("situ [{}, 2x{}] fp8 out", t, width), us, t * width * (4.0 + 1.0), 0, ""});
    }

    // The activation quantizer of the FP8 GEMMs (1 x 128 groups) on a [t, 7168] input: reads 2 bytes per value,
    // writes 1 and a scale per 128.
    {
      DeviceBuffer xin(t * H * 2), q(fp8_pad_m(t) * H), s(fp8_x_scale_count(t, H) * 4);
      fill_uniform(xin.as<bf16>(), t * H, -3, 3, 8, ctx.stream);
      us = time_us(ctx, [&] { quantize_fp8_act(ctx.stream, xin.as<bf16>(), H, t, H, q.as<uint8_t>(), s.as<float>()); });
      ctx.add({"dense", fmt::format("quantize_fp8_act [{}, {}]", t, H), us, t * H * (3.0 + 4.0 / 128), 0, ""});
    }

    // Router top-16 of 896 (the logits GEMM is in the gemm suite).
    DeviceBuffer logits(t * 896 * 4), bias(896 * 4), ids(t * 16 * 4), wts(t * 16 * 4);
    fill_uniform(logits.as<float>(), t * 896, -4, 4, 6, ctx.stream);
    fill_uniform(bias.as<float>(), 896, -0.1f, 0.1f, 7, ctx.stream);
    us = time_us(ctx, [&] {
      router_topk(ctx.stream, logits.as<float>(), 896, bias.as<float>(), t, RouterParams{896, 16, true, 1.0f},
                  ids.as<int32_t>(), wts.as<float>());
    });
    ctx.add({"dense", fmt::format("router top16/896 [{} tokens]", t), us, t * (896 * 4.0 + 16 * 8), 0, ""});

    // KDA gated norm [t, 96 heads, 128].
    DeviceBuffer g(t * 12288 * 2), o2(t * 12288 * 2), wf(128 * 4), xo(t * 12288 * 2);
    fill_uniform(g.as<bf16>(), t * 12288, -4, 4, 8, ctx.stream);
    fill_uniform(xo.as<bf16>(), t * 12288, -2, 2, 9, ctx.stream);
    fill_uniform(wf.as<float>(), 128, 0.5f, 1.5f, 9, ctx.stream);
    us = time_us(ctx, [&] {
      rms_norm_gated(ctx.stream, xo.as<bf16>(), 12288, g.as<bf16>(), 12288, wf.as<float>(), o2.as<bf16>(), 12288, t, 96,
                     128, 1e-5f);
    });
    ctx.add({"dense", fmt::format("gated rms_norm [{}, 96, 128]", t), us, 3.0 * t * 12288 * 2, 0, ""});
  }
  // Embedding gather of 4096 tokens from the 163840-row table.
  const int64_t vocab = 163840, t = 4096;
  DeviceBuffer table(vocab * H * 2), ids(t * 4), out(t * H * 2);
  fill_uniform(table.as<bf16>(), vocab * H, -1, 1, 1, ctx.stream);
  std::vector<int32_t> h(t);
  for (int64_t i = 0; i < t; ++i) h[i] = static_cast<int32_t>((i * 7919) % vocab);
  KIMIRT_CUDA_CHECK(cudaMemcpy(ids.data(), h.data(), t * 4, cudaMemcpyHostToDevice));
  const double us = time_us(
      ctx, [&] { embedding_gather(ctx.stream, table.as<bf16>(), vocab, H, ids.as<int32_t>(), t, out.as<bf16>(), H); });
  ctx.add({"dense", "embedding gather [4096, 7168]", us, 2.0 * t * H * 2, 0, ""});
}

const Registrar kRegister("dense", dense_suite);

}  // namespace
}  // namespace kimirt::bench::cuda
