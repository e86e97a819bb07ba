// MLA mixer composition (decode and prefill).
#include "kimirt/cuda/mla_layer.h"

#include <algorithm>

#include "kimirt/base/error.h"
#include "kimirt/cuda/check.h"
#include "kimirt/cuda/mla_cache.h"
#include "kimirt/cuda/mla_decode.h"
#include "kimirt/cuda/mla_prefill.h"

namespace kimirt::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int64_t kQk = 192, kNope = 128, kV = 128, kKvB = 256;

void check_dims(const MlaLayerDims& d, const MlaLayerWeights& w) {
  KIMIRT_CHECK(d.hidden > 0 && d.heads > 0 && d.heads <= 65535,
               "MLA layer: hidden {} and heads {} must be positive (heads at most 65535, the kernels' grid)", d.hidden,
               d.heads);
  if (d.q_lora_rank > 0) {
    KIMIRT_CHECK(w.q_a_proj && w.q_a_norm && w.q_b_proj,
                 "MLA layer: q_lora_rank {} needs q_a_proj, q_a_layernorm "
                 "and q_b_proj",
                 d.q_lora_rank);
  } else {
    KIMIRT_CHECK(w.q_proj, "MLA layer: q_lora_rank 0 needs q_proj");
  }
  KIMIRT_CHECK(w.kv_a_proj && w.kv_a_norm && w.kv_b_proj && w.o_proj,
               "MLA layer: kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj and o_proj are required");
  KIMIRT_CHECK(!d.output_gate || w.g_proj, "MLA layer: mla_use_output_gate needs g_proj");
}

// The q projection's buffers, taken before any launch (the decode step takes all its scratch before it forks).
struct QBuffers {
  bf16* q = nullptr;      // [t, heads·192]
  bf16* q_lat = nullptr;  // [t, q_lora_rank] (q-LoRA only)
};

QBuffers q_buffers(DeviceArena& arena, const MlaLayerDims& d, int64_t t) {
  QBuffers b;
  b.q = arena.step<bf16>(t * d.heads * kQk, "mla.q");
  if (d.q_lora_rank > 0) b.q_lat = arena.step<bf16>(t * d.q_lora_rank, "mla.q_lat");
  return b;
}

// q [t, heads·192] from the normed input.
bf16* project_q(Linear& linear, const QBuffers& b, cudaStream_t stream, const MlaLayerDims& d, const MlaLayerWeights& w,
                const bf16* x, int64_t t) {
  bf16* q = b.q;
  if (d.q_lora_rank > 0) {
    bf16* q_lat = b.q_lat;
    linear(stream, x, w.q_a_proj, q_lat, OutType::kBF16, t, d.q_lora_rank, d.hidden);
    // The norm fused into q_b_proj at decode sizes (one launch less on the step's critical path: the B=1
    // step's graph on one stream 161.9-162.8 us against 163.7-164.1 unfused, H200); normed in place before
    // the GEMM otherwise.
    linear.rms_normed(stream, q_lat, w.q_a_norm, d.latent_norm_eps, q_lat, w.q_b_proj, q, OutType::kBF16, t,
                      d.heads * kQk, d.q_lora_rank);
  } else {
    linear(stream, x, w.q_proj, q, OutType::kBF16, t, d.heads * kQk, d.hidden);
  }
  return q;
}

// out [t, hidden] (+)= o [t, heads·128] · o_projᵀ (o already gated: both steps apply σ(g) before this).
void o_proj(Linear& linear, cudaStream_t stream, const MlaLayerDims& d, const MlaLayerWeights& w, const bf16* o,
            int64_t t, bf16* out, bool accumulate) {
  linear(stream, o, w.o_proj, out, OutType::kBF16, t, d.hidden, d.heads * kV, accumulate ? 1.0f : 0.0f);
}

// The cache view and batch that the append, gather and attention kernels would refuse, refused before a step
// queues anything (the kernels check again; a step refused here leaves the cache as it was). `step` starts the
// message; the decode kernels copy whole 32-row tiles, so decode wants pages of a multiple of 32 rows.
// max_len: the host bound on a sequence's cached rows (max_name says which argument it is). The kernels look
// up row p's page at block_table[b · ld_block_table + p / page_size] without a bound: a row past the table's
// row would take the next sequence's pages, so such a bound is refused here.
void check_cache_view(const char* step, const MlaCacheView& cache, int64_t batch, bool pages_of_32, int64_t max_len,
                      const char* max_name) {
  const bool cache_ok = cache.cache && reinterpret_cast<uintptr_t>(cache.cache) % 16 == 0;
  const bool page_ok = cache.page_size > 0 && (!pages_of_32 || cache.page_size % 32 == 0);
  KIMIRT_CHECK(batch <= 65535 && cache_ok && cache.block_table && cache.ld_block_table > 0 && page_ok &&
                   cache.num_pages >= 0 && cache.num_pages * cache.page_size <= (int64_t{1} << 31),
               "{}: batch {} (at most 65535), cache {}, block table {} (row stride {}), page size {} ({}), {} pages "
               "(rows below 2^31)",
               step, batch,
               !cache.cache ? "null"
               : cache_ok   ? "set"
                            : "not 16-byte aligned",
               cache.block_table ? "set" : "null", cache.ld_block_table, cache.page_size,
               pages_of_32 ? "a positive multiple of 32" : "positive", cache.num_pages);
  const int64_t pages = (max_len + cache.page_size - 1) / cache.page_size;
  KIMIRT_CHECK(pages <= cache.ld_block_table,
               "{}: {} {} needs {} pages of {} rows, more than a block table row holds ({}, its row stride)", step,
               max_name, max_len, pages, cache.page_size, cache.ld_block_table);
}

}  // namespace

int mla_gate_sms(int sm_count, int64_t heads, int64_t batch) {
  // Measured on the H200 (B=1, 32k, 96 heads, graph, 2 streams; one machine, runs alternated) with 0 / 40 /
  // 44 / 48 / 52 / 56 / 60 of the 132 SMs kept by the gate: 160.8-162.2 / 166 / 167 / 155.0-158.3 / 156.8-157.1
  // / 158-159 / 160 us. One 1024-thread block streams about 45 GB/s (as fast as a ring of 13 bulk-copied rows
  // in 190 KB of shared memory did), so with fewer SMs the gate's 176 MB are not read when the attention
  // ends (W_UV waits for them), and more SMs taken slow the attention, whose time grows as its SMs shrink.
  // With fewer heads per GPU the attention is memory-bound: the gate's bytes then gain nothing beside it.
  // Linear::on_sms takes one token only. Other SM counts get the same share (48/132), not measured.
  if (heads <= kMlaWgmmaHeads || batch != 1) return 0;
  return sm_count * 48 / 132;
}

void mla_decode_step(Linear& linear, DeviceArena& arena, cudaStream_t stream, const MlaLayerDims& d,
                     const MlaLayerWeights& w, const MlaCacheView& cache, const bf16* x, int64_t batch,
                     const int32_t* slots, const int32_t* seq_lens, int max_seq_len, bf16* out, bool accumulate,
                     const MlaSideStream* side) {
  check_dims(d, w);
  if (side) {
    KIMIRT_CHECK(side->stream && side->linear && side->fork && side->kv_ready && side->gate_ready,
                 "MLA decode: the side stream needs a stream, its own Linear and three events");
    KIMIRT_CHECK(side->gate_sms >= kMlaGateSmsAuto && side->gate_sms < linear.sm_count(),
                 "MLA decode: gate_sms {} must be -1 (auto) or in [0, {}) (the device's SMs)", side->gate_sms,
                 linear.sm_count());
  }
  if (batch == 0) return;
  // The cache view, batch and pointers that the attention would refuse, refused before anything is queued on
  // either stream (the attention checks them again; its shape checks cannot fail on what this step builds).
  check_cache_view("MLA decode", cache, batch, true, max_seq_len, "max_seq_len");
  KIMIRT_CHECK(slots && seq_lens, "MLA decode: slots {}, lengths {}", slots ? "set" : "null",
               seq_lens ? "set" : "null");
  const StepScope scratch(arena);
  // All of the step's scratch is taken before the side stream forks: a throw after the fork would give back
  // memory that the side stream's queued work still uses.
  bf16* kv_a = arena.step<bf16>(batch * kMlaRow, "mla.kv_a");
  bf16* g = d.output_gate ? arena.step<bf16>(batch * d.heads * kV, "mla.gate") : nullptr;
  const QBuffers qb = q_buffers(arena, d, batch);
  bf16* q_abs = arena.step<bf16>(batch * d.heads * kMlaRow, "mla.q_abs");
  bf16* o_lat = arena.step<bf16>(batch * d.heads * kMlaLatent, "mla.o_latent");
  bf16* o = arena.step<bf16>(batch * d.heads * kV, "mla.o");
  // The latent branch (kv_a, its norm, the cache append) and the gate projection depend only on x.
  auto latent_branch = [&](Linear& lin, cudaStream_t s) {
    lin(s, x, w.kv_a_proj, kv_a, OutType::kBF16, batch, kMlaRow, d.hidden);
    mla_kv_norm_append(s, kv_a, kMlaRow, w.kv_a_norm, d.latent_norm_eps, slots, batch, cache.cache, nullptr, 0);
  };
  // On the side stream the gate projection may keep a share of the SMs (MlaSideStream::gate_sms): the
  // attention is then planned for the others, and the two run side by side.
  const int gate_sms =
      side && g ? (side->gate_sms < 0 ? mla_gate_sms(linear.sm_count(), d.heads, batch) : side->gate_sms) : 0;
  // The attention's plan depends on whether the gate keeps its SMs (known once it is launched): the split
  // workspace is sized for either plan.
  const auto plan_for = [&](int sms) {
    return plan_mla_decode(static_cast<int>(batch), static_cast<int>(d.heads), max_seq_len, sms);
  };
  const uint64_t ws_bytes =
      std::max(plan_for(linear.sm_count()).workspace_bytes,
               gate_sms > 0 ? plan_for(linear.sm_count() - gate_sms).workspace_bytes : uint64_t{0});
  void* ws = ws_bytes ? arena.allocate_step(ws_bytes, "mla.decode_partials") : nullptr;
  bool gate_kept = false;  // the gate projection runs on gate_sms SMs
  auto gate_branch = [&](Linear& lin, cudaStream_t s) {
    if (!g) return;
    if (gate_sms > 0)
      gate_kept = lin.on_sms(s, x, w.g_proj, g, OutType::kBF16, batch, d.heads * kV, d.hidden, gate_sms);
    if (!gate_kept) lin(s, x, w.g_proj, g, OutType::kBF16, batch, d.heads * kV, d.hidden);
  };
  // Should a launch still throw between the fork and the join, the main stream is made to wait for the side
  // stream's queued work before anything else runs on it (the next step reuses this step's scratch). Not
  // copyable: a copy's destructor would join at the wrong place.
  class JoinOnUnwind {
   public:
    explicit JoinOnUnwind(cudaStream_t main) : main_(main) {}
    JoinOnUnwind(const JoinOnUnwind&) = delete;
    JoinOnUnwind& operator=(const JoinOnUnwind&) = delete;
    void arm(const MlaSideStream* side) { side_ = side; }
    void disarm() { side_ = nullptr; }
    ~JoinOnUnwind() {
      if (side_ && cudaEventRecord(side_->gate_ready, side_->stream) == cudaSuccess) {
        (void)cudaStreamWaitEvent(main_, side_->gate_ready);
      }
    }

   private:
    const MlaSideStream* side_ = nullptr;
    cudaStream_t main_;
  } join_on_unwind(stream);
  if (side) {
    KIMIRT_CUDA_CHECK(cudaEventRecord(side->fork, stream));
    KIMIRT_CUDA_CHECK(cudaStreamWaitEvent(side->stream, side->fork));
    join_on_unwind.arm(side);
    latent_branch(*side->linear, side->stream);
    KIMIRT_CUDA_CHECK(cudaEventRecord(side->kv_ready, side->stream));
    gate_branch(*side->linear, side->stream);
    KIMIRT_CUDA_CHECK(cudaEventRecord(side->gate_ready, side->stream));
  }
  bf16* q = project_q(linear, qb, stream, d, w, x, batch);
  if (!side) latent_branch(linear, stream);

  // q_abs[:, h, :512] = q_nope_h · W_UK_h (W_UK_h = kv_b rows h·256 .. h·256+127, [128, 512]); the attention
  // reads q_pe where q_b wrote it (MlaDecodeArgs::q_pe: a copy into q_abs was a graph node of its own on the
  // critical path, 1-3 us of the B=1 step). The wait for the latent branch comes first, so that the
  // absorption kernel is the attention's only predecessor: the attention then starts (page lookups, first
  // cache copies) while it finishes.
  if (side) KIMIRT_CUDA_CHECK(cudaStreamWaitEvent(stream, side->kv_ready));
  if (w.w_uk_t && linear.uses_skinny(batch, kMlaLatent, kNope)) {
    linear.batched(stream, q, d.heads * kQk, kQk, w.w_uk_t, kNope, kMlaLatent * kNope, q_abs, OutType::kBF16,
                   d.heads * kMlaRow, kMlaRow, batch, kMlaLatent, kNope, d.heads);
  } else {
    linear.lt().batched_bf16(stream, q, d.heads * kQk, kQk, w.kv_b_proj, kMlaLatent, kKvB * kMlaLatent, false, q_abs,
                             OutType::kBF16, d.heads * kMlaRow, kMlaRow, batch, kMlaLatent, kNope, d.heads);
  }

  const MlaDecodePlan plan = plan_for(linear.sm_count() - (gate_kept ? gate_sms : 0));
  MlaDecodeArgs a;
  a.q = q_abs, a.ld_q = d.heads * kMlaRow;
  a.q_pe = q + kNope, a.ld_q_pe_head = kQk, a.ld_q_pe = d.heads * kQk;
  a.cache = cache.cache, a.page_size = cache.page_size, a.num_pages = cache.num_pages;
  a.block_table = cache.block_table, a.ld_block_table = cache.ld_block_table, a.seq_lens = seq_lens;
  a.out = o_lat, a.ld_out = d.heads * kMlaLatent, a.batch = static_cast<int>(batch),
  a.heads = static_cast<int>(d.heads);
  a.overlap_previous = true;  // the previous kernel is the absorption (or its split-K reduction): q_abs only
  mla_decode(stream, a, plan, ws);

  // o[:, h, :] = ō_h · W_UV_hᵀ (W_UV_h = kv_b rows h·256+128 .. h·256+255, [128, 512]), times σ(g) when the
  // layer has the output gate: applied as W_UV stores o (one launch less on the step's critical path), so
  // the gate projection is waited for first (on the side stream it ends about when the attention does).
  if (side) {
    KIMIRT_CUDA_CHECK(cudaStreamWaitEvent(stream, side->gate_ready));
    join_on_unwind.disarm();  // joined
  } else {
    gate_branch(linear, stream);
  }
  linear.batched(stream, o_lat, d.heads * kMlaLatent, kMlaLatent, w.kv_b_proj + kNope * kMlaLatent, kMlaLatent,
                 kKvB * kMlaLatent, o, OutType::kBF16, d.heads * kV, kV, batch, kV, kMlaLatent, d.heads, g);
  o_proj(linear, stream, d, w, o, batch, out, accumulate);
}

void mla_prefill_step(Linear& linear, DeviceArena& arena, cudaStream_t stream, const MlaLayerDims& d,
                      const MlaLayerWeights& w, const MlaCacheView& cache, const bf16* x, int64_t tokens, int batch,
                      const int32_t* cu_q, const int32_t* cu_k, int64_t total_k, int max_q, int max_k,
                      const int32_t* slots, bf16* out, bool accumulate, int64_t max_expanded_keys) {
  check_dims(d, w);
  KIMIRT_CHECK(max_expanded_keys >= 0, "MLA prefill: max_expanded_keys {} must not be negative", max_expanded_keys);
  if (tokens == 0) return;
  KIMIRT_CHECK(total_k >= tokens, "MLA prefill: total_k {} (cu_k[batch]) is below the chunk's {} tokens", total_k,
               tokens);
  KIMIRT_CHECK(max_expanded_keys == 0 || max_expanded_keys >= tokens,
               "MLA prefill: max_expanded_keys {} is below the chunk's {} tokens (a pass expands at least the "
               "chunk's own keys)",
               max_expanded_keys, tokens);
  // The host bounds size the kernels' grids, and a bound below a sequence's length would leave its rows
  // unwritten, not fail. The lengths are on the device: this refuses what cannot hold the batch on average
  // (zero bounds included); a bound below one sequence's length is the caller's to avoid.
  KIMIRT_CHECK(batch >= 1 && max_q >= 1 && max_k >= max_q && int64_t{max_q} * batch >= tokens &&
                   int64_t{max_k} * batch >= total_k,
               "MLA prefill: {} tokens and {} keys in {} sequences cannot have at most {} queries and {} keys per "
               "sequence (max_q, max_k)",
               tokens, total_k, batch, max_q, max_k);
  // What the append, the gather and the attention would refuse, refused before the projections are queued and
  // the chunk's rows written to the cache (a refused step leaves the cache as it was).
  check_cache_view("MLA prefill", cache, batch, false, max_k, "max_k");
  KIMIRT_CHECK(cu_q && cu_k && slots, "MLA prefill: cu_q {}, cu_k {}, slots {}", cu_q ? "set" : "null",
               cu_k ? "set" : "null", slots ? "set" : "null");
  // Given back however the step ends: a refused pass (or a failed allocation) leaves no scratch taken.
  const StepScope scratch(arena);
  bf16* q = project_q(linear, q_buffers(arena, d, tokens), stream, d, w, x, tokens);
  bf16* kv_a = arena.step<bf16>(tokens * kMlaRow, "mla.kv_a");
  linear(stream, x, w.kv_a_proj, kv_a, OutType::kBF16, tokens, kMlaRow, d.hidden);
  bf16* g = nullptr;
  if (d.output_gate) {
    g = arena.step<bf16>(tokens * d.heads * kV, "mla.gate");
    linear(stream, x, w.g_proj, g, OutType::kBF16, tokens, d.heads * kV, d.hidden);
  }
  bf16* o = arena.step<bf16>(tokens * d.heads * kV, "mla.o");
  MlaPrefillArgs a;
  a.q = q, a.ld_q = d.heads * kQk;
  a.ld_k_nope = d.heads * kKvB, a.hs_k_nope = kKvB;
  a.ld_k_pe = kMlaRow;
  a.ld_v = d.heads * kKvB, a.hs_v = kKvB;
  a.cu_q = cu_q, a.total_q = tokens, a.batch = batch;
  a.heads = static_cast<int>(d.heads), a.max_q = max_q;
  // The keys are expanded by kv_b (K and V of every head: 96 heads take 48 KB per key), so a long context is
  // taken in passes of at most max_expanded_keys keys (by default what the step region has room for), each
  // merged into the result by its log-sum-exp: the step's memory stays bounded however long the context.
  const int64_t key_bytes = (kMlaRow + d.heads * kKvB) * static_cast<int64_t>(sizeof(bf16));
  // Keys whose latent rows and K and V fit in what the step region has left (less two buffers' alignment).
  const auto keys_left = [&] {
    const uint64_t left = arena.step_capacity() - arena.step_used();
    return static_cast<int64_t>((left - std::min<uint64_t>(left, 2 * kArenaAlignment)) /
                                static_cast<uint64_t>(key_bytes));
  };
  const auto expand = [&](const bf16* latent, int64_t rows, bf16* kv) {
    linear(stream, latent, kMlaRow, w.kv_b_proj, kMlaLatent, kv, OutType::kBF16, d.heads * kKvB, rows, d.heads * kKvB,
           kMlaLatent);
    a.k_nope = kv, a.v = kv + kNope, a.k_pe = latent + kMlaLatent;
  };

  if (total_k <= (max_expanded_keys > 0 ? max_expanded_keys : keys_left())) {
    // One pass over the whole context (the cached rows plus this chunk's, gathered from the cache). The
    // scratch is taken before the append: a step refused for memory leaves the cache as it was.
    bf16* latent = arena.step<bf16>(total_k * kMlaRow, "mla.context_latent");
    bf16* kv = arena.step<bf16>(total_k * d.heads * kKvB, "mla.kv");
    mla_kv_norm_append(stream, kv_a, kMlaRow, w.kv_a_norm, d.latent_norm_eps, slots, tokens, cache.cache, nullptr, 0);
    mla_gather_latent(stream, cache.cache, cache.page_size, cache.block_table, cache.ld_block_table, cu_k, batch, max_k,
                      latent);
    expand(latent, total_k, kv);
    a.gate = g, a.ld_gate = d.heads * kV;
    a.out = o, a.ld_out = d.heads * kV;
    a.cu_k = cu_k, a.total_k = total_k;
    mla_prefill(stream, a);
  } else {
    // Passes: this chunk's own keys (causal), then the sequences' cached rows laid end to end, `pass_keys`
    // at a time (every key precedes every query: not causal), so that no pass expands a row it does not
    // attend. Each pass writes its normalized rows and lse to part, merged into acc; the last merge applies
    // the gate and writes o.
    const int64_t heads_rows = tokens * d.heads;
    bf16* part = arena.step<bf16>(heads_rows * kV, "mla.pass_out");
    float* part_lse = arena.step<float>(heads_rows, "mla.pass_lse");
    float* acc = arena.step<float>(heads_rows * kV, "mla.acc");
    float* acc_lse = arena.step<float>(heads_rows, "mla.acc_lse");
    int32_t* cu_pass = arena.step<int32_t>(batch + 1, "mla.pass_offsets");
    int32_t* first_rows = arena.step<int32_t>(batch, "mla.pass_first_rows");
    const int64_t pass_keys = max_expanded_keys > 0 ? max_expanded_keys : keys_left();
    KIMIRT_CHECK(pass_keys >= tokens,
                 "MLA prefill: {} keys per pass (max_expanded_keys {}, or what the step region has room for) are "
                 "fewer than the chunk's {} tokens",
                 pass_keys, max_expanded_keys, tokens);
    const int64_t context = total_k - tokens;  // the sequences' cached rows
    const int64_t keys = std::min<int64_t>({pass_keys, context, (int64_t{1} << 31) - 1});
    // The chunk's own pass expands `tokens` rows, each context pass at most `keys`.
    const int64_t pass_rows = std::max(tokens, keys);
    bf16* latent = arena.step<bf16>(pass_rows * kMlaRow, "mla.pass_latent");
    bf16* kv = arena.step<bf16>(pass_rows * d.heads * kKvB, "mla.pass_kv");
    MlaPrefillMergeArgs m;
    m.tokens = tokens, m.heads = a.heads;
    m.part = part, m.ld_part = d.heads * kV, m.part_lse = part_lse, m.ld_part_lse = d.heads;
    m.acc = acc, m.acc_lse = acc_lse;
    m.gate = g, m.ld_gate = d.heads * kV, m.out = o, m.ld_out = d.heads * kV;
    a.out = part, a.ld_out = d.heads * kV, a.lse = part_lse, a.ld_lse = d.heads;

    // The chunk's own rows, normalized by the append, are its keys: queries and keys share the offsets.
    mla_kv_norm_append(stream, kv_a, kMlaRow, w.kv_a_norm, d.latent_norm_eps, slots, tokens, cache.cache, latent,
                       kMlaRow);
    expand(latent, tokens, kv);
    a.cu_k = cu_q, a.total_k = tokens, a.causal = true;
    mla_prefill(stream, a);
    mla_prefill_merge(stream, m, MlaMergeMode::kFirst);

    const int64_t passes = (context + keys - 1) / keys;
    a.cu_k = cu_pass, a.causal = false;
    for (int64_t p = 0; p < passes; ++p) {
      const int64_t rows = std::min(keys, context - p * keys);
      mla_context_chunk_offsets(stream, cu_q, cu_k, batch, p * keys, keys, cu_pass, first_rows);
      mla_gather_latent(stream, cache.cache, cache.page_size, cache.block_table, cache.ld_block_table, cu_pass, batch,
                        static_cast<int>(std::min<int64_t>(rows, max_k)), latent, first_rows);
      expand(latent, rows, kv);
      a.total_k = rows;
      mla_prefill(stream, a);
      mla_prefill_merge(stream, m, p + 1 == passes ? MlaMergeMode::kLast : MlaMergeMode::kAccumulate);
    }
  }
  o_proj(linear, stream, d, w, o, tokens, out, accumulate);
}

}  // namespace kimirt::cuda
