// MLA: absorbed decode attention over the paged cache at 4k / 32k / 64k / 128k context, both kernels
// (bandwidth roofline: the cache rows read once; compute roofline: 2·heads·(576 + 512) flop per row), prefill attention
// of a 4096-token sequence, and one whole MLA layer decode step (batch 1, context 32k, all projections) against its
// bytes-moved roofline.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "cuda_bench.h"
#include "kimirt/cuda/check.h"
#include "kimirt/cuda/gemm_dispatch.h"
#include "kimirt/cuda/mla_cache.h"
#include "kimirt/cuda/mla_decode.h"
#include "kimirt/cuda/mla_layer.h"
#include "kimirt/cuda/mla_prefill.h"
#include "kimirt/cuda/random_fill.h"
#include "kimirt/cuda/stream.h"

namespace kimirt::bench::cuda {
namespace {

using namespace kimirt::cuda;
using bf16 = __nv_bfloat16;

constexpr int kPage = 64;

// The sequences' page table (pages interleaved across sequences, as a long-running server's allocator
// would leave them) and `copies` caches of identical layout and random contents: the timed calls rotate
// over the copies, so that a context smaller than the L2 is not served from it on the next call (a decode
// step reads every other layer's weights in between).
struct PagedCache {
  std::vector<DeviceBuffer> caches;
  DeviceBuffer table, lens;
  int pages_per_seq;
  PagedCache(cudaStream_t s, int batch, int ctx, int copies = 1) {
    pages_per_seq = (ctx + kPage - 1) / kPage;
    const int64_t pages = static_cast<int64_t>(batch) * pages_per_seq;
    for (int c = 0; c < copies; ++c) {
      caches.emplace_back(pages * kPage * kMlaRow * 2);
      fill_uniform(caches.back().as<bf16>(), pages * kPage * kMlaRow, -1, 1, 77 + c, s);
    }
    std::vector<int32_t> t(pages);
    for (int b = 0; b < batch; ++b)
      for (int p = 0; p < pages_per_seq; ++p) t[b * pages_per_seq + p] = p * batch + b;
    table = DeviceBuffer(pages * 4);
    KIMIRT_CUDA_CHECK(cudaMemcpy(table.data(), t.data(), pages * 4, cudaMemcpyHostToDevice));
    std::vector<int32_t> l(batch, ctx);
    lens = DeviceBuffer(batch * 4);
    KIMIRT_CUDA_CHECK(cudaMemcpy(lens.data(), l.data(), batch * 4, cudaMemcpyHostToDevice));
  }
  bf16* cache(int i = 0) const { return caches[i % caches.size()].as<bf16>(); }
};

constexpr int64_t kHidden = 7168;

// One MLA layer's weights at K3 dims (TP = 1), random, for the layer-step benchmarks.
struct K3LayerWeights {
  std::vector<DeviceBuffer> bufs;
  DeviceBuffer w_uk_t;
  MlaLayerWeights w;
  int heads;
  K3LayerWeights(cudaStream_t s, int heads_) : heads(heads_) {
    const auto make = [&](int64_t rows, int64_t cols, uint64_t seed) {
      bufs.emplace_back(rows * cols * 2);
      fill_uniform(bufs.back().as<bf16>(), rows * cols, -0.02f, 0.02f, seed, s);
      return bufs.back().as<bf16>();
    };
    bufs.reserve(8);
    w.q_a_proj = make(1536, kHidden, 1), w.q_a_norm = make(1, 1536, 2), w.q_b_proj = make(heads * 192, 1536, 3);
    w.kv_a_proj = make(576, kHidden, 4), w.kv_a_norm = make(1, 512, 5), w.kv_b_proj = make(heads * 256, 512, 6);
    w.g_proj = make(heads * 128, kHidden, 7), w.o_proj = make(kHidden, heads * 128, 8);
    w_uk_t = DeviceBuffer(static_cast<int64_t>(heads) * 512 * 128 * 2);
    mla_transpose_uk(s, w.kv_b_proj, heads, w_uk_t.as<bf16>());
    w.w_uk_t = w_uk_t.as<bf16>();
  }
  // The projections' bytes (q_a, q_b, kv_a, kv_b, gate, o_proj).
  double bytes() const {
    return (1536.0 * kHidden + heads * 192.0 * 1536 + 576.0 * kHidden + heads * 256.0 * 512 +
            heads * 128.0 * kHidden * 2) *
           2;
  }
};

struct DecodeCase {
  int batch, seq, heads;
};

void mla_suite(Context& ctx) {
  const int heads = 96;
  // K3 has 96 heads; under TP 8 a GPU holds 12 of them (and 16 under TP 6): the same cache bytes, an
  // eighth of the arithmetic, so the kernel is memory-bound there.
  // {128, 256, 12} reads the bytes of {1, 32768, 12} with the same number of blocks but unsplit: the
  // difference is what the split costs (the merge kernel and its launch).
  // The batches 1 / 8 / 64 / 256 at 4k, 32k and 128k where the cache fits beside the copies.
  const DecodeCase cases[] = {{1, 4096, 96},   {1, 32768, 96},  {1, 131072, 96},  {8, 32768, 96},  {64, 4096, 96},
                              {64, 32768, 96}, {256, 4096, 96}, {1, 32768, 12},   {1, 65536, 12},  {1, 131072, 12},
                              {8, 32768, 12},  {64, 32768, 12}, {64, 131072, 12}, {256, 4096, 12}, {256, 32768, 12},
                              {128, 256, 12},  {1, 32768, 16},  {4, 65536, 16},   {1, 32768, 24},  {1, 32768, 32}};
  for (const auto [batch, seq, nh] : cases) {
    if (!ctx.wants(fmt::format("decode attn B={} ctx={} heads={}", batch, seq, nh))) continue;
    const double cache_bytes = static_cast<double>(batch) * ((seq + kPage - 1) / kPage) * kPage * kMlaRow * 2;
    const auto [copies, calls] = l2_rotation(cache_bytes);
    PagedCache pc(ctx.stream, batch, seq, copies);
    DeviceBuffer q(static_cast<int64_t>(batch) * nh * kMlaRow * 2), out(static_cast<int64_t>(batch) * nh * 512 * 2);
    fill_uniform(q.as<bf16>(), batch * nh * kMlaRow, -0.3f, 0.3f, 5, ctx.stream);
    // The plan's own choice, alone and with overlap_previous (as the layer step launches it: its start
    // overlaps the previous kernel, here the previous call's merge), then the other kernels for comparison.
    const MlaDecodePlan chosen = plan_mla_decode(batch, nh, seq, ctx.device.sm_count);
    std::vector<std::pair<MlaDecodePlan, bool>> variants = {{chosen, false}, {chosen, true}};
    for (MlaDecodeKernel k : {MlaDecodeKernel::kMma16, MlaDecodeKernel::kWgmma64, MlaDecodeKernel::kSeesaw}) {
      if (k != chosen.kernel) variants.emplace_back(plan_mla_decode(batch, nh, seq, ctx.device.sm_count, k), false);
    }
    for (const auto& [plan, overlap] : variants) {
      DeviceBuffer ws(plan.workspace_bytes + 16);
      MlaDecodeArgs a;
      a.q = q.as<bf16>(), a.ld_q = nh * kMlaRow, a.cache = pc.cache(), a.page_size = kPage;
      a.block_table = pc.table.as<int32_t>(), a.ld_block_table = pc.pages_per_seq, a.seq_lens = pc.lens.as<int32_t>();
      a.out = out.as<bf16>(), a.ld_out = nh * 512, a.batch = batch, a.heads = nh;
      a.overlap_previous = overlap;
      // Timed as a CUDA graph of `calls` calls (as a decode step runs it): device time, without the host's
      // launch overhead, which would otherwise exceed the kernel at short contexts.
      for (int c = 0; c < copies; ++c) {  // set-up (kernel attributes, tensor maps) outside the capture
        a.cache = pc.cache(c);
        mla_decode(ctx.stream, a, plan, ws.data());
      }
      const double us = graph_time_us(ctx, calls, [&](int r) {
        a.cache = pc.cache(r);
        mla_decode(ctx.stream, a, plan, ws.data());
      });
      const double rows = static_cast<double>(batch) * seq;
      const bool is_chosen = plan.kernel == chosen.kernel;
      Result r{"mla",
               fmt::format("decode attn B={} ctx={} heads={}{}{}", batch, seq, nh,
                           is_chosen ? "" : fmt::format(" [{}, not chosen]", mla_decode_kernel_name(plan.kernel)),
                           overlap ? " PDL" : ""),
               us,
               rows * kMlaRow * 2 + batch * nh * (kMlaRow + 512) * 2.0,
               rows * nh * 2.0 * (kMlaRow + 512),
               fmt::format("{} {} splits x {} head groups, bandwidth-only ratio {:.2f}, {:.0f} TFLOP/s, {} caches",
                           mla_decode_kernel_name(plan.kernel), plan.splits, plan.head_groups,
                           rows * kMlaRow * 2 / (kCopyTBps * 1e12) * 1e6 / us,
                           rows * nh * 2.0 * (kMlaRow + 512) / us * 1e-6, copies)};
      ctx.add(r);
    }
  }

  // Prefill attention, 96 heads (keys expanded: k_nope|v per head, k_pe shared): one sequence of tq new
  // tokens after tk - tq cached ones (0: a whole 4096-token prompt; 28672: a chunk at the end of a 32k
  // context).
  const auto prefill = [&](int tq, int tk) {
    const std::string name = tq == tk
                                 ? fmt::format("prefill attn {} tokens causal heads={}", tq, heads)
                                 : fmt::format("prefill attn {} tokens after {} cached heads={}", tq, tk - tq, heads);
    const auto named = [&](MlaPrefillKernel k) { return fmt::format("{} [{}]", name, mla_prefill_kernel_name(k)); };
    if (!ctx.wants(named(MlaPrefillKernel::kWgmma)) && !ctx.wants(named(MlaPrefillKernel::kMma))) return;
    const int64_t nq = tq, nk = tk;
    DeviceBuffer q(nq * heads * 192 * 2), kv(nk * heads * 256 * 2), lat(nk * kMlaRow * 2), o(nq * heads * 128 * 2),
        cu_q(8), cu_k(8);
    fill_uniform(q.as<bf16>(), nq * heads * 192, -1, 1, 1, ctx.stream);
    fill_uniform(kv.as<bf16>(), nk * heads * 256, -1, 1, 2, ctx.stream);
    fill_uniform(lat.as<bf16>(), nk * kMlaRow, -1, 1, 3, ctx.stream);
    const int32_t cu_q_h[2] = {0, tq}, cu_k_h[2] = {0, tk};
    KIMIRT_CUDA_CHECK(cudaMemcpy(cu_q.data(), cu_q_h, 8, cudaMemcpyHostToDevice));
    KIMIRT_CUDA_CHECK(cudaMemcpy(cu_k.data(), cu_k_h, 8, cudaMemcpyHostToDevice));
    MlaPrefillArgs a;
    a.q = q.as<bf16>(), a.ld_q = heads * 192, a.k_nope = kv.as<bf16>(), a.ld_k_nope = heads * 256, a.hs_k_nope = 256;
    a.k_pe = lat.as<bf16>() + 512, a.ld_k_pe = kMlaRow, a.v = kv.as<bf16>() + 128, a.ld_v = heads * 256, a.hs_v = 256;
    a.out = o.as<bf16>(), a.ld_out = heads * 128, a.cu_q = cu_q.as<int32_t>(), a.cu_k = cu_k.as<int32_t>();
    a.batch = 1, a.heads = heads, a.max_q = tq, a.total_q = nq, a.total_k = nk;
    // Query i sees tk - tq + i + 1 keys.
    const double pairs = static_cast<double>(nq) * (nk - nq) + nq * (nq + 1) / 2.0;
    const double flops = 2.0 * heads * (192 + 128) * pairs;
    for (MlaPrefillKernel kernel : {MlaPrefillKernel::kWgmma, MlaPrefillKernel::kMma}) {
      if (!ctx.wants(named(kernel))) continue;
      const double us = time_us(
          ctx, [&] { mla_prefill(ctx.stream, a, kernel); }, 1, 7, 1);
      ctx.add({"mla", named(kernel), us, nq * heads * (192 + 128) * 2.0 + nk * (heads * 256 + kMlaRow) * 2.0, flops,
               kernel == MlaPrefillKernel::kWgmma ? "default" : "comparison"});
    }
  };
  prefill(4096, 4096);
  prefill(4096, 32768);

  // One layer prefill step at K3 dims: a 4096-token chunk after 28672 cached tokens, all projections, the
  // context's keys expanded at once (as many as fit) or in passes of 16384 / 8192 keys merged by their
  // log-sum-exp (mla_prefill_step's max_expanded_keys: the step's memory bounded at long contexts).
  if (ctx.wants("layer prefill step")) {
    const int64_t tq = 4096, tk = 32768;
    const K3LayerWeights k3(ctx.stream, heads);
    const MlaLayerDims dims{kHidden, heads, 1536, true, 1e-6f};
    PagedCache pc(ctx.stream, 1, static_cast<int>(tk));
    DeviceBuffer x(tq * kHidden * 2), out(tq * kHidden * 2), slots(tq * 4), cu_q(8), cu_k(8);
    fill_uniform(x.as<bf16>(), tq * kHidden, -1, 1, 9, ctx.stream);
    std::vector<int32_t> s_h(tq);
    std::iota(s_h.begin(), s_h.end(), static_cast<int32_t>(tk - tq));  // the chunk rewrites the last rows
    KIMIRT_CUDA_CHECK(cudaMemcpy(slots.data(), s_h.data(), tq * 4, cudaMemcpyHostToDevice));
    const int32_t cu_q_h[2] = {0, static_cast<int32_t>(tq)}, cu_k_h[2] = {0, static_cast<int32_t>(tk)};
    KIMIRT_CUDA_CHECK(cudaMemcpy(cu_q.data(), cu_q_h, 8, cudaMemcpyHostToDevice));
    KIMIRT_CUDA_CHECK(cudaMemcpy(cu_k.data(), cu_k_h, 8, cudaMemcpyHostToDevice));
    DeviceBuffer ws(64 << 20), sws(16 << 20);
    GemmLt lt(ws.data(), ws.size());
    Linear linear(lt, sws.data(), sws.size(), ctx.device.sm_count);
    const MlaCacheView view{pc.cache(), kPage, pc.table.as<int32_t>(), pc.pages_per_seq};
    const double pairs = static_cast<double>(tq) * (tk - tq) + tq * (tq + 1) / 2.0;
    const double flops = 2.0 * tq * kHidden * (1536 + 576 + heads * 128.0 * 2) + 2.0 * tq * 1536 * heads * 192 +
                         2.0 * tk * 512 * heads * 256 + 2.0 * heads * (192 + 128) * pairs;
    for (const int64_t keys : {int64_t{0}, int64_t{16384}, int64_t{8192}}) {
      const std::string name =
          fmt::format("layer prefill step {} tokens after {} cached heads={}{}", tq, tk - tq, heads,
                      keys ? fmt::format(", passes of {} keys", keys) : std::string(", one pass (3 GB step region)"));
      if (!ctx.wants(name)) continue;
      DeviceArena arena(0, 3ull << 30);  // its own, so that the high-water mark is this variant's
      const double us = time_us(
          ctx,
          [&] {
            mla_prefill_step(linear, arena, ctx.stream, dims, k3.w, view, x.as<bf16>(), tq, 1, cu_q.as<int32_t>(),
                             cu_k.as<int32_t>(), tk, static_cast<int>(tq), static_cast<int>(tk), slots.as<int32_t>(),
                             out.as<bf16>(), false, keys);
          },
          1, 5, 1);
      ctx.add({"mla", name, us, k3.bytes() + tk * kMlaRow * 2.0, flops,
               fmt::format("step region high water {:.2f} GB", arena.step_high_water() / 1e9)});
    }
  }

  // One layer decode step, batch 1, context 32k, all projections (K3 weights, TP = 1).
  if (ctx.wants("layer decode step B=1 ctx=32k")) {
    const int64_t H = kHidden, ctx_len = 32768;
    const K3LayerWeights k3(ctx.stream, heads);
    const MlaLayerWeights& w = k3.w;
    const MlaLayerDims dims{H, heads, 1536, true, 1e-6f};
    PagedCache pc(ctx.stream, 1, ctx_len);
    DeviceBuffer x(H * 2), out(H * 2), slot(4);
    fill_uniform(x.as<bf16>(), H, -1, 1, 9, ctx.stream);
    const int32_t s_h = static_cast<int32_t>(ctx_len - 1);  // rewrite the last row every step
    KIMIRT_CUDA_CHECK(cudaMemcpy(slot.data(), &s_h, 4, cudaMemcpyHostToDevice));
    DeviceArena arena(0, 512 << 20);
    DeviceBuffer ws(64 << 20), sws(16 << 20);
    GemmLt lt(ws.data(), ws.size());
    Linear linear(lt, sws.data(), sws.size(), ctx.device.sm_count);
    const MlaCacheView view{pc.cache(), kPage, pc.table.as<int32_t>(), pc.pages_per_seq};
    const double weights = k3.bytes();
    const double cache = ctx_len * kMlaRow * 2.0;
    const double roof_us = (weights + cache) / (kCopyTBps * 1e12) * 1e6;
    // The latent and gate branches on a second stream (their own Linear) at a lower priority than the step's
    // stream (as MlaSideStream asks), at the same priority (for comparison), or everything on one stream.
    int least = 0, greatest = 0;
    KIMIRT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    Stream main_stream(greatest), low_stream(least), equal_stream(greatest);
    KIMIRT_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));  // the weights and the cache were filled there
    Context on_main = ctx;                                 // time_us times on its context's stream
    on_main.stream = main_stream;
    on_main.results.clear();
    DeviceBuffer side_ws(64 << 20), side_sws(16 << 20);
    GemmLt side_lt(side_ws.data(), side_ws.size());
    Linear side_linear(side_lt, side_sws.data(), side_sws.size(), ctx.device.sm_count);
    cudaEvent_t ev[3];
    for (auto& e : ev) KIMIRT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    // The side stream's gate projection keeps mla_gate_sms's share of the SMs (the attention runs on the
    // rest), or shares every SM (for comparison).
    const MlaSideStream side_low{low_stream, &side_linear, ev[0], ev[1], ev[2]};
    const MlaSideStream side_equal{equal_stream, &side_linear, ev[0], ev[1], ev[2]};
    MlaSideStream side_low_shared = side_low;
    side_low_shared.gate_sms = 0;
    const std::string kept = fmt::format(", gate on {} SMs", mla_gate_sms(ctx.device.sm_count, heads, 1));
    const std::pair<const MlaSideStream*, std::string> variants[] = {
        {nullptr, ""},
        {&side_low, ", 2 streams" + kept},
        {&side_low_shared, ", 2 streams, gate on every SM"},
        {&side_equal, ", 2 streams of equal priority" + kept}};
    for (const auto& [sp, how] : variants) {
      auto step = [&] {
        mla_decode_step(linear, arena, main_stream, dims, w, view, x.as<bf16>(), 1, slot.as<int32_t>(),
                        pc.lens.as<int32_t>(), static_cast<int>(ctx_len), out.as<bf16>(), false, sp);
      };
      const double us = time_us(on_main, step, 2);
      ctx.add({"mla", fmt::format("layer decode step B=1 ctx=32k eager{}", how), us, weights + cache, 0,
               fmt::format("{:.2f}x its bytes roofline (target <= 1.3)", us / roof_us)});
      // The same step replayed from a CUDA graph, as the runtime runs decode (no launch overhead), with the
      // captured stream priorities. Six replays per sample: the first one's launch latency (a few us, before
      // the GPU starts) is then a sixth of a step's time, not half.
      const double us_graph = graph_time_us(
          on_main, 1, [&](int) { step(); }, cudaGraphInstantiateFlagUseNodePriority, 6);
      ctx.add({"mla", fmt::format("layer decode step B=1 ctx=32k CUDA graph{}", how), us_graph, weights + cache, 0,
               fmt::format("{:.2f}x its bytes roofline (target <= 1.3)", us_graph / roof_us)});
    }
    for (auto& e : ev) KIMIRT_CUDA_CHECK(cudaEventDestroy(e));
  }
}

const Registrar kRegister("mla", mla_suite);

}  // namespace
}  // namespace kimirt::bench::cuda
