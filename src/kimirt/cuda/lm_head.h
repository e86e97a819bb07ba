// LM head on the GPU: fp32 logits of this rank's vocabulary slice (lm_head.weight shards by vocab rows
// under TP), then sampling (sampling.h). The steps across the shards are an interface (CrossShard),
// implemented over a device Comm (NcclComm) by CommCrossShard; with one rank there is none.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kimirt/comm/comm.h"
#include "kimirt/cuda/gemm_dispatch.h"
#include "kimirt/cuda/memory.h"
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

// The cross-rank steps of a vocabulary-sharded LM head (every rank holds the same rows, its own slice of the
// vocabulary). combine joins the shards' candidates in place on every rank: per row the (score, id) pair with
// the larger score (ties: lower id); that is exact for greedy and temperature-only sampling (Gumbel-max is
// separable, and every shard draws a token's noise from its global id). Top-k, top-p and min-p need the
// whole vocabulary's logits instead: gather_logits assembles them on every rank, in vocabulary order.
class CrossShard {
 public:
  virtual ~CrossShard() = default;
  // The most rows one call may join or gather (lm_head_sample checks it before launching anything).
  virtual int64_t max_rows() const = 0;
  virtual void combine(cudaStream_t stream, float* scores, int32_t* ids, int64_t rows) = 0;
  // shard_logits [rows, shard size] (row stride ld_shard) of every rank -> full [rows, vocabulary] (ld_full).
  virtual void gather_logits(cudaStream_t stream, const float* shard_logits, int64_t ld_shard, int64_t rows,
                             float* full, int64_t ld_full) = 0;
};

// CrossShard over an NcclComm (anything else is refused), for shards of equal size (rank r holds ids
// [r·size, (r+1)·size)). Its gather buffers, for up to max_rows rows, come from the persistent region of
// `arena` (on the comm's GPU), so that the memory plan counts them: (ranks + 1)·max_rows·size fp32 logits
// (377 MB at TP 8 over 163840 ids and 512 rows) and two [ranks][max_rows] arrays, arena_bytes() in all.
class CommCrossShard final : public CrossShard {
 public:
  CommCrossShard(Comm& comm, const VocabShard& shard, int64_t max_rows, DeviceArena& arena);
  // The persistent arena bytes the constructor takes (alignment included).
  static uint64_t arena_bytes(int ranks, const VocabShard& shard, int64_t max_rows);
  int64_t max_rows() const override { return max_rows_; }
  void combine(cudaStream_t stream, float* scores, int32_t* ids, int64_t rows) override;
  void gather_logits(cudaStream_t stream, const float* shard_logits, int64_t ld_shard, int64_t rows, float* full,
                     int64_t ld_full) override;

 private:
  Comm& comm_;
  VocabShard shard_;
  int64_t max_rows_;
  float* scores_ = nullptr;  // [ranks][max_rows]
  int32_t* ids_ = nullptr;   // [ranks][max_rows]
  float* logits_ = nullptr;  // [ranks + 1][max_rows][shard size]: the gathered shards, then the packed send slice
};

// What a vocabulary-sharded call needs (unused when the shard is the whole vocabulary).
struct ShardedSampling {
  CrossShard* cross = nullptr;
  float* scratch_scores = nullptr;  // [m] fp32: the shard's winning scores, joined by combine
  // Whether any row of the params uses_filters(row, vocabulary) (sampling.h). The params live on the device,
  // where the host cannot look without a sync, so the caller, who filled them, says (any_uses_filters of
  // the host copy over the whole vocabulary; a shard's size there would miss top-k between it and the
  // vocabulary, and every shard would then keep its own top k: a wrong distribution, no error). Then every row is
  // sampled from the gathered vocabulary in full_logits ([m, vocabulary] fp32, row stride ld_full) on every
  // rank: the same logits, params and seeds give every rank the same ids. It must be the same on every rank
  // (they run different collectives otherwise). Under stream capture the choice is made once, at capture:
  // the flag must hold for every replay.
  bool any_filtered = false;
  float* full_logits = nullptr;
  int64_t ld_full = 0;
};

// Logits, sampling and, when sharded, the cross-rank step; ids [m] on the device. sampling_workspace: see
// sample(). Throws before launching anything when a call has more rows than sample() takes, or a sharded call
// lacks what `tp` must hold or has more rows than its cross step; that `cross` was built for this shard is the
// caller's to keep.
void lm_head_sample(Linear& linear, cudaStream_t stream, const __nv_bfloat16* x, int64_t m, int64_t hidden,
                    const __nv_bfloat16* w_shard, const VocabShard& shard, float* logits, int64_t ld_logits,
                    const SamplingParams* params, int32_t* ids, const ShardedSampling& tp = {},
                    void* sampling_workspace = nullptr, uint64_t sampling_workspace_bytes = 0);

}  // namespace kimirt::cuda
