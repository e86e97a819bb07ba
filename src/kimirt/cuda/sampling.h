// Token sampling on the GPU: only token ids go back to the host.
//
// Per row (request), with z = logits / temperature over the row's vocabulary slice:
//   greedy (temperature < kMinTemperature, 0 included, or top_k == 1): argmax of the logits, ties to the
//     lowest id;
//   otherwise the kept set is {z ≥ τ} with τ the largest of
//     top-k:  the k-th largest z,
//     top-p:  the largest value whose tokens (among those kept by top-k) hold ≥ top_p of that mass,
//     min-p:  z_max + ln(min_p)  (p ≥ min_p · p_max);
//   and the token is argmax over the kept set of z + Gumbel noise (exactly a draw from the renormalized
//   softmax). The noise of token i is Philox4x32-10 of (seed, step, i) with i the vocabulary id (offset
//   included): the same request, seed and step give the same token, whatever the batch or the sharding.
// Ties at a threshold differ from the CPU sampler (runtime/sampler.cpp) on purpose: here every token equal
// to the top-k or top-p threshold value is kept (a threshold is a value, found without sorting), where the
// CPU sorts by (logit, lower id) and keeps exactly k tokens, or stops top-p at the first token that reaches
// the mass. Rounding aside, the kept sets differ only when logits tie exactly at the cut.
// Non-finite logits: NaN counts as -inf (never drawn unless nothing is above -inf; then the lowest id wins, as on
// the CPU). Where z is +inf (a +inf logit, or v/T past the float range) every such token scores +inf and the
// lowest id of them wins; the CPU draws uniformly among infinite logits. Ranking them by their noise alone would
// not survive the cross-shard join, which compares one score per shard.
// Temperatures in (0, kMinTemperature) are greedy: 1/T would overflow (and z = v/T long before it: every
// large logit at +inf, the lowest id of them winning), and at such T only logits within about 10·T of the
// max would have had a chance. The CPU sampler samples at any T > 0 (in double).
// The top-k and top-p thresholds are found by 4-pass radix selection on the float bits (counts for top-k,
// 2^-32 fixed-point probability mass for top-p, so the sums are exact and order-independent); at small
// batches up to 16 blocks share a row, each holding its slice in shared memory (sampling.cu).
//
// Vocabulary sharding (TP): a row's slice is logits[:, 0 .. vocab) with ids offset by vocab_offset;
// sample() also returns the winning score, and the Gumbel-max is separable: the cross-shard step keeps
// the (score, id) pair with the largest score. That is exact for greedy and temperature sampling (the
// scores are z + noise, computed the same way whatever the shard, so the token does not depend on the
// shard count) (join_candidates below); top-k, top-p and min-p are statistics of the whole vocabulary, so
// lm_head_sample (lm_head.h) gathers the shards' logits on every rank for such batches and samples them whole.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

namespace kimirt::cuda {

// Below this temperature a row is greedy (see above).
inline constexpr float kMinTemperature = 1e-6f;

struct SamplingParams {
  float temperature = 1.0f;  // below kMinTemperature (0 included): greedy
  int32_t top_k = 0;         // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  uint64_t seed = 0;
  uint64_t step = 0;  // per-request counter: the number of tokens sampled so far
};

// Whether row p is greedy (argmax, filters ignored): the sampling kernel and uses_filters share this rule.
__host__ __device__ inline bool is_greedy(const SamplingParams& p) {
  return !(p.temperature >= kMinTemperature) || p.top_k == 1;
}

// Throws kimirt::Error naming the field (temperature finite ≥ 0, top_k ≥ 0, top_p in (0, 1],
// min_p in [0, 1]: the CPU sampler's ranges).
void validate(const SamplingParams& p);

// Whether p filters the draw over a vocabulary of `vocab` tokens: a row that is not greedy with top-k below
// the vocabulary, top-p < 1 or min-p > 0. Such rows cannot be sampled shard by shard (lm_head_sample gathers
// the vocabulary for them).
bool uses_filters(const SamplingParams& p, int64_t vocab);
// Whether any of `params` (the host copy of a batch's) uses_filters over `vocab`: ShardedSampling::any_filtered.
bool any_uses_filters(std::span<const SamplingParams> params, int64_t vocab);

// Device scratch that lets several blocks share a row (small batches): sampling_workspace_bytes(rows) bytes,
// zero-filled once before its first use (init_sampling_workspace); every call leaves its barrier counters at
// zero again (the rest is scratch, written before it is read). One workspace per stream (calls on it must not
// overlap): a workspace not zeroed, or shared by overlapping calls, gives wrong tokens or a hang (the counters
// are not repaired per call, to keep a memset off the step).
// The blocks of a row wait for each other: the launch keeps blocks x rows within the SM count and is
// cooperative, so a GPU share with fewer SMs than the device reports (an MPS limit, a green context) makes
// the call fail rather than hang.
uint64_t sampling_workspace_bytes(int64_t rows);
void init_sampling_workspace(void* workspace, uint64_t bytes, cudaStream_t stream);

// logits [rows, vocab] fp32 (row stride ld), rows ≤ 65535; params [rows] on the device (validated by the
// caller: the host does not see them); out_ids [rows] int32 (ids + vocab_offset, so vocab_offset ≥ 0 and
// vocab_offset + vocab ≤ 2^31); out_scores [rows] (may be null): the winning z + noise (or the max logit
// when greedy). Without a workspace each row gets one block (same tokens, slower at small batches).
void sample(cudaStream_t stream, const float* logits, int64_t ld, int64_t rows, int64_t vocab, int64_t vocab_offset,
            const SamplingParams* params, int32_t* out_ids, float* out_scores = nullptr, void* workspace = nullptr,
            uint64_t workspace_bytes = 0);

// The cross-shard join: per row, the best of `ranks` candidates (scores and ids [ranks][stride], device) by
// sample()'s own rule, the larger score and ties to the lower id, into out_scores / out_ids [rows].
void join_candidates(cudaStream_t stream, const float* scores, const int32_t* ids, int ranks, int64_t stride,
                     int64_t rows, float* out_scores, int32_t* out_ids);

}  // namespace kimirt::cuda
