// What the three MLA decode kernels (kMma16 in mla_decode_mma16.cuh, kWgmma64 in mla_decode.cu, kSeesaw in
// mla_decode_seesaw.cuh) share: their parameters (MlaKernelParams), the block's start (smem_aligned_1024 from
// device_utils.cuh, chunk_end, finish_if_empty with write_empty_chunk), the block-table lookup of the wgmma
// kernels (box_rows) and their epilogue (stage_wgmma_rows, write_staged_rows); a partial tile's rows are zeroed
// by wgmma.cuh's zero_sw128_rows. Included by those files only.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "kimirt/cuda/async_pipeline.cuh"
#include "kimirt/cuda/device_utils.cuh"
#include "kimirt/cuda/mla_decode.h"
#include "kimirt/cuda/wgmma.cuh"  // fence_proxy_async

namespace kimirt::cuda::mla_kernels {

using detail::bf16;

// What every decode kernel receives.
struct MlaKernelParams {
  MlaDecodeArgs a;
  int splits, chunk, heads_per_group;
  float scale_log2;
  bf16* o_part;  // [batch][splits][heads][512], each chunk normalized by its own sum
  float* lse;    // [batch][splits][heads], log2 domain
};

using detail::ex2;  // the softmax weights' 2^x (device_utils.cuh)

// Rows per tile of kMma16 and kSeesaw: each tile arrives in one tensor copy (mla_decode.cu's tile map); a
// page (a multiple of 32 rows) holds whole tiles, and chunks start at multiples of it.
constexpr int kTileRows = 32;

// A chunk with no keys: zeros and lse = -inf (weight 0 in the merge, so it needs no branch), or zeros in
// the output when unsplit. Called by `threads` threads of the block.
__device__ __forceinline__ void write_empty_chunk(const MlaKernelParams& p, int b, int split, int h0, int nh, int tid,
                                                  int threads) {
  const int64_t slot0 = (static_cast<int64_t>(b) * p.splits + split) * p.a.heads + h0;
  for (int i = tid; i < nh * kMlaLatent / 8; i += threads) {
    const int h = i / (kMlaLatent / 8), c = i % (kMlaLatent / 8);
    bf16* dst = p.splits > 1
                    ? p.o_part + (slot0 + h) * kMlaLatent
                    : p.a.out + static_cast<int64_t>(b) * p.a.ld_out + static_cast<int64_t>(h0 + h) * kMlaLatent;
    detail::store16(dst + c * 8, make_uint4(0, 0, 0, 0));
  }
  if (p.splits > 1) {
    for (int h = tid; h < nh; h += threads) p.lse[slot0 + h] = -INFINITY;
  }
}

using detail::smem_aligned_1024;

// The end of a block's context chunk: the last chunk takes the rest of the sequence.
__device__ __forceinline__ int chunk_end(const MlaKernelParams& p, int b, int split) {
  const int seq_len = p.a.seq_lens[b];
  return split == p.splits - 1 ? seq_len : min(seq_len, split * p.chunk + p.chunk);
}

// The cache rows of the BOXES boxes of `box` keys that start at key `start` (0 for a box at or past k_end: it
// is not copied). The wgmma kernels look them up a tile ahead of the tile's copies, so that the block table's
// latency is not between a stage's release and its refill.
template <int BOXES>
__device__ __forceinline__ void box_rows(const int32_t* table, int page_size, int start, int box, int k_end,
                                         int (&rows)[BOXES]) {
#pragma unroll
  for (int bx = 0; bx < BOXES; ++bx) {
    const int key = start + bx * box;
    rows[bx] = key < k_end ? table[key / page_size] * page_size + key % page_size : 0;
  }
}

// What every decode block starts with: the merge kernel may become resident (it waits for this grid's end);
// a chunk with no keys is answered (after the previous kernel has ended: it may still read the outputs)
// and the block is done (true).
__device__ __forceinline__ bool finish_if_empty(const MlaKernelParams& p, int b, int split, int h0, int nh, int k_start,
                                                int k_end, int tid, int threads) {
  detail::pdl_launch_dependents();
  if (k_start < k_end) return false;
  detail::pdl_wait();
  write_empty_chunk(p, b, split, h0, nh, tid, threads);
  return true;
}

// The wgmma kernels' epilogue, part 1: a warpgroup's normalized half of O (64 x 256 fp32 accumulators,
// columns 256·wg ..; rows r0 = 16·warp + lane/4 and r0 + 8) as bf16 rows [64][512] in `stage` (shared
// memory), and the log-sum-exp of the chunk's rows (log2 domain) when split.
__device__ __forceinline__ void stage_wgmma_rows(const float (&o)[128], const float (&l_run)[2],
                                                 const float (&m_run)[2], bf16* stage, const MlaKernelParams& p, int b,
                                                 int split, int h0, int nh, int wg, int warp, int lane) {
  const int r0 = 16 * warp + (lane >> 2);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float inv_l = l_run[r] > 0.0f ? 1.0f / l_run[r] : 0.0f;
    const int row = r0 + 8 * r;
#pragma unroll
    for (int nb = 0; nb < 32; ++nb) {
      const int col = 256 * wg + 8 * nb + 2 * (lane & 3);
      *reinterpret_cast<uint32_t*>(stage + row * kMlaLatent + col) =
          detail::pack_bf16x2(o[4 * nb + 2 * r] * inv_l, o[4 * nb + 2 * r + 1] * inv_l);
    }
    if (p.splits > 1 && wg == 0 && (lane & 3) == 0 && row < nh) {
      const int64_t slot = (static_cast<int64_t>(b) * p.splits + split) * p.a.heads + h0 + row;
      p.lse[slot] = l_run[r] > 0.0f ? m_run[r] + log2f(l_run[r]) : -INFINITY;
    }
  }
}

// Part 2 (after a barrier): the staged rows of the nh real heads, coalesced, to out or to the chunk's
// partial rows. Called by `threads` threads.
__device__ __forceinline__ void write_staged_rows(const bf16* stage, const MlaKernelParams& p, int b, int split, int h0,
                                                  int nh, int tid, int threads) {
  for (int idx = tid; idx < nh * (kMlaLatent / 8); idx += threads) {
    const int row = idx / (kMlaLatent / 8), c = idx % (kMlaLatent / 8);
    const uint4 v = *reinterpret_cast<const uint4*>(stage + row * kMlaLatent + c * 8);
    bf16* dst;
    if (p.splits == 1) {
      dst = p.a.out + static_cast<int64_t>(b) * p.a.ld_out + static_cast<int64_t>(h0 + row) * kMlaLatent;
    } else {
      const int64_t slot = (static_cast<int64_t>(b) * p.splits + split) * p.a.heads + h0 + row;
      dst = p.o_part + slot * kMlaLatent;
    }
    *reinterpret_cast<uint4*>(dst + c * 8) = v;
  }
}

}  // namespace kimirt::cuda::mla_kernels
