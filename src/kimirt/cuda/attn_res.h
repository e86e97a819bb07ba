// Block Attention Residuals depth mix (§3.3) fused with the RMSNorm that follows it, per token, fp32 math:
//   k_i = v_i · (mean(v_i²) + ε_res)^-½,  s_i = ⟨k_i, u⟩,  α = softmax(s),  h = bf16(Σ α_i v_i),
//   y = RMSNorm(h; norm_w, ε_norm)  (rms_norm.h semantics).
// u = res_norm.weight ⊙ res_proj.weight is precomputed in fp32 at load time (attn_res_pseudo_query).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kimirt::cuda {

inline constexpr int kAttnResMaxCandidates = 12;

// u[i] = float(norm_w[i]) · float(proj_w[i]).
void attn_res_pseudo_query(cudaStream_t stream, const __nv_bfloat16* norm_w, const __nv_bfloat16* proj_w, float* u,
                           int64_t hidden);

// Kernel versions, kept so the benchmark can compare them (attn_res.cu says how they differ); kAuto is the
// per-token one, the faster on the H200 at 1, 256 and 4096 tokens.
enum class AttnResKernel { kAuto, kPerToken, kPipelined };

// candidates: host array of `count` (1..12) device pointers, each [tokens, hidden] with row stride ld_in
// (block snapshots first, the running prefix last). mixed (may be null) receives h, normed receives y,
// both with row stride ld_out. hidden a multiple of 8 and ≤ 16384, count · hidden bytes ≤ 200 KiB (each
// half of a token's candidates is staged in the shared memory of one block of a two-block cluster, so that
// HBM is read once).
void attn_res_mix_norm(cudaStream_t stream, const __nv_bfloat16* const* candidates, int count, int64_t ld_in,
                       int64_t tokens, int64_t hidden, const float* u, float res_eps, const __nv_bfloat16* norm_w,
                       float norm_eps, __nv_bfloat16* mixed, __nv_bfloat16* normed, int64_t ld_out,
                       AttnResKernel kernel = AttnResKernel::kAuto);

}  // namespace kimirt::cuda
