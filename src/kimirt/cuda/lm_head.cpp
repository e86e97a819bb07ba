// LM head composition.
#include "kimirt/cuda/lm_head.h"

#include "kimirt/base/error.h"

namespace kimirt::cuda {

void lm_head_logits(Linear& linear, cudaStream_t stream, const __nv_bfloat16* x, int64_t m, int64_t hidden,
                    const __nv_bfloat16* w_shard, const VocabShard& shard, float* logits, int64_t ld_logits) {
  KIMIRT_CHECK(shard.size > 0 && shard.offset >= 0 && shard.offset + shard.size <= shard.total,
               "lm_head: vocabulary shard [{}, {}) does not fit a vocabulary of {}", shard.offset,
               shard.offset + shard.size, shard.total);
  KIMIRT_CHECK(ld_logits >= shard.size, "lm_head: logits row stride {} < shard size {}", ld_logits, shard.size);
  linear(stream, x, hidden, w_shard, hidden, logits, OutType::kF32, ld_logits, m, shard.size, hidden);
}

void lm_head_sample(Linear& linear, cudaStream_t stream, const __nv_bfloat16* x, int64_t m, int64_t hidden,
                    const __nv_bfloat16* w_shard, const VocabShard& shard, float* logits, int64_t ld_logits,
                    const SamplingParams* params, bool any_filtered, int32_t* ids, float* scratch_scores,
                    CrossShard* cross, void* sampling_workspace, uint64_t sampling_workspace_bytes) {
  const bool sharded = shard.size != shard.total;
  // Before any launch: a refused call leaves the stream untouched.
  if (sharded) {
    KIMIRT_CHECK(cross, "lm_head: a vocabulary shard of {} of {} needs a cross-shard step", shard.size, shard.total);
    KIMIRT_CHECK(scratch_scores, "lm_head: scratch_scores is null; a vocabulary shard of {} of {} joins scores",
                 shard.size, shard.total);
    KIMIRT_CHECK(!any_filtered,
                 "lm_head: any_filtered is set (top-k / top-p / min-p) on a vocabulary shard [{}, {}) of {}: a shard "
                 "would filter by its own logits, not the vocabulary's; sample the full vocabulary instead",
                 shard.offset, shard.offset + shard.size, shard.total);
  }
  lm_head_logits(linear, stream, x, m, hidden, w_shard, shard, logits, ld_logits);
  sample(stream, logits, ld_logits, m, shard.size, shard.offset, params, ids, scratch_scores, sampling_workspace,
         sampling_workspace_bytes);
  if (sharded) cross->combine(stream, scratch_scores, ids, m);
}

}  // namespace kimirt::cuda
