// One MLA mixer step on the GPU (§3.5), composed from the kernels: the projections (Linear), the latent
// norms, the cache append, the absorbed attention (decode) or the expanded flash attention (prefill),
// W_UV, the σ output gate and o_proj. Heads are this rank's heads (TP shards by heads); the caller
// reduces `out` across ranks. Scratch comes from the arena's step region and is released on return.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kimirt/cuda/gemm_dispatch.h"
#include "kimirt/cuda/memory.h"

namespace kimirt::cuda {

struct MlaLayerDims {
  int64_t hidden = 0;
  int64_t heads = 0;         // heads on this rank
  int64_t q_lora_rank = 0;   // 0: direct q_proj (Kimi Linear)
  bool output_gate = false;  // mla_use_output_gate
  float latent_norm_eps = 1e-6f;
  // kv_lora_rank 512, qk_nope 128, qk_rope 64, v 128 are fixed by the kernels (both model families).
};

struct MlaLayerWeights {                     // BF16, device, this rank's slices, checkpoint layouts
  const __nv_bfloat16* q_proj = nullptr;     // [heads·192, hidden]  (q_lora_rank == 0)
  const __nv_bfloat16* q_a_proj = nullptr;   // [q_lora_rank, hidden]
  const __nv_bfloat16* q_a_norm = nullptr;   // [q_lora_rank]
  const __nv_bfloat16* q_b_proj = nullptr;   // [heads·192, q_lora_rank]
  const __nv_bfloat16* kv_a_proj = nullptr;  // [576, hidden]
  const __nv_bfloat16* kv_a_norm = nullptr;  // [512]
  const __nv_bfloat16* kv_b_proj = nullptr;  // [heads·256, 512]: per head [k_nope 128 | v 128] rows
  const __nv_bfloat16* w_uk_t = nullptr;     // optional [heads, 512, 128] (mla_transpose_uk at load time):
                                             // lets small decode batches absorb with the skinny kernel
  const __nv_bfloat16* g_proj = nullptr;     // [heads·128, hidden]
  const __nv_bfloat16* o_proj = nullptr;     // [hidden, heads·128]
};

struct MlaCacheView {
  __nv_bfloat16* cache = nullptr;  // [pages, page_size, 576]
  int page_size = 64;
  const int32_t* block_table = nullptr;  // device [batch, ld_block_table]
  // A row holds a sequence's pages: the steps refuse a length bound (max_seq_len, max_k) past
  // ld_block_table · page_size rows.
  int64_t ld_block_table = 0;
  // Pages in `cache` (0: unknown). Known, it bounds the attention's tensor copies: a block-table entry past
  // it reads zeros instead of whatever memory follows the cache.
  int64_t num_pages = 0;
};

// A second stream for the decode step: the kv_a projection with the cache append, and the output-gate
// projection, run on it concurrently with the q path (at batch 1 each of these GEMVs is too short to fill
// the GPU alone). `linear` must be a Linear of its own (GEMM workspaces belong to one stream); the three
// events (cudaEventDisableTiming) are the caller's. Works eagerly and under graph capture.
// Give the side stream a lower priority than the step's stream (Stream(priority)): the q path, the attention
// and o_proj then get the SMs first and the gate projection fills what they leave. A CUDA graph keeps the
// captured priorities only when instantiated with cudaGraphInstantiateFlagUseNodePriority. (H200, B=1, 32k,
// graph, three runs each: 154.8-155.6 us against 157.1-158.1 at equal priorities; on another machine
// 153.7-154.1 against 157.5-161.8.)
//
// The gate projection (one long GEMV at decode batches) may keep `gate_sms` SMs for itself (Linear::on_sms)
// while the attention is planned for the others: where the attention is compute-bound (many heads per
// GPU) the two then overlap, the gate's bytes streaming while the attention computes, instead of the gate
// competing with the q path for bandwidth before it. kMlaGateSmsAuto takes mla_gate_sms's measured choice.
inline constexpr int kMlaGateSmsAuto = -1;
struct MlaSideStream {
  cudaStream_t stream = nullptr;
  Linear* linear = nullptr;
  cudaEvent_t fork = nullptr;        // main -> side: x is ready
  cudaEvent_t kv_ready = nullptr;    // side -> main: the new cache rows are written
  cudaEvent_t gate_ready = nullptr;  // side -> main: the gate projection is done
  int gate_sms = kMlaGateSmsAuto;    // SMs kept by the gate projection (0: none; below the device's count)
};

// The SMs a decode step's gate projection keeps beside the attention (MlaSideStream::gate_sms), measured on
// the H200: 48 of 132 at 96 heads per GPU and batch 1; none where the attention is memory-bound (at most 64
// heads per GPU) or at batches above 1.
int mla_gate_sms(int sm_count, int64_t heads, int64_t batch);

// Decode: one new token per sequence. x [batch, hidden] (the normed layer input), slots [batch] (device:
// cache slot of each new token), seq_lens [batch] (device, including the new token), max_seq_len (host
// bound). out [batch, hidden] (+= when accumulate). side: optional (above).
// Everything that changes per step is read on the device, so a captured step replays for any lengths up to
// max_seq_len; the attention's split is planned from max_seq_len at capture, so a graph is captured with the
// cache's capacity (a longer context would still be right, but its last chunk would take the rest alone).
void mla_decode_step(Linear& linear, DeviceArena& arena, cudaStream_t stream, const MlaLayerDims& dims,
                     const MlaLayerWeights& w, const MlaCacheView& cache, const __nv_bfloat16* x, int64_t batch,
                     const int32_t* slots, const int32_t* seq_lens, int max_seq_len, __nv_bfloat16* out,
                     bool accumulate = false, const MlaSideStream* side = nullptr);

// Prefill (chunked): x [Tq_total, hidden] for `batch` sequences with query offsets cu_q and context
// offsets cu_k (device, [batch + 1]; sequence b's context = its cached rows plus this chunk, all already
// counted in the block table); slots [Tq_total] (device) for the new rows, each the row the block table gives
// that token (none negative: a pass over the whole context reads the chunk's own keys back from the cache,
// where a skipped row would hold stale values). tokens and total_k: host, exactly
// cu_q[batch] and cu_k[batch] (they bound the attention's tensor copies). max_q / max_k: host bounds.
// max_expanded_keys: the most keys whose K and V are expanded at once (0: as many as the arena's step region
// has room for); a longer context is attended in passes merged by their log-sum-exp. A pass expands at least
// the chunk's own keys, so it must be 0 or >= tokens; by default the step region must then hold the keys of
// `tokens` plus the passes' merge buffers (about 6·tokens·heads·128 bytes), else the step throws.
void mla_prefill_step(Linear& linear, DeviceArena& arena, cudaStream_t stream, const MlaLayerDims& dims,
                      const MlaLayerWeights& w, const MlaCacheView& cache, const __nv_bfloat16* x, int64_t tokens,
                      int batch, const int32_t* cu_q, const int32_t* cu_k, int64_t total_k, int max_q, int max_k,
                      const int32_t* slots, __nv_bfloat16* out, bool accumulate = false, int64_t max_expanded_keys = 0);

}  // namespace kimirt::cuda
