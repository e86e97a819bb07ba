// LM head on the GPU: fp32 logits of this rank's vocabulary slice (lm_head.weight shards by vocab rows
// under TP), then sampling (sampling.h). The step that joins the shards' candidates is an interface
// (CrossShard) that the parallel layer implements over NCCL; with one rank it is the identity.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kimirt/cuda/gemm_dispatch.h"
#include "kimirt/cuda/sampling.h"

namespace kimirt::cuda {

struct VocabShard {
  int64_t offset = 0;  // first vocabulary id of this rank's slice
  int64_t size = 0;    // rows of lm_head.weight held here
  int64_t total = 0;   // full vocabulary
};

// logits[m, shard.size] (fp32, row stride ld_logits) = x[m, hidden] · w_shard[shard.size, hidden]ᵀ.
void lm_head_logits(Linear& linear, cudaStream_t stream, const __nv_bfloat16* x, int64_t m, int64_t hidden,
                    const __nv_bfloat16* w_shard, const VocabShard& shard, float* logits, int64_t ld_logits);

// Joins per-shard (score, id) candidates into the global pick, in place on every rank: for each row keep
// the pair with the larger score (ties: lower id). Exact for greedy and temperature-only sampling
// (Gumbel-max is separable, and every shard draws a token's noise from its global id); rows with top-k /
// top-p / min-p would need the shards' statistics first (an all-reduce of the max, then of the radix
// histograms, before sampling), which nothing implements: lm_head_sample refuses them.
class CrossShard {
 public:
  virtual ~CrossShard() = default;
  virtual void combine(cudaStream_t stream, float* scores, int32_t* ids, int64_t rows) = 0;
};

// Logits, per-shard sampling and the cross-shard join; ids [m] on the device. cross may be null when
// shard covers the whole vocabulary. scratch_scores: [m] fp32 device (needed when sharded).
// sampling_workspace: see sample().
// any_filtered: whether any row of params uses_filters(row, shard.total) (sampling.h). The params live on
// the device, where the host cannot look without a sync, so the caller, who filled them, says; a sharded
// call with any_filtered throws before launching anything, since each shard would keep its own top k / top
// p / min p instead of the vocabulary's and sample from the wrong distribution. Serve such batches from
// logits gathered to one rank (sample() over the full vocabulary), or unsharded. Unsharded calls ignore it.
// Under stream capture the check runs once, at capture: the flag must hold for every replay.
void lm_head_sample(Linear& linear, cudaStream_t stream, const __nv_bfloat16* x, int64_t m, int64_t hidden,
                    const __nv_bfloat16* w_shard, const VocabShard& shard, float* logits, int64_t ld_logits,
                    const SamplingParams* params, bool any_filtered, int32_t* ids, float* scratch_scores,
                    CrossShard* cross, void* sampling_workspace = nullptr, uint64_t sampling_workspace_bytes = 0);

}  // namespace kimirt::cuda
