// Absorbed MLA decode attention, split over the context (flash-decoding): the plan, the launches, the merge
// of the chunks, and the first kernel for many heads per block on Hopper tensor cores (kWgmma64, kept for
// comparison). The kernel for few heads per block (the memory-bound case) is in mla_decode_mma16.cuh, the
// faster one for many heads (kSeesaw, the plan's choice there) in mla_decode_seesaw.cuh.
//
// The wgmma kernel, why this shape: at batch 1 every query head scores the same cached rows, so with many
// heads the kernel is at the compute/bandwidth ridge (≈ 2·(576 + 512)·heads flop per 1152-byte row). Each
// block therefore takes up to 64 heads (the wgmma M) against one 48-row tile of the cache at a time, and
// every tile is read from HBM once for those heads (two head groups of one context chunk run side by side
// and share it through L2).
//
// Block = (head group, context chunk, sequence), two warpgroups. Per tile (double-buffered: one thread
// issues the next tile's bulk tensor copies (TMA, 16-row boxes of one 64-dim atom each, written with the
// 128-byte swizzle) while the block computes on the current one; an mbarrier per buffer says when it has
// landed):
//   S:   warpgroup w computes the partial scores over its half of the 576 dims (18 k16 steps of
//        m64n48k16, Q and the tile from shared memory); the halves are exchanged through shared memory, so
//        both warpgroups hold the full S and run the same (bit-identical) online softmax;
//   P·V: warpgroup w accumulates O[:, 256w .. 256w + 255] += P · V (m64n256k16, P straight from registers
//        in the A-fragment layout, V = the tile's first 512 values read MN-major from the same buffer).
// O (64 x 256 fp32 per warpgroup) stays in registers for the whole chunk; a merge kernel combines chunks.
// What limits it (H200, 2026-11-29): the per-tile chain (S, exchange, softmax, P·V, two block barriers),
// about 3.4 µs per 48-row tile, not memory: a 4-stage ring of 32-row tiles (three tiles in flight instead
// of one) was measured no faster. kSeesaw splits the two warpgroups over alternate tiles (each with the
// whole S, no exchange), so that one's softmax hides the other's wgmmas: 1.2-2.0x faster at 96 heads.
#include <cuda.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <string>

#include "kimirt/cuda/async_pipeline.cuh"
#include "kimirt/cuda/check.h"
#include "kimirt/cuda/device_utils.cuh"
#include "kimirt/cuda/kernel_attr.h"
#include "kimirt/cuda/mla_decode.h"
#include "kimirt/cuda/mla_decode_common.cuh"
#include "kimirt/cuda/mla_decode_mma16.cuh"
#include "kimirt/cuda/mla_decode_seesaw.cuh"
#include "kimirt/cuda/tensor_map.h"
#include "kimirt/cuda/wgmma.cuh"

namespace kimirt::cuda {
namespace {

using detail::bf16;
using mla_kernels::MlaKernelParams;

constexpr int kM = 64;                               // head rows per block (wgmma M; unused rows are zeros)
constexpr int kT = 48;                               // cache rows per tile (wgmma N of the score product)
constexpr int kThreads = 256;                        // two warpgroups
constexpr int kAtoms = kMlaRow / 64;                 // 9 swizzle atoms of 64 dims per row
constexpr int kQAtomBytes = kM * 128;                // 8192
constexpr int kTileAtomBytes = kT * 128;             // 6144
constexpr int kQBytes = kAtoms * kQAtomBytes;        // 73728
constexpr int kTileBytes = kAtoms * kTileAtomBytes;  // 55296
constexpr int kHalfSteps = kMlaRow / 16 / 2;         // 18 k16 steps per warpgroup
constexpr int kSFrag = kT / 2;                       // 24 score accumulators per thread
constexpr int kOFrag = 128;                          // 64 x 256 fp32 per warpgroup
constexpr int kXBytes = 2 * kSFrag * 128 * 4;        // partial-score exchange, one area per warpgroup
constexpr int kBox = 16;                             // rows per bulk copy (pages are multiples of 32 rows)
constexpr int kBarBytes = 2 * 8;                     // one mbarrier per tile buffer
constexpr int kSmemBytes = 1024 + kQBytes + 2 * kTileBytes + kXBytes + kBarBytes;
constexpr float kLog2e = 1.4426950408889634f;

static_assert(kMlaRow % 64 == 0 && kT % kBox == 0 && kT <= 256 && kMlaChunkAlign % kBox == 0, "tile shapes");
static_assert(kSmemBytes <= 227 * 1024, "shared memory of one block");

// The 18 k16 steps of one warpgroup's half of the score product: atoms 4·wg .. 4·wg + 3 (16 steps) and
// k16 steps 2·wg, 2·wg + 1 of atom 8. Both warpgroups run the same instructions from run-time base
// descriptors (a branch per warpgroup made the compiler serialize every wgmma behind an injected
// warpgroup.arrive); start-address fields advance by (bytes >> 4) (addresses stay below 2^18, so the
// 14-bit field never carries).
__device__ __forceinline__ void score_steps(float (&s)[kSFrag], uint64_t dq, uint64_t dk, int wg) {
  const uint64_t dq_main = dq + static_cast<uint64_t>((4 * wg * kQAtomBytes) >> 4);
  const uint64_t dk_main = dk + static_cast<uint64_t>((4 * wg * kTileAtomBytes) >> 4);
  const uint64_t dq_tail = dq + static_cast<uint64_t>((8 * kQAtomBytes + 64 * wg) >> 4);
  const uint64_t dk_tail = dk + static_cast<uint64_t>((8 * kTileAtomBytes + 64 * wg) >> 4);
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const uint64_t a_off = static_cast<uint64_t>(((i >> 2) * kQAtomBytes + (i & 3) * 32) >> 4);
    const uint64_t b_off = static_cast<uint64_t>(((i >> 2) * kTileAtomBytes + (i & 3) * 32) >> 4);
    detail::wgmma_m64n48k16_ss(s, dq_main + a_off, dk_main + b_off, i > 0 ? 1 : 0);
  }
#pragma unroll
  for (int i = 0; i < kHalfSteps - 16; ++i) {
    detail::wgmma_m64n48k16_ss(s, dq_tail + static_cast<uint64_t>(i * 32 / 16),
                               dk_tail + static_cast<uint64_t>(i * 32 / 16), 1);
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    mla_decode_kernel(const __grid_constant__ CUtensorMap cache_map, const __grid_constant__ CUtensorMap q_map,
                      const __grid_constant__ CUtensorMap q_pe_map, MlaKernelParams prm) {
  const MlaDecodeArgs& a = prm.a;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = detail::smem_aligned_1024(smem_raw);
  uint8_t* qs = smem;
  uint8_t* ks = qs + kQBytes;                                           // two stages
  float* xs = reinterpret_cast<float*>(ks + 2 * kTileBytes);            // [2][kSFrag][128]
  uint64_t* bars = reinterpret_cast<uint64_t*>(xs + 2 * kSFrag * 128);  // [2]

  const int group = blockIdx.x, split = blockIdx.y, b = blockIdx.z;
  const int h0 = group * prm.heads_per_group;
  const int nh = min(prm.heads_per_group, a.heads - h0);
  const int k_start = split * prm.chunk;
  const int k_end = mla_kernels::chunk_end(prm, b, split);
  const int tid = threadIdx.x;
  const int wg = tid >> 7, t = tid & 127, warp = t >> 5, lane = t & 31;
  if (mla_kernels::finish_if_empty(prm, b, split, h0, nh, k_start, k_end, tid, kThreads)) return;

  const int32_t* table = a.block_table + static_cast<int64_t>(b) * a.ld_block_table;
  const int n_tiles = (k_end - k_start + kT - 1) / kT;
  const uint32_t bar0 = detail::smem_addr(bars);
  // Thread 0 issues the copies of a tile: per 16-row box that starts before k_end, 9 atoms of 64 dims.
  // Boxes never straddle a page (chunks and tiles start at multiples of 16, pages are multiples of 32), and
  // boxes wholly past k_end are not read at all (their rows are zeroed instead: the block table may end).
  // The cache rows of a tile's 16-row boxes, looked up by thread 0 one tile before it issues the tile, so
  // that block-table reads never stall the warp that also runs tensor-core work.
  constexpr int kBoxes = kT / kBox;
  auto lookup = [&](int tile, int(&rows)[kBoxes]) {
    mla_kernels::box_rows(table, a.page_size, k_start + tile * kT, kBox, k_end, rows);
  };
  auto issue_tile = [&](int tile, int slot, const int(&rows)[kBoxes], uint32_t extra_bytes) {
    const int start = k_start + tile * kT;
    const int boxes = min(kBoxes, (k_end - start + kBox - 1) / kBox);
    const uint32_t bar = bar0 + 8 * slot;
    detail::mbar_expect_tx(bar, static_cast<uint32_t>(boxes * kAtoms * kBox * 128) + extra_bytes);
    const uint32_t dst0 = detail::smem_addr(ks + slot * kTileBytes);
#pragma unroll
    for (int bx = 0; bx < kBoxes; ++bx) {
      if (bx < boxes) {
#pragma unroll
        for (int at = 0; at < kAtoms; ++at) {
          detail::tma_load_2d(dst0 + at * kTileAtomBytes + bx * kBox * 128, &cache_map, at * 64, rows[bx], bar);
        }
      }
    }
  };

  // Prologue (thread 0): the barriers; Q (64 rows from h0; rows past the last head are zero-filled by the
  // copy engine, rows of the next head group only give discarded scores) and tile 0 on the first barrier.
  // Under MlaDecodeArgs::overlap_previous the previous kernel may still be writing q: tile 0 is copied
  // before the wait, q after it (griddepcontrol.wait is a no-op otherwise).
  int rows_next[kBoxes];
  if (tid == 0) {
    detail::mbar_init(bar0, 1);
    detail::mbar_init(bar0 + 8, 1);
    detail::mbar_init_fence();
    lookup(0, rows_next);
    issue_tile(0, 0, rows_next, kQBytes);
    if (n_tiles > 1) lookup(1, rows_next);
  }
  detail::pdl_wait();  // every thread: none of them writes out before the previous kernel has ended
  if (tid == 0) {
    const uint32_t q_dst = detail::smem_addr(qs);
#pragma unroll
    for (int at = 0; at < kAtoms - 1; ++at) {
      detail::tma_load_3d(q_dst + at * kQAtomBytes, &q_map, at * 64, h0, b, bar0);
    }
    detail::tma_load_3d(q_dst + (kAtoms - 1) * kQAtomBytes, &q_pe_map, 0, h0, b, bar0);
  }
  __syncthreads();  // the barriers are initialized

  float o[kOFrag];
#pragma unroll
  for (int i = 0; i < kOFrag; ++i) o[i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.0f, 0.0f};
  const uint32_t q_base = detail::smem_addr(qs);
  const uint32_t k_base0 = detail::smem_addr(ks);
  const uint64_t dq = detail::wgmma_desc_sw128(q_base, 16, 1024);
  const uint64_t dk0 = detail::wgmma_desc_sw128(k_base0, 16, 1024);
  const uint64_t dk1 = detail::wgmma_desc_sw128(k_base0 + kTileBytes, 16, 1024);
  const uint64_t dv0 = detail::wgmma_desc_sw128(k_base0 + 4 * wg * kTileAtomBytes, kTileAtomBytes, 1024);
  const uint64_t dv1 = detail::wgmma_desc_sw128(k_base0 + kTileBytes + 4 * wg * kTileAtomBytes, kTileAtomBytes, 1024);

  for (int tile = 0; tile < n_tiles; ++tile) {
    const int slot = tile & 1;
    // The other buffer was released by the barrier that ended the previous tile.
    if (tid == 0 && tile + 1 < n_tiles) {
      issue_tile(tile + 1, slot ^ 1, rows_next, 0);
      if (tile + 2 < n_tiles) lookup(tile + 2, rows_next);
    }
    detail::mbar_wait(bar0 + 8 * slot, (tile >> 1) & 1);
    const int valid = min(kT, k_end - (k_start + tile * kT));
    if (valid < kT) {
      // The rows past the chunk's end hold whatever the cache pages held (or nothing was copied): zeros,
      // so that P = 0 meets finite values in P·V.
      detail::zero_sw128_rows(ks + slot * kTileBytes, kAtoms, kT, valid, tid, kThreads);
      __syncthreads();
    }

    // S (partial over this warpgroup's 288 dims). The descriptors differ from the tile's base descriptors
    // only in the start address field, by compile-time offsets: one add each instead of a rebuild.
    float s[kSFrag];
    detail::wgmma_fence();
    const uint64_t dk = slot ? dk1 : dk0;
    score_steps(s, dq, dk, wg);
    detail::wgmma_commit();
    detail::wgmma_wait<0>();
    detail::fence_regs(s);

    // Exchange the halves: element i of thread t has the same (row, key) in both warpgroups.
#pragma unroll
    for (int i = 0; i < kSFrag; ++i) xs[(wg * kSFrag + i) * 128 + t] = s[i];
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kSFrag; ++i) s[i] += xs[((wg ^ 1) * kSFrag + i) * 128 + t];

    // Online softmax (log2 domain) on rows r0 = 16·warp + lane/4 and r0 + 8.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < kSFrag; ++i) s[i] *= prm.scale_log2;
    if (valid < kT) {  // only the chunk's last tile has keys past its end
#pragma unroll
      for (int i = 0; i < kSFrag; ++i) {
        if (8 * (i >> 2) + 2 * (lane & 3) + (i & 1) >= valid) s[i] = -INFINITY;
      }
    }
#pragma unroll
    for (int i = 0; i < kSFrag; ++i) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m_run[r], mx[r]);
      alpha[r] = exp2f(m_run[r] - m_new);  // m_run = -inf on the first tile: alpha = 0
      m_run[r] = m_new;
    }
    float rowsum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < kSFrag; ++i) {
      const int r = (i >> 1) & 1;
      s[i] = exp2f(s[i] - m_run[r]);
      rowsum[r] += s[i];
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * alpha[r] + rowsum[r];
    // Once the running maxima settle, alpha is exactly 1 for the whole warp: skip the 128 multiplies.
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
      for (int i = 0; i < kOFrag; ++i) o[i] *= alpha[(i >> 1) & 1];
    }

    // O += P · V over the tile's kT rows (k16 steps), V slice [kT x 256] of this warpgroup.
    // All A fragments are packed before the fence, so no register write sits between the three wgmmas.
    uint32_t pa[kT / 16][4];
#pragma unroll
    for (int j = 0; j < kT / 16; ++j) {
#pragma unroll
      for (int r = 0; r < 4; ++r) pa[j][r] = detail::pack_bf16x2(s[8 * j + 2 * r], s[8 * j + 2 * r + 1]);
    }
    const uint64_t dv = slot ? dv1 : dv0;
    detail::wgmma_fence();
#pragma unroll
    for (int j = 0; j < kT / 16; ++j) {
      detail::wgmma_m64n256k16_rs_tb(o, pa[j][0], pa[j][1], pa[j][2], pa[j][3],
                                     dv + static_cast<uint64_t>(j * 2048 / 16));
    }
    detail::wgmma_commit();
    detail::wgmma_wait<0>();
    detail::fence_regs(o);

    __syncthreads();  // this buffer and the exchange area are free again
  }

  // Epilogue: the 4 threads of a row quad hold disjoint keys of l.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
  // Stage the normalized rows [64][512] bf16 in the (now idle) tile buffers, then write them coalesced.
  bf16* stage = reinterpret_cast<bf16*>(ks);
  mla_kernels::stage_wgmma_rows(o, l_run, m_run, stage, prm, b, split, h0, nh, wg, warp, lane);
  __syncthreads();
  mla_kernels::write_staged_rows(stage, prm, b, split, h0, nh, tid, kThreads);
}

// Merge of the chunks: out = Σ_s 2^(lse_s − M) · o_s / Σ_s 2^(lse_s − M). Block = (head, 64 of the 512
// columns, sequence); its 256 threads are 32 groups of 8 (8 columns each, 16-byte loads) that take every
// 32nd chunk, 4 chunks per step, so up to 128 chunks' loads (partial rows and their lse together) are in
// flight at once: the merge costs about one L2 round trip, not one per chunk group. Each group keeps its
// own running maximum; the 32 group sums meet in shared memory. Empty chunks carry lse = -inf and zeros.
// Launched as a programmatic dependent of the attention kernel: its blocks may become resident early and
// wait (griddepcontrol.wait) for the attention grid's writes.
constexpr int kMergeCols = 64;
constexpr int kMergeLanes = kMergeCols / 8;      // threads per chunk row
constexpr int kMergeGroups = 256 / kMergeLanes;  // 32
constexpr int kMergeUnroll = 4;
static_assert(kMergeGroups == 32 && kMlaLatent % kMergeCols == 0, "merge layout");
__global__ void __launch_bounds__(256)
    mla_decode_merge_kernel(const bf16* __restrict__ o_part, const float* __restrict__ lse, int splits, int heads,
                            bf16* __restrict__ out, int64_t ld_out) {
  __shared__ float acc_s[kMergeGroups][kMergeCols + 1];
  __shared__ float max_s[kMergeGroups], den_s[kMergeGroups], w_s[kMergeGroups];
  __shared__ float inv_s;
  const int head = blockIdx.x, part = blockIdx.y, b = blockIdx.z;
  const int grp = threadIdx.x / kMergeLanes, cl = (threadIdx.x % kMergeLanes) * 8, col = part * kMergeCols + cl;
  const int64_t base = static_cast<int64_t>(b) * splits * heads + head;
  // The next decode call (overlap_previous) may get resident and start copying; it waits for this grid's
  // end before it writes the parts again.
  detail::pdl_launch_dependents();
  detail::pdl_wait();
  float m = -INFINITY, den = 0.0f;
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int s0 = grp; s0 < splits; s0 += kMergeGroups * kMergeUnroll) {
    float lv[kMergeUnroll];
    uint4 x[kMergeUnroll];
#pragma unroll
    for (int u = 0; u < kMergeUnroll; ++u) {
      const int s = s0 + u * kMergeGroups;
      const int64_t slot = base + static_cast<int64_t>(s < splits ? s : s0) * heads;
      // L2 loads (ld.cg): the parts were written by the previous grid.
      lv[u] = s < splits ? __ldcg(lse + slot) : -INFINITY;
      x[u] = s < splits ? __ldcg(reinterpret_cast<const uint4*>(o_part + slot * kMlaLatent + col))
                        : make_uint4(0, 0, 0, 0);
    }
    float m_new = m;
#pragma unroll
    for (int u = 0; u < kMergeUnroll; ++u) m_new = fmaxf(m_new, lv[u]);
    if (m_new == -INFINITY) continue;                   // only empty chunks so far
    const float rescale = mla_kernels::ex2(m - m_new);  // 0 while m is still -inf (acc and den are 0 then)
    den *= rescale;
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] *= rescale;
#pragma unroll
    for (int u = 0; u < kMergeUnroll; ++u) {
      const float w = mla_kernels::ex2(lv[u] - m_new);
      float f[8];
      detail::unpack8(x[u], f);
      den += w;
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] += w * f[j];
    }
    m = m_new;
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) acc_s[grp][cl + j] = acc[j];
  if (threadIdx.x % kMergeLanes == 0) {
    max_s[grp] = m;
    den_s[grp] = den;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    const float mg = max_s[threadIdx.x];
    const float mx = detail::warp_max(mg);
    const float w = mg == -INFINITY ? 0.0f : mla_kernels::ex2(mg - mx);  // all empty: every weight is 0
    w_s[threadIdx.x] = w;
    const float d = detail::warp_sum(den_s[threadIdx.x] * w);
    if (threadIdx.x == 0) inv_s = d > 0.0f ? 1.0f / d : 0.0f;
  }
  __syncthreads();
  if (threadIdx.x < kMergeCols) {
    const int c = threadIdx.x;
    float v = 0.0f;
#pragma unroll
    for (int g = 0; g < kMergeGroups; ++g) v += acc_s[g][c] * w_s[g];
    out[static_cast<int64_t>(b) * ld_out + static_cast<int64_t>(head) * kMlaLatent + part * kMergeCols + c] =
        __float2bfloat16_rn(v * inv_s);
  }
}

// A bf16 tensor map of rank R with 128-byte swizzle (dims innermost first, strides in bytes); `what` ends the
// error message.
template <int R>
CUtensorMap bf16_tensor_map(const bf16* base, const cuuint64_t (&dims)[R], const cuuint64_t (&strides)[R - 1],
                            const cuuint32_t (&box)[R], const std::string& what) {
  return make_tensor_map(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, R, base, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B,
                         cat("mla_decode: ", what));
}

CUtensorMap cache_tensor_map(const bf16* cache, int64_t rows) {
  return bf16_tensor_map<2>(cache, {static_cast<cuuint64_t>(kMlaRow), static_cast<cuuint64_t>(rows)},
                            {static_cast<cuuint64_t>(kMlaRow) * 2}, {64, kBox}, cat("a cache of ", rows, " rows"));
}

// The cache as 32-row tiles for kMma16 and kSeesaw: dims (64 dims of an atom, rows, 9 atoms; the atom stride, 128
// bytes, is smaller than the row stride) so that one box of 64 x 32 x 9 lands atom-major ([atom][row][64]),
// the layout of the 16-row boxes of cache_tensor_map side by side.
CUtensorMap cache_tile_tensor_map(const bf16* cache, int64_t rows) {
  return bf16_tensor_map<3>(cache, {64, static_cast<cuuint64_t>(rows), kMlaRow / 64},
                            {static_cast<cuuint64_t>(kMlaRow) * 2, 128}, {64, mla_kernels::kTileRows, kMlaRow / 64},
                            cat("the tile map of a cache of ", rows, " rows"));
}

// q [batch, heads, 576] (batch stride ld_q) as a 3-D tensor for one 64-head x 64-dim box per atom; heads
// past the last are zero-filled by the copy engine. The rope atom comes from its own map (q_pe_tensor_map).
CUtensorMap q_tensor_map(const bf16* q, int heads, int batch, int64_t ld_q) {
  return bf16_tensor_map<3>(
      q, {static_cast<cuuint64_t>(kMlaLatent), static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)},
      {static_cast<cuuint64_t>(kMlaRow) * 2, static_cast<cuuint64_t>(ld_q) * 2}, {64, kM, 1},
      cat("q of ", batch, " x ", heads, " heads, ld_q ", ld_q));
}

// The rope part of q, [batch, heads, 64] (head stride ld_head, batch stride ld_batch): one box per block.
CUtensorMap q_pe_tensor_map(const bf16* q_pe, int heads, int batch, int64_t ld_head, int64_t ld_batch) {
  return bf16_tensor_map<3>(
      q_pe, {static_cast<cuuint64_t>(kMlaRope), static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)},
      {static_cast<cuuint64_t>(ld_head) * 2, static_cast<cuuint64_t>(ld_batch) * 2}, {64, kM, 1},
      cat("q_pe of ", batch, " x ", heads, " heads, strides ", ld_head, " / ", ld_batch));
}

// Encoding a tensor map is a driver call; a decode step repeats the same few (the cache, the q buffer), so
// the last ones are kept (a small table searched linearly, guarded for concurrent streams).
struct MapKey {
  int kind;
  uintptr_t ptr;
  int64_t d0, d1, d2, d3 = 0;
  bool operator==(const MapKey&) const = default;
};

template <typename Make>
CUtensorMap cached_map(const MapKey& key, Make make) {
  struct Entry {
    MapKey key;
    CUtensorMap map;
  };
  static std::mutex mutex;
  static Entry entries[8];
  static int used = 0, next = 0;
  std::lock_guard<std::mutex> lock(mutex);
  for (int i = 0; i < used; ++i) {
    if (entries[i].key == key) return entries[i].map;
  }
  const CUtensorMap map = make();
  entries[next] = Entry{key, map};
  next = (next + 1) % 8;
  used = used < 8 ? used + 1 : 8;
  return map;
}

uint64_t part_bytes(int batch, int splits, int heads) {
  return (static_cast<uint64_t>(batch) * splits * heads * kMlaLatent * 2 + 255) / 256 * 256;
}

}  // namespace

const char* mla_decode_kernel_name(MlaDecodeKernel kernel) {
  switch (kernel) {
    case MlaDecodeKernel::kAuto:
      return "auto";
    case MlaDecodeKernel::kMma16:
      return "mma16";
    case MlaDecodeKernel::kWgmma64:
      return "wgmma64";
    case MlaDecodeKernel::kSeesaw:
      return "seesaw";
  }
  return "?";
}

MlaDecodePlan plan_mla_decode(int batch, int heads, int max_seq_len, int sm_count, MlaDecodeKernel kernel) {
  KIMIRT_CUDA_REQUIRE(batch >= 0 && heads > 0 && max_seq_len >= 0, "plan_mla_decode: batch ", batch, ", heads ", heads,
                      ", max_seq_len ", max_seq_len);
  KIMIRT_CUDA_REQUIRE(kernel == MlaDecodeKernel::kAuto || kernel == MlaDecodeKernel::kMma16 ||
                          kernel == MlaDecodeKernel::kWgmma64 || kernel == MlaDecodeKernel::kSeesaw,
                      "plan_mla_decode: unknown kernel ", static_cast<int>(kernel));
  MlaDecodePlan p;
  if (kernel == MlaDecodeKernel::kAuto) {
    const int64_t groups = (int64_t{heads} + kMlaMma16Heads - 1) / kMlaMma16Heads;
    // groups x batch x length <= kMlaAutoMma16Rows, by division (no product to overflow); mla_decode takes at
    // most 65535 head groups.
    const bool small = groups <= 65535 && groups <= kMlaAutoMma16Rows / std::max(batch, 1) / std::max(max_seq_len, 1);
    kernel = heads <= kMlaAutoMma16MaxHeads || small ? MlaDecodeKernel::kMma16 : MlaDecodeKernel::kSeesaw;
  }
  const bool mma16 = kernel == MlaDecodeKernel::kMma16;
  p.kernel = kernel;
  const int per_block = mma16 ? kMlaMma16Heads : kMlaWgmmaHeads;
  p.head_groups = (heads + per_block - 1) / per_block;
  p.heads_per_group = (heads + p.head_groups - 1) / p.head_groups;
  // One wave of blocks (both kernels run one block per SM): as many chunks per sequence as fit, rounded
  // down so that a few extra blocks do not make a second wave. A chunk of at least two tiles per consumer
  // amortizes the block's start (Q, the first copies) and keeps the merge short.
  const int64_t blocks_per_split = std::max<int64_t>(1, static_cast<int64_t>(batch) * p.head_groups);
  const int64_t sms = std::max(sm_count, 1);
  int64_t splits = blocks_per_split >= sms ? 1 : sms / blocks_per_split;
  const int min_chunk = mma16 ? 2 * 32 : kernel == MlaDecodeKernel::kSeesaw ? mla_kernels::seesaw::kMinChunk : 2 * kT;
  splits = std::clamp<int64_t>(splits, 1, std::max<int64_t>(1, max_seq_len / min_chunk));
  // kMma16 and kSeesaw chunks are whole 32-row tiles, so only a sequence's last chunk has a partial tile (and
  // kSeesaw's one-copy tiles never straddle a page).
  const int align = kernel == MlaDecodeKernel::kWgmma64 ? kMlaChunkAlign : 32;
  int64_t chunk = (std::max(max_seq_len, 1) + splits - 1) / splits;
  chunk = (chunk + align - 1) / align * align;
  splits = std::max<int64_t>(1, (max_seq_len + chunk - 1) / chunk);
  // Keys are numbered in int32 in the kernels, up to the last chunk's end: a length within a few thousand of
  // 2^31 rounds past it (mla_decode would refuse the plan, after a decode step had queued its first work).
  KIMIRT_CUDA_REQUIRE(splits * chunk <= (int64_t{1} << 31) - 1, "plan_mla_decode: max_seq_len ", max_seq_len,
                      " is too long: its ", splits, " chunks of ", chunk, " keys pass 2^31 - 1");
  p.splits = static_cast<int>(splits);
  p.chunk = static_cast<int>(chunk);
  if (p.splits > 1) {
    p.workspace_bytes = part_bytes(batch, p.splits, heads) + static_cast<uint64_t>(batch) * p.splits * heads * 4;
  }
  return p;
}

void mla_decode(cudaStream_t stream, const MlaDecodeArgs& a, const MlaDecodePlan& plan, void* workspace) {
  KIMIRT_CUDA_REQUIRE(a.batch >= 0 && a.batch <= 65535 && a.heads > 0, "mla_decode: batch ", a.batch, ", heads ",
                      a.heads);
  if (a.batch == 0) return;
  KIMIRT_CUDA_REQUIRE(a.page_size > 0 && a.page_size % 32 == 0, "mla_decode: page_size ", a.page_size,
                      " must be a positive multiple of 32");
  KIMIRT_CUDA_REQUIRE(a.q && a.cache && a.block_table && a.seq_lens && a.out, "mla_decode: null pointer");
  KIMIRT_CUDA_REQUIRE(a.ld_q >= int64_t{a.heads} * kMlaRow && a.ld_q % 8 == 0, "mla_decode: ld_q ", a.ld_q,
                      " must be >= heads*576 and a multiple of 8");
  KIMIRT_CUDA_REQUIRE(a.ld_out >= int64_t{a.heads} * kMlaLatent && a.ld_out % 8 == 0, "mla_decode: ld_out ", a.ld_out,
                      " must be >= heads*512 and a multiple of 8");
  KIMIRT_CUDA_REQUIRE(a.ld_block_table > 0, "mla_decode: ld_block_table ", a.ld_block_table);
  KIMIRT_CUDA_REQUIRE(std::isfinite(a.scale) && a.scale >= 0.0f, "mla_decode: scale ", a.scale,
                      " must be finite and >= 0 (0: 192^-1/2)");
  // Rows are numbered in int32 (page id · page_size + offset) and so are the tensor copies' coordinates.
  KIMIRT_CUDA_REQUIRE(a.num_pages >= 0 && a.num_pages * int64_t{a.page_size} <= (int64_t{1} << 31),
                      "mla_decode: num_pages ", a.num_pages, " out of range");
  KIMIRT_CUDA_REQUIRE(detail::aligned16(a.q) && detail::aligned16(a.cache) && detail::aligned16(a.out),
                      "mla_decode: q, cache and out must be 16-byte aligned");
  if (a.q_pe) {
    KIMIRT_CUDA_REQUIRE(detail::aligned16(a.q_pe) && a.ld_q_pe_head >= kMlaRope && a.ld_q_pe_head % 8 == 0 &&
                            a.ld_q_pe % 8 == 0 && a.ld_q_pe >= int64_t{a.heads - 1} * a.ld_q_pe_head + kMlaRope,
                        "mla_decode: q_pe must be 16-byte aligned with strides (head ", a.ld_q_pe_head, ", batch ",
                        a.ld_q_pe, ") multiples of 8 that keep its ", a.heads, " heads of 64 apart");
  }
  const bool mma16 = plan.kernel == MlaDecodeKernel::kMma16;
  KIMIRT_CUDA_REQUIRE(mma16 || plan.kernel == MlaDecodeKernel::kWgmma64 || plan.kernel == MlaDecodeKernel::kSeesaw,
                      "mla_decode: plan kernel ", mla_decode_kernel_name(plan.kernel),
                      " is not a planned kernel; use plan_mla_decode");
  const int per_block = mma16 ? kMlaMma16Heads : kMlaWgmmaHeads;
  KIMIRT_CUDA_REQUIRE(plan.splits >= 1 && plan.splits <= 65535 && plan.chunk > 0 && plan.chunk % kMlaChunkAlign == 0 &&
                          plan.head_groups >= 1 && plan.head_groups <= 65535 &&
                          int64_t{plan.head_groups} * plan.heads_per_group >= a.heads &&
                          int64_t{plan.head_groups - 1} * plan.heads_per_group < a.heads &&
                          plan.heads_per_group <= per_block && plan.heads_per_group > 0 &&
                          int64_t{plan.splits} * plan.chunk <= (int64_t{1} << 31) - 1,
                      "mla_decode: plan (", mla_decode_kernel_name(plan.kernel), ", splits ", plan.splits, ", chunk ",
                      plan.chunk, ", head groups ", plan.head_groups, " x ", plan.heads_per_group, ") does not fit ",
                      a.heads, " heads; use plan_mla_decode");
  // kMma16 and kSeesaw copy whole 32-row tiles, which must not straddle a page.
  KIMIRT_CUDA_REQUIRE(plan.kernel == MlaDecodeKernel::kWgmma64 || plan.chunk % mla_kernels::kTileRows == 0,
                      "mla_decode: a ", mla_decode_kernel_name(plan.kernel), " plan's chunk (", plan.chunk,
                      ") must be a multiple of ", mla_kernels::kTileRows, "; use plan_mla_decode");
  // Without a separate q_pe the rope part is q's own values 512..575: the kernels always read it as q_pe.
  MlaDecodeArgs args = a;
  if (!args.q_pe) args.q_pe = a.q + kMlaLatent, args.ld_q_pe_head = kMlaRow, args.ld_q_pe = a.ld_q;
  MlaKernelParams p{args,
                    plan.splits,
                    plan.chunk,
                    plan.heads_per_group,
                    (a.scale > 0.0f ? a.scale : 1.0f / sqrtf(192.0f)) * kLog2e,
                    nullptr,
                    nullptr};
  if (plan.splits > 1) {
    const uint64_t need =
        part_bytes(a.batch, plan.splits, a.heads) + static_cast<uint64_t>(a.batch) * plan.splits * a.heads * 4;
    KIMIRT_CUDA_REQUIRE(workspace && plan.workspace_bytes >= need && detail::aligned16(workspace),
                        "mla_decode: the split plan needs ", need, " bytes of 16-byte aligned workspace (plan has ",
                        plan.workspace_bytes, ", batch ", a.batch, " may exceed the planned batch)");
    p.o_part = static_cast<bf16*>(workspace);
    p.lse = reinterpret_cast<float*>(static_cast<uint8_t*>(workspace) + part_bytes(a.batch, plan.splits, a.heads));
  }
  // Without a page count the map's bound is only a ceiling on addresses (the block table says which rows
  // exist); 2^29 rows of 1152 bytes keep the byte extent inside what a tensor map can describe.
  const int64_t rows = a.num_pages > 0 ? a.num_pages * a.page_size : (int64_t{1} << 29);
  // The 16-row box map of kWgmma64 and the 32-row tile map of kMma16 and kSeesaw.
  auto box_map = [&] {
    return cached_map({0, reinterpret_cast<uintptr_t>(a.cache), rows, 0, 0},
                      [&] { return cache_tensor_map(a.cache, rows); });
  };
  auto tile_map = [&] {
    return cached_map({2, reinterpret_cast<uintptr_t>(a.cache), rows, 0, 0},
                      [&] { return cache_tile_tensor_map(a.cache, rows); });
  };
  const dim3 grid(static_cast<unsigned>(plan.head_groups), static_cast<unsigned>(plan.splits),
                  static_cast<unsigned>(a.batch));
  // One block per (head group, chunk, sequence), started early under overlap_previous.
  auto launch = [&](auto kernel, int threads, int smem, const auto&... args) {
    ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
    LaunchConfig l(grid, threads, smem, stream);
    KIMIRT_CUDA_CHECK(cudaLaunchKernelEx(l.overlap_previous(a.overlap_previous).get(), kernel, args...));
  };
  if (mma16) {
    namespace k = mla_kernels::mma16;
    launch(k::mla_decode_mma16_kernel, k::kThreads, k::kSmemBytes, tile_map(), p);
  } else {
    const CUtensorMap q_map = cached_map({1, reinterpret_cast<uintptr_t>(a.q), a.heads, a.batch, a.ld_q},
                                         [&] { return q_tensor_map(a.q, a.heads, a.batch, a.ld_q); });
    const CUtensorMap q_pe_map =
        cached_map({3, reinterpret_cast<uintptr_t>(args.q_pe), a.heads, a.batch, args.ld_q_pe, args.ld_q_pe_head},
                   [&] { return q_pe_tensor_map(args.q_pe, a.heads, a.batch, args.ld_q_pe_head, args.ld_q_pe); });
    if (plan.kernel == MlaDecodeKernel::kSeesaw) {
      namespace k = mla_kernels::seesaw;
      launch(k::mla_decode_seesaw_kernel, k::kThreads, k::kSmemBytes, tile_map(), q_map, q_pe_map, p);
    } else {
      launch(mla_decode_kernel, kThreads, kSmemBytes, box_map(), q_map, q_pe_map, p);
    }
  }
  if (plan.splits > 1) {
    // Always a programmatic dependent of the attention grid (which triggers at its start).
    LaunchConfig l(dim3(static_cast<unsigned>(a.heads), kMlaLatent / kMergeCols, static_cast<unsigned>(a.batch)), 256,
                   0, stream);
    KIMIRT_CUDA_CHECK(cudaLaunchKernelEx(l.overlap_previous().get(), mla_decode_merge_kernel,
                                         static_cast<const bf16*>(p.o_part), static_cast<const float*>(p.lse),
                                         plan.splits, a.heads, a.out, a.ld_out));
  }
}

}  // namespace kimirt::cuda
