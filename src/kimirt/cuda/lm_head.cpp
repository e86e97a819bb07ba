// LM head composition, and the cross-rank steps of a vocabulary-sharded one over a device Comm.
#include "kimirt/cuda/lm_head.h"

#include "kimirt/base/error.h"
#include "kimirt/cuda/check.h"
#include "kimirt/cuda/nccl_comm.h"

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
                    const SamplingParams* params, int32_t* ids, const ShardedSampling& tp, void* sampling_workspace,
                    uint64_t sampling_workspace_bytes) {
  const bool sharded = shard.size != shard.total;
  // Before any launch: a refused call leaves the stream untouched, and on a vocabulary shard no rank enters the
  // logits gather that another, refused later in sample(), would leave waiting.
  KIMIRT_CHECK(m <= 65535, "lm_head: {} rows, sample() takes at most 65535", m);
  KIMIRT_CHECK(params && ids, "lm_head: params or ids is null");
  KIMIRT_CHECK(shard.total <= (int64_t{1} << 30), "lm_head: a vocabulary of {}, sample() takes at most 2^30",
               shard.total);
  KIMIRT_CHECK(!sampling_workspace || sampling_workspace_bytes >= cuda::sampling_workspace_bytes(m),
               "lm_head: a sampling workspace of {} bytes; {} rows need {}", sampling_workspace_bytes, m,
               cuda::sampling_workspace_bytes(m));
  if (sharded) {
    KIMIRT_CHECK(tp.cross, "lm_head: a vocabulary shard [{}, {}) of {} needs a cross-shard step", shard.offset,
                 shard.offset + shard.size, shard.total);
    KIMIRT_CHECK(m <= tp.cross->max_rows(), "lm_head: {} rows, the cross-shard step holds {}", m, tp.cross->max_rows());
    if (tp.any_filtered) {
      KIMIRT_CHECK(tp.full_logits && tp.ld_full >= shard.total,
                   "lm_head: filtered rows on a vocabulary shard sample the gathered vocabulary: full_logits [{}, {}] "
                   "is {} (row stride {})",
                   m, shard.total, tp.full_logits ? "set" : "null", tp.ld_full);
    } else {
      KIMIRT_CHECK(tp.scratch_scores, "lm_head: scratch_scores is null; a vocabulary shard of {} of {} joins scores",
                   shard.size, shard.total);
    }
  }
  lm_head_logits(linear, stream, x, m, hidden, w_shard, shard, logits, ld_logits);
  if (sharded && tp.any_filtered) {
    // Top-k, top-p and min-p are statistics of the whole vocabulary: every rank samples it, identically.
    tp.cross->gather_logits(stream, logits, ld_logits, m, tp.full_logits, tp.ld_full);
    sample(stream, tp.full_logits, tp.ld_full, m, shard.total, 0, params, ids, nullptr, sampling_workspace,
           sampling_workspace_bytes);
    return;
  }
  sample(stream, logits, ld_logits, m, shard.size, shard.offset, params, ids, sharded ? tp.scratch_scores : nullptr,
         sampling_workspace, sampling_workspace_bytes);
  if (sharded) tp.cross->combine(stream, tp.scratch_scores, ids, m);
}

uint64_t CommCrossShard::arena_bytes(int ranks, const VocabShard& shard, int64_t max_rows) {
  const auto r = static_cast<uint64_t>(ranks), m = static_cast<uint64_t>(max_rows);
  // + kArenaAlignment: the padding before the first buffer when the arena's persistent region does not end on a
  // 256-byte boundary (an arena sized exactly would refuse the last buffer by those bytes).
  return 2 * align_up(r * m * 4, kArenaAlignment) +
         align_up((r + 1) * m * static_cast<uint64_t>(shard.size) * 4, kArenaAlignment) + kArenaAlignment;
}

CommCrossShard::CommCrossShard(Comm& comm, const VocabShard& shard, int64_t max_rows, DeviceArena& arena)
    : comm_(comm), shard_(shard), max_rows_(max_rows) {
  // Its buffers are handed to the comm's collectives: they must live where its ranks' kernels run.
  const auto* nccl = dynamic_cast<const NcclComm*>(&comm);
  KIMIRT_CHECK(nccl && nccl->device() == arena.device(),
               "lm_head: the cross-shard step needs a device communicator (NCCL) on the arena's GPU {}; got {}",
               arena.device(),
               nccl ? fmt::format("NCCL on GPU {}", nccl->device()) : std::string("a host communicator"));
  const int64_t ranks = comm.size();
  KIMIRT_CHECK(
      max_rows > 0 && shard.size > 0 && shard.size * ranks == shard.total && shard.offset == shard.size * comm.rank(),
      "lm_head: rank {} of {} holds the vocabulary shard [{}, {}) of {} (max_rows {}); the cross-shard step "
      "needs equal shards in rank order",
      comm.rank(), ranks, shard.offset, shard.offset + shard.size, shard.total, max_rows);
  // All three or none: a refused last allocation must not leave the first two owned by nobody (the arena
  // gives persistent memory back only by rewinding). The element counts are bounded before they are formed.
  KIMIRT_CHECK(max_rows <= (int64_t{1} << 40) / (ranks + 1) / shard.size,
               "lm_head: max_rows {} x {} ranks x {} shard entries is too large", max_rows, ranks, shard.size);
  const uint64_t mark = arena.persistent_mark();
  try {
    scores_ = arena.persistent<float>(static_cast<uint64_t>(ranks * max_rows), "lm_head.cross_scores");
    ids_ = arena.persistent<int32_t>(static_cast<uint64_t>(ranks * max_rows), "lm_head.cross_ids");
    logits_ =
        arena.persistent<float>(static_cast<uint64_t>((ranks + 1) * max_rows * shard.size), "lm_head.cross_logits");
  } catch (...) {
    arena.rewind_persistent(mark);
    throw;
  }
}

void CommCrossShard::combine(cudaStream_t stream, float* scores, int32_t* ids, int64_t rows) {
  KIMIRT_CHECK(rows >= 0 && rows <= max_rows_, "lm_head: {} rows to join, the cross-shard step holds {}", rows,
               max_rows_);
  if (rows == 0) return;
  // Rank r's candidates land at [r][rows].
  comm_.all_gather(scores, scores_, static_cast<size_t>(rows), DType::kF32, stream);
  comm_.all_gather(ids, ids_, static_cast<size_t>(rows), DType::kI32, stream);
  join_candidates(stream, scores_, ids_, comm_.size(), rows, rows, scores, ids);
}

void CommCrossShard::gather_logits(cudaStream_t stream, const float* shard_logits, int64_t ld_shard, int64_t rows,
                                   float* full, int64_t ld_full) {
  KIMIRT_CHECK(rows >= 0 && rows <= max_rows_ && ld_shard >= shard_.size && ld_full >= shard_.total,
               "lm_head: gathering {} rows of logits (row strides {} and {}) for shards of {} of {}, {} rows at most",
               rows, ld_shard, ld_full, shard_.size, shard_.total, max_rows_);
  if (rows == 0) return;
  const int ranks = comm_.size();
  const size_t width = static_cast<size_t>(shard_.size) * 4;
  // The gather sends one contiguous block: the shard's rows packed first unless they are already.
  float* gathered = logits_;
  const float* send = shard_logits;
  if (ld_shard != shard_.size) {
    float* packed = gathered + static_cast<int64_t>(ranks) * max_rows_ * shard_.size;
    KIMIRT_CUDA_CHECK(cudaMemcpy2DAsync(packed, width, shard_logits, static_cast<size_t>(ld_shard) * 4, width,
                                        static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, stream));
    send = packed;
  }
  comm_.all_gather(send, gathered, static_cast<size_t>(rows * shard_.size), DType::kF32, stream);
  // [rank][rows][shard] -> [rows][rank·shard + i].
  for (int r = 0; r < ranks; ++r) {
    KIMIRT_CUDA_CHECK(cudaMemcpy2DAsync(full + static_cast<int64_t>(r) * shard_.size, static_cast<size_t>(ld_full) * 4,
                                        gathered + static_cast<int64_t>(r) * rows * shard_.size, width, width,
                                        static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, stream));
  }
}

}  // namespace kimirt::cuda
