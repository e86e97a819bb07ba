// Memory-bound dense ops at K3 sizes (prefill 4096 tokens and decode batches): bytes moved against the
// 4.25 TB/s copy ceiling.
#include <fmt/format.h>

#include <functional>
#include <vector>

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

// The ops below claim DRAM bandwidth: each row's buffers come in l2_rotation's number of sets (256 MB in all, or
// one set when a call moves that much) and call i uses set i % copies (time_rotated). A row of [4096, 7168] moves
// 88-235 MB, more than the 50 MB L2 but not by much; the decode batches' rows fit in it whole.
void dense_suite(Context& ctx) {
  const int64_t H = 7168;
  for (int64_t t : {4096, 256, 64, 8, 1}) {
    DeviceBuffer x0(t * H * 2), r0(t * H * 2), w(H * 2);
    fill_uniform(x0.as<bf16>(), t * H, -1, 1, 1, ctx.stream);
    fill_uniform(r0.as<bf16>(), t * H, -1, 1, 2, ctx.stream);
    fill_uniform(w.as<bf16>(), H, 0.5f, 1.5f, 3, ctx.stream);
    // The norms' sets: enough for the one that moves least (the FP8 output, 3 bytes per value).
    const int nc = l2_rotation(3.0 * t * H).copies;
    const std::vector<DeviceBuffer> x = copies_of(x0, nc, ctx.stream), out = buffers(nc, t * H * 2);
    std::vector<DeviceBuffer> r = copies_of(r0, nc, ctx.stream);
    double us = time_rotated(ctx, nc, [&](int c) {
      rms_norm(ctx.stream, x[c].as<bf16>(), H, w.as<bf16>(), out[c].as<bf16>(), H, t, H, 1e-5f);
    });
    ctx.add({"dense", fmt::format("rms_norm [{}, {}]", t, H), us, 2.0 * t * H * 2, 0, ""});
    us = time_rotated(ctx, nc, [&](int c) {
      add_rms_norm(ctx.stream, x[c].as<bf16>(), H, r[c].as<bf16>(), H, r[c].as<bf16>(), H, w.as<bf16>(),
                   out[c].as<bf16>(), H, t, H, 1e-5f);
    });
    ctx.add({"dense", fmt::format("add_rms_norm [{}, {}]", t, H), us, 4.0 * t * H * 2, 0, ""});
    // The same norm writing an FP8 GEMM's input (E4M3 codes and a scale per 128) instead of bf16.
    {
      const std::vector<DeviceBuffer> q = buffers(nc, fp8_pad_m(t) * H), s = buffers(nc, fp8_x_scale_count(t, H) * 4);
      us = time_rotated(ctx, nc, [&](int c) {
        rms_norm_fp8(ctx.stream, x[c].as<bf16>(), H, w.as<bf16>(), q[c].as<uint8_t>(), s[c].as<float>(), t, H, 1e-5f);
      });
      ctx.add({"dense", fmt::format("rms_norm [{}, {}] fp8 out", t, H), us, t * H * (2.0 + 1.0 + 4.0 / 128), 0, ""});
      // With the residual: x and r read, the sum written back over r, the codes and scales written.
      us = time_rotated(ctx, nc, [&](int c) {
        add_rms_norm_fp8(ctx.stream, x[c].as<bf16>(), H, r[c].as<bf16>(), H, r[c].as<bf16>(), H, w.as<bf16>(),
                         q[c].as<uint8_t>(), s[c].as<float>(), t, H, 1e-5f);
      });
      ctx.add(
          {"dense", fmt::format("add_rms_norm [{}, {}] fp8 out", t, H), us, t * H * (6.0 + 1.0 + 4.0 / 128), 0, ""});
    }

    // AttnRes over 9 candidates (the final mix) + norm.
    {
      const int count = 9;
      const int ac = l2_rotation((count + 2.0) * t * H * 2).copies;
      std::vector<DeviceBuffer> cand;
      std::vector<std::vector<const bf16*>> ptrs(ac);
      for (int i = 0; i < count; ++i) {
        DeviceBuffer c0(t * H * 2);
        fill_uniform(c0.as<bf16>(), t * H, -1, 1, 10 + i, ctx.stream);
        for (DeviceBuffer& b : copies_of(c0, ac, ctx.stream)) {
          ptrs[cand.size() % ac].push_back(b.as<bf16>());
          cand.push_back(std::move(b));
        }
      }
      const std::vector<DeviceBuffer> mixed = buffers(ac, t * H * 2), normed = buffers(ac, t * H * 2);
      DeviceBuffer u(H * 4);
      fill_uniform(u.as<float>(), H, -0.05f, 0.05f, 4, ctx.stream);
      for (auto [kernel, name] :
           {std::pair{AttnResKernel::kPipelined, "pipelined"}, {AttnResKernel::kPerToken, "per token"}}) {
        us = time_rotated(ctx, ac, [&](int c) {
          attn_res_mix_norm(ctx.stream, ptrs[c].data(), count, H, t, H, u.as<float>(), 1e-5f, w.as<bf16>(), 1e-5f,
                            mixed[c].as<bf16>(), normed[c].as<bf16>(), H, kernel);
        });
        ctx.add({"dense", fmt::format("attn_res 9 cand + norm [{}, {}] {}", t, H, name), us, (count + 2.0) * t * H * 2,
                 0, ""});
      }
    }

    // SiTU on the shared experts' [gate | up] (2 × 6144) and on the dense MLP (2 × 33792).
    for (int64_t width : {6144, 33792}) {
      if (t == 4096 && width == 33792) continue;  // 1.1 GB of input; the 6144 case is the same kernel
      const int sc = l2_rotation(t * width * 5.0).copies;
      DeviceBuffer gu0(t * 2 * width * 2);
      fill_uniform(gu0.as<bf16>(), t * 2 * width, -6, 6, 5, ctx.stream);
      const std::vector<DeviceBuffer> gu = copies_of(gu0, sc, ctx.stream), o = buffers(sc, t * width * 2),
                                      q = buffers(sc, fp8_pad_m(t) * width),
                                      s = buffers(sc, fp8_x_scale_count(t, width) * 4);
      const Glu act{Glu::Kind::kSitu, 4.0f, 25.0f};
      us = time_rotated(ctx, sc, [&](int c) {
        glu(ctx.stream, act, gu[c].as<bf16>(), gu[c].as<bf16>() + width, 2 * width, o[c].as<bf16>(), width, t, width);
      });
      ctx.add({"dense", fmt::format("situ [{}, 2x{}] bf16", t, width), us, 3.0 * t * width * 2, 0, ""});
      us = time_rotated(ctx, sc, [&](int c) {
        glu_fp8(ctx.stream, act, gu[c].as<bf16>(), gu[c].as<bf16>() + width, 2 * width, q[c].as<uint8_t>(),
                s[c].as<float>(), t, width);
      });
      ctx.add({"dense", fmt::format("situ [{}, 2x{}] fp8 out", t, width), us, t * width * (4.0 + 1.0), 0, ""});
    }

    // The activation quantizer of the FP8 GEMMs (1 x 128 groups) on a [t, 7168] input: reads 2 bytes per value,
    // writes 1 and a scale per 128.
    {
      DeviceBuffer xin0(t * H * 2);
      fill_uniform(xin0.as<bf16>(), t * H, -3, 3, 8, ctx.stream);
      const std::vector<DeviceBuffer> xin = copies_of(xin0, nc, ctx.stream), q = buffers(nc, fp8_pad_m(t) * H),
                                      s = buffers(nc, fp8_x_scale_count(t, H) * 4);
      us = time_rotated(ctx, nc, [&](int c) {
        quantize_fp8_act(ctx.stream, xin[c].as<bf16>(), H, t, H, q[c].as<uint8_t>(), s[c].as<float>());
      });
      ctx.add({"dense", fmt::format("quantize_fp8_act [{}, {}]", t, H), us, t * H * (3.0 + 4.0 / 128), 0, ""});
    }

    // Router top-16 of 896 (the logits GEMM is in the gemm suite).
    {
      const int rc = l2_rotation(t * 896 * 4.0).copies;
      DeviceBuffer logits0(t * 896 * 4), bias(896 * 4);
      fill_uniform(logits0.as<float>(), t * 896, -4, 4, 6, ctx.stream);
      fill_uniform(bias.as<float>(), 896, -0.1f, 0.1f, 7, ctx.stream);
      const std::vector<DeviceBuffer> logits = copies_of(logits0, rc, ctx.stream), ids = buffers(rc, t * 16 * 4),
                                      wts = buffers(rc, t * 16 * 4);
      us = time_rotated(ctx, rc, [&](int c) {
        router_topk(ctx.stream, logits[c].as<float>(), 896, bias.as<float>(), t, RouterParams{896, 16, true, 1.0f},
                    ids[c].as<int32_t>(), wts[c].as<float>());
      });
      ctx.add({"dense", fmt::format("router top16/896 [{} tokens]", t), us, t * (896 * 4.0 + 16 * 8), 0, ""});
    }

    // KDA gated norm [t, 96 heads, 128].
    {
      const int gc = l2_rotation(3.0 * t * 12288 * 2).copies;
      DeviceBuffer g0(t * 12288 * 2), xo0(t * 12288 * 2), wf(128 * 4);
      fill_uniform(g0.as<bf16>(), t * 12288, -4, 4, 8, ctx.stream);
      fill_uniform(xo0.as<bf16>(), t * 12288, -2, 2, 9, ctx.stream);
      fill_uniform(wf.as<float>(), 128, 0.5f, 1.5f, 9, ctx.stream);
      const std::vector<DeviceBuffer> g = copies_of(g0, gc, ctx.stream), xo = copies_of(xo0, gc, ctx.stream),
                                      o2 = buffers(gc, t * 12288 * 2);
      us = time_rotated(ctx, gc, [&](int c) {
        rms_norm_gated(ctx.stream, xo[c].as<bf16>(), 12288, g[c].as<bf16>(), 12288, wf.as<float>(), o2[c].as<bf16>(),
                       12288, t, 96, 128, 1e-5f);
      });
      ctx.add({"dense", fmt::format("gated rms_norm [{}, 96, 128]", t), us, 3.0 * t * 12288 * 2, 0, ""});
    }
  }
  // Embedding gather of 4096 tokens from the 163840-row table: each set of ids takes other rows.
  const int64_t vocab = 163840, t = 4096;
  const int ec = l2_rotation(2.0 * t * H * 2).copies;
  DeviceBuffer table(vocab * H * 2);
  fill_uniform(table.as<bf16>(), vocab * H, -1, 1, 1, ctx.stream);
  std::vector<DeviceBuffer> ids = buffers(ec, t * 4), out = buffers(ec, t * H * 2);
  for (int c = 0; c < ec; ++c) {
    std::vector<int32_t> h(t);
    for (int64_t i = 0; i < t; ++i) h[i] = static_cast<int32_t>((i * 7919 + c * 40009) % vocab);
    KIMIRT_CUDA_CHECK(cudaMemcpy(ids[c].data(), h.data(), t * 4, cudaMemcpyHostToDevice));
  }
  const double us = time_rotated(ctx, ec, [&](int c) {
    embedding_gather(ctx.stream, table.as<bf16>(), vocab, H, ids[c].as<int32_t>(), t, out[c].as<bf16>(), H);
  });
  ctx.add({"dense", "embedding gather [4096, 7168]", us, 2.0 * t * H * 2, 0, ""});
}

const Registrar kRegister("dense", dense_suite);

}  // namespace
}  // namespace kimirt::bench::cuda
