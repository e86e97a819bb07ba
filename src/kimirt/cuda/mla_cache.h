// The paged MLA latent cache (BF16 rows of 576: normalized c_kv (512) | k_pe (64)) and the small ops
// around it: the kv_a_layernorm + append of new rows, the gather of a sequence's rows for prefill, and
// the sigmoid output gate.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kimirt::cuda {

// For each new token t: c = kv_a[t] ([512 | 64], row stride ld_kv_a); row = [RMSNorm(c[:512]; w, eps) |
// c[512:]] (rms_norm.h's formula and roundings; its sum of squares is added in another order, so a row may
// differ from rms_norm's by a bf16 step now and then) is written to cache slot slots[t] (= page · page_size + offset;
// device int32; a negative slot skips the cache write) and, when latent_out is non-null, to latent_out[t] (row stride
// ld_latent).
void mla_kv_norm_append(cudaStream_t stream, const __nv_bfloat16* kv_a, int64_t ld_kv_a, const __nv_bfloat16* w,
                        float eps, const int32_t* slots, int64_t tokens, __nv_bfloat16* cache,
                        __nv_bfloat16* latent_out, int64_t ld_latent);

// Gathers rows [f_b, f_b + len_b) of each sequence b from the cache into out rows cu_out[b] + i (row stride
// 576), f_b = first_rows[b] (device; null: 0). block_table [batch, ld_block_table] and cu_out [batch + 1] on
// the device; max_len (host) bounds len_b = cu_out[b + 1] − cu_out[b].
void mla_gather_latent(cudaStream_t stream, const __nv_bfloat16* cache, int page_size, const int32_t* block_table,
                       int64_t ld_block_table, const int32_t* cu_out, int batch, int max_len, __nv_bfloat16* out,
                       const int32_t* first_rows = nullptr);

// One pass of a chunked-context prefill. Sequence b has Tq_b = cu_q[b+1] − cu_q[b] new tokens after
// ctx_b = (cu_k[b+1] − cu_k[b]) − Tq_b cached ones; laid end to end, the sequences' cached rows form one
// list, and the pass takes its rows [first, first + keys): from sequence b its cached rows
// [first_rows[b], first_rows[b] + len_b), at cu_pass[b] (cu_pass [batch + 1], first_rows [batch]; device).
// Every pass but the last thus takes exactly `keys` rows, whatever the sequences' lengths. One warp scans.
void mla_context_chunk_offsets(cudaStream_t stream, const int32_t* cu_q, const int32_t* cu_k, int batch, int64_t first,
                               int64_t keys, int32_t* cu_pass, int32_t* first_rows);

// Load-time layout for the decode absorption: w_uk_t[h] = W_UK_hᵀ, i.e. w_uk_t[h][n][k] =
// kv_b[h·256 + k][n] for n < 512, k < 128 ([heads, 512, 128]), so that q̂_h = W_UK_hᵀ q_nope_h is an
// ordinary x·Wᵀ product for the skinny kernel.
void mla_transpose_uk(cudaStream_t stream, const __nv_bfloat16* kv_b, int64_t heads, __nv_bfloat16* w_uk_t);

// x[r, c] *= σ(gate[r, c]) for c < width (the MLA output gate before o_proj).
void sigmoid_gate_mul(cudaStream_t stream, __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* gate, int64_t ld_gate,
                      int64_t rows, int64_t width);

}  // namespace kimirt::cuda
