// MLA prefill attention (§3.5 steps 4–6): flash attention over expanded keys, NoPE, per head
// q = [q_nope(128) | q_pe(64)], k = [k_nope(128) | k_pe(64)] with k_pe shared by all heads, v (128),
// scale 192^-½, fp32 softmax, BF16 P·V on tensor cores; optional σ(gate) output gate fused in the
// epilogue. Varlen batch: sequence b has Tq_b queries that are the LAST Tq_b of its Tk_b key positions
// (chunked prefill: the earlier keys come from the cached latent, expanded by kv_b_proj), under the causal
// mask; or, with causal = false, queries that follow all Tk_b keys (one pass over cached rows of a long
// context, its result merged with the others' through the optional log-sum-exp output: mla_prefill_merge).
// Heads are whatever this rank holds (TP shards by heads): nothing assumes 96.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kimirt::cuda {

struct MlaPrefillArgs {
  const __nv_bfloat16* q = nullptr;  // [Tq_total, heads, 192]: token stride ld_q, head stride 192
  int64_t ld_q = 0;
  // Each token row holds every head's columns: ld_k_nope >= (heads-1)·hs_k_nope + 128, ld_k_pe >= 64,
  // ld_v >= (heads-1)·hs_v + 128 (checked).
  const __nv_bfloat16* k_nope = nullptr;  // token stride ld_k_nope, head stride hs_k_nope, 128 dims
  int64_t ld_k_nope = 0, hs_k_nope = 0;
  const __nv_bfloat16* k_pe = nullptr;  // [Tk_total, 64], token stride ld_k_pe (shared by heads)
  int64_t ld_k_pe = 0;
  const __nv_bfloat16* v = nullptr;  // token stride ld_v, head stride hs_v, 128 dims
  int64_t ld_v = 0, hs_v = 0;
  const __nv_bfloat16* gate = nullptr;  // optional [Tq_total, heads·128] logits of σ(x·g_projᵀ), ld_gate
  int64_t ld_gate = 0;
  __nv_bfloat16* out = nullptr;  // [Tq_total, heads, 128]: token stride ld_out, head stride 128
  int64_t ld_out = 0;
  const int32_t* cu_q = nullptr;  // device [batch + 1] query offsets
  const int32_t* cu_k = nullptr;  // device [batch + 1] key offsets
  // host: exactly cu_q[batch] and cu_k[batch], the rows the tensor copies may read (rows past them arrive as
  // zeros: a smaller total silently drops keys; a larger one reads rows past cu_k[batch], which must exist)
  int64_t total_q = 0, total_k = 0;
  int batch = 0;
  int heads = 0;
  int max_q = 0;       // host: a bound on the largest Tq_b (sizes the grid)
  float scale = 0.0f;  // 0 means 192^-½
  // false: every query sees all Tk_b keys of its sequence (a chunk of cached context that precedes them all).
  bool causal = true;
  // Optional [Tq_total, heads] (token stride ld_lse): each row's log-sum-exp in the log2 domain of the scaled
  // scores, m + log2(l), -inf for a row that sees no key. With it, attention over disjoint key sets can be
  // merged (mla_prefill_merge).
  float* lse = nullptr;
  int64_t ld_lse = 0;
};

// Two kernels compute the same thing: kWgmma (warpgroup MMA fed by tensor copies, 128 queries per block;
// the default) and kMma (mma.sync, 64 queries per block; kept for comparison, docs/PERF.md).
enum class MlaPrefillKernel { kAuto, kMma, kWgmma };
const char* mla_prefill_kernel_name(MlaPrefillKernel k);

// Strides are in elements and must be multiples of 8, head strides not negative, the last head's columns
// below 2^31; pointers 16-byte aligned; total_q and total_k in 1..2^31-1. Throws kimirt::Error naming the
// field otherwise.
void mla_prefill(cudaStream_t stream, const MlaPrefillArgs& a, MlaPrefillKernel kernel = MlaPrefillKernel::kAuto);

// Chunked-context prefill merges the attention of its passes (each over its own keys, with its lse) into a
// running fp32 result: acc [tokens, heads, 128] and acc_lse [tokens, heads] (contiguous) hold the passes so
// far; part (row stride ld_part, head stride 128) and part_lse (row stride ld_part_lse) are this pass's.
//   kFirst       acc, acc_lse = part, part_lse
//   kAccumulate  acc, acc_lse = the merge of both
//   kLast        out (row stride ld_out, head stride 128) = the merge of both, times σ(gate) when gate is
//                non-null (row stride ld_gate); acc is left as it was
// A row whose lse is -inf in both is 0.
enum class MlaMergeMode { kFirst, kAccumulate, kLast };
struct MlaPrefillMergeArgs {
  int64_t tokens = 0;
  int heads = 0;
  const __nv_bfloat16* part = nullptr;
  int64_t ld_part = 0;
  const float* part_lse = nullptr;
  int64_t ld_part_lse = 0;
  float* acc = nullptr;
  float* acc_lse = nullptr;
  const __nv_bfloat16* gate = nullptr;
  int64_t ld_gate = 0;
  __nv_bfloat16* out = nullptr;
  int64_t ld_out = 0;
};
void mla_prefill_merge(cudaStream_t stream, const MlaPrefillMergeArgs& m, MlaMergeMode mode);

}  // namespace kimirt::cuda
