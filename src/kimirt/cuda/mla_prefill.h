// MLA prefill attention (§3.5 steps 4–6): causal flash attention over expanded keys, NoPE, per head
// q = [q_nope(128) | q_pe(64)], k = [k_nope(128) | k_pe(64)] with k_pe shared by all heads, v (128),
// scale 192^-½, fp32 softmax, BF16 P·V on tensor cores; optional σ(gate) output gate fused in the
// epilogue. Varlen batch: sequence b has Tq_b queries that are the LAST Tq_b of its Tk_b key positions
// (chunked prefill: the earlier keys come from the cached latent, expanded by kv_b_proj).
// Heads are whatever this rank holds (TP shards by heads): nothing assumes 96.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kimirt::cuda {

struct MlaPrefillArgs {
  const __nv_bfloat16* q = nullptr;  // [Tq_total, heads, 192]: token stride ld_q, head stride 192
  int64_t ld_q = 0;
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
};

// Two kernels compute the same thing: kWgmma (warpgroup MMA fed by tensor copies, 128 queries per block;
// the default) and kMma (mma.sync, 64 queries per block; kept for comparison, docs/PERF.md).
enum class MlaPrefillKernel { kAuto, kMma, kWgmma };
const char* mla_prefill_kernel_name(MlaPrefillKernel k);

// Strides are in elements and must be multiples of 8, head strides not negative, the last head's columns
// below 2^31; pointers 16-byte aligned; total_q and total_k in 1..2^31-1. Throws kimirt::Error naming the
// field otherwise.
void mla_prefill(cudaStream_t stream, const MlaPrefillArgs& a, MlaPrefillKernel kernel = MlaPrefillKernel::kAuto);

}  // namespace kimirt::cuda
