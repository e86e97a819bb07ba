// MLA decode attention with absorbed weights (§3.5 "absorption") over the paged latent cache: per query
// token and head, q_abs = [W_UKᵀ q_nope (512) | q_pe (64)] scores every cached row c = [c_kv (512) |
// k_pe (64)] as q_abs·c / √192, and the output is the softmax-weighted sum of the c_kv parts (512 per head;
// W_UV is applied afterwards by a batched GEMM). One KV "head" shared by all query heads, so a block
// takes up to 64 heads against one 48-row tile of the cache at a time on Hopper tensor cores (wgmma), and
// each tile is read from HBM once. Long contexts are split across blocks (flash-decoding) and merged by a
// second kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kimirt::cuda {

inline constexpr int kMlaLatent = 512;                 // kv_lora_rank
inline constexpr int kMlaRope = 64;                    // qk_rope_head_dim
inline constexpr int kMlaRow = kMlaLatent + kMlaRope;  // one cached row: 576 values

struct MlaDecodeArgs {
  const __nv_bfloat16* q = nullptr;  // [batch, heads, 576]: per-query stride ld_q, head stride 576
  int64_t ld_q = 0;
  const __nv_bfloat16* cache = nullptr;  // [pages, page_size, 576]
  int page_size = 0;                     // a multiple of 32
  int64_t num_pages = 0;                 // pages in `cache` (0: unknown; only bounds the copies)
  const int32_t* block_table = nullptr;  // device [batch, ld_block_table]: page ids of each sequence
  int64_t ld_block_table = 0;
  const int32_t* seq_lens = nullptr;  // device [batch]: cached rows of each sequence (the current token's
                                      // row already appended)
  __nv_bfloat16* out = nullptr;       // [batch, heads, 512]: per-query stride ld_out, head stride 512
  int64_t ld_out = 0;
  int batch = 0;
  int heads = 0;
  float scale = 0.0f;  // 0 means 192^-½ (q_nope 128 + q_pe 64)
};

inline constexpr int kMlaChunkAlign = 16;  // a plan's chunk is a multiple of this

struct MlaDecodePlan {
  int splits = 1;                // context chunks per sequence
  int chunk = 0;                 // rows per chunk (multiple of kMlaChunkAlign)
  int head_groups = 1;           // blocks per (sequence, chunk) along heads
  int heads_per_group = 0;       // ≤ 64
  uint64_t workspace_bytes = 0;  // partial outputs when splits > 1
};

// max_seq_len: host-side bound on seq_lens (the scheduler knows it); sm_count: from DeviceInfo.
MlaDecodePlan plan_mla_decode(int batch, int heads, int max_seq_len, int sm_count);

// Runs the plan (workspace: plan.workspace_bytes, device, may be null when 0). Throws kimirt::Error
// naming the field on bad arguments.
void mla_decode(cudaStream_t stream, const MlaDecodeArgs& a, const MlaDecodePlan& plan, void* workspace);

}  // namespace kimirt::cuda
