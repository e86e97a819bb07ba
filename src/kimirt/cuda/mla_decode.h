// MLA decode attention with absorbed weights (§3.5 "absorption") over the paged latent cache: per query
// token and head, q_abs = [W_UKᵀ q_nope (512) | q_pe (64)] scores every cached row c = [c_kv (512) |
// k_pe (64)] as q_abs·c / √192, and the output is the softmax-weighted sum of the c_kv parts (512 per head;
// W_UV is applied afterwards by a batched GEMM). One KV "head" is shared by all query heads, so a block
// takes a group of heads against the cache tiles of one context chunk, and every tile is read from HBM once
// (head groups of the same chunk run side by side and share it through L2). Long contexts are split across
// blocks (flash-decoding) and merged by a second kernel.
//
// Three kernels, picked by the plan (kWgmma64 only on request, kept for comparison):
//   kMma16   ≤ 16 heads per block on mma.sync tiles, a copy-engine producer warp feeding a 4-stage ring
//            and two consumer warpgroups taking alternate tiles: the memory-bound case (K3 under TP ≥ 6).
//   kWgmma64 ≤ 64 heads per block on wgmma (M = 64): for many heads per GPU, where the tensor cores work;
//            both warpgroups on every tile, half the dims each.
//   kSeesaw  ≤ 64 heads per block on wgmma, the warpgroups taking alternate tiles' scores and sharing P,
//            so that one's softmax runs while the other's wgmmas do: the plan's choice above 16 heads.
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
  // Optional: the rope part of q (64 values per head) read from here instead of q's values 512..575 (then
  // not read): [batch, heads, 64] with head stride ld_q_pe_head and batch stride ld_q_pe, 16-byte aligned,
  // strides multiples of 8. The layer step points it at q_b's output, so that no copy of q_pe into q runs
  // between the projections and the attention.
  const __nv_bfloat16* q_pe = nullptr;
  int64_t ld_q_pe_head = 0;
  int64_t ld_q_pe = 0;
  int batch = 0;
  int heads = 0;
  float scale = 0.0f;  // 0 means 192^-½ (q_nope 128 + q_pe 64)
  // Start before the previous kernel on the stream has finished (programmatic dependent launch): the blocks
  // look up their pages and start copying cache tiles at once, and wait for that kernel only before they
  // read q and write out (so it may still read out and the workspace). The contract: no grid that may still
  // run when this call starts writes cache, block_table or seq_lens. That is the previous kernel and, when
  // it was itself launched as a programmatic dependent that lets its dependents start before its own wait
  // (as this call's merge kernel does), the grids it may overlap, recursively. The absorption GEMM before
  // the attention in a layer step qualifies. Overlap only happens when the stream's previous operation is a
  // kernel. Otherwise a decode call's start (launch, page lookup, first copies: a few µs) is spent idle.
  // q and q_pe are read after the wait: whatever writes them must have ended by the time that kernel has
  // (an earlier kernel on the stream, as q_b's GEMM for q_pe in the layer step, when the kernels in between
  // each wait for their predecessor, as ordinary launches and griddepcontrol.wait do).
  bool overlap_previous = false;
};

inline constexpr int kMlaChunkAlign = 16;  // a plan's chunk is a multiple of this (kMma16, kSeesaw: of 32)

enum class MlaDecodeKernel : int {
  kAuto = 0,     // plan_mla_decode chooses (a plan always holds one of the others)
  kMma16 = 1,    // ≤ kMlaMma16Heads heads per block
  kWgmma64 = 2,  // ≤ kMlaWgmmaHeads heads per block
  kSeesaw = 3,   // ≤ kMlaWgmmaHeads heads per block
};
inline constexpr int kMlaMma16Heads = 16;
inline constexpr int kMlaWgmmaHeads = 64;
// kAuto takes kMma16 up to kMlaAutoMma16MaxHeads heads per GPU, and above it while its groups of 16 heads times
// the batch's cache rows (batch x max_seq_len) stay within kMlaAutoMma16Rows; kSeesaw otherwise. Each kMma16
// group reads every row (the groups share them through L2) with no padding of the heads; kSeesaw reads a row
// once for up to 64 heads, padded to 64. Measured on the H200 (2026-12-01, machines DY and DZ, PERF.md): at B=1
// 4k kMma16 takes 8.9-12.9 us at 20-96 heads, kSeesaw 13.1-15.0; at 20-32 heads (2 groups) B=1 32k / B=8 4k
// kMma16 20.7-20.9 / 22.5-24.4 us, kSeesaw 21.5-22.1 / 23.6-25.8; with 3 groups or more at 32k rows, or 2 groups
// at B=8 32k, kSeesaw is faster (22.0 against 27.1 us at 40 heads B=1 32k; 84 against 117 at 20 heads B=8 32k).
// At 12 and 16 heads kMma16 is the faster at every batch and length measured; at 96 heads kSeesaw is 1.2x (4k)
// to 2.0x (B=64) faster than kWgmma64 (which is kept for comparison).
inline constexpr int kMlaAutoMma16MaxHeads = 16;
inline constexpr int64_t kMlaAutoMma16Rows = 65536;

const char* mla_decode_kernel_name(MlaDecodeKernel kernel);

struct MlaDecodePlan {
  MlaDecodeKernel kernel = MlaDecodeKernel::kAuto;  // kAuto here: not a plan (mla_decode refuses it)
  int splits = 1;                                   // context chunks per sequence
  int chunk = 0;                                    // rows per chunk (multiple of kMlaChunkAlign)
  int head_groups = 1;                              // blocks per (sequence, chunk) along heads
  int heads_per_group = 0;                          // ≤ the kernel's heads per block
  uint64_t workspace_bytes = 0;                     // partial outputs when splits > 1
};

// max_seq_len: host-side bound on seq_lens (the scheduler knows it); sm_count: from DeviceInfo. `kernel`
// forces one kernel (tests and benchmarks compare them); kAuto picks by heads, batch and length (above).
MlaDecodePlan plan_mla_decode(int batch, int heads, int max_seq_len, int sm_count,
                              MlaDecodeKernel kernel = MlaDecodeKernel::kAuto);

// Runs the plan (workspace: plan.workspace_bytes, device, may be null when 0). Throws kimirt::Error
// naming the field on bad arguments.
void mla_decode(cudaStream_t stream, const MlaDecodeArgs& a, const MlaDecodePlan& plan, void* workspace);

}  // namespace kimirt::cuda
