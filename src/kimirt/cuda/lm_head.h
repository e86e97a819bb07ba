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
// (Gumbel-max is separable); rows with top-k / top-p / min-p need the shards' statistics first, which an
// implementation must all-reduce (max, then the radix histograms) before sampling.
class CrossShard {
 public:
  virtual ~CrossShard() = default;
  virtual void combine(cudaStream_t stream, float* scores, int32_t* ids, int64_t rows) = 0;
};

// Logits, per-shard sampling and the cross-shard join; ids [m] on the device. cross may be null when
// shard covers the whole vocabulary. scratch_scores: [m] fp32 device. sampling_workspace: see sample().
void lm_head_sample(Linear& linear, cudaStream_t stream, const __nv_bfloat16* x, int64_t m, int64_t hidden,
                    const __nv_bfloat16* w_shard, const VocabShard& shard, float* logits, int64_t ld_logits,
                    const SamplingParams* params, int32_t* ids, float* scratch_scores, CrossShard* cross,
                    void* sampling_workspace = nullptr, uint64_t sampling_workspace_bytes = 0);

}  // namespace kimirt::cuda
