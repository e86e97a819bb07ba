// The MLA decode kernel for many heads per block (plan kernel kSeesaw): up to 64 query heads (the wgmma M)
// against one context chunk, the two warpgroups taking alternate cache tiles for the scores ("seesaw",
// after FlashMLA's schedule). Included by mla_decode.cu only; what it shares with the other decode
// kernels is in mla_decode_common.cuh.
//
// Why: at 96 heads per GPU the decode attention is compute-bound, and the kWgmma64 kernel (both warpgroups
// on each tile, half the 576 dims each, the halves exchanged) runs one chain per tile in which the tensor
// cores idle while both warpgroups wait at the exchange and then run the same softmax. Here tile i's scores
// S = Q·Kᵢᵀ (64 x 32, all 576 dims, 36 wgmma k-steps) belong to warpgroup i % 2, the owner, which runs the
// online softmax and publishes P (bf16 A fragments), the new row maxima and the rescale factor through
// shared memory. Both warpgroups then accumulate their half of O (64 x 256 fp32 in registers, columns
// 256·wg ..) += P · Vᵢ, the owner from its registers, the other from the published fragments. The other
// warpgroup issues the scores of its next own tile before it waits for the publication, so its score
// wgmmas run while the owner's softmax runs on the CUDA cores:
//   wg 0:  S0 | softmax0 pub | PV0 | S2 .. (wait pub1) PV1 | softmax2 pub | PV2 | S4 ..
//   wg 1:  S1 ..(wait pub0) PV0 | softmax1 pub | PV1 | S3 .. (wait pub2) PV2 | ...
// The softmaxes form one chain across the warpgroups (tile i's maximum starts from tile i-1's), which is
// what makes the two halves of O consistent: every tile's P is relative to the same running maximum in
// both. Each warpgroup keeps the row sums of its own tiles, rescaled by every tile's factor; the two meet
// at the end.
//
// Shared memory: Q (64 rows x 576, 72 KB) for the whole chunk, a ring of four 32-row cache tiles (36 KB
// each), and two row slots for the published maxima and factors (tile parity); P goes into its tile's rope
// atom. Tiles arrive by bulk tensor copies (one 3-D box per tile, 128-byte swizzle) issued by thread 0 of a
// producer warpgroup once both consumer warpgroups have released the stage ("empty" mbarrier: all 256
// consumer threads arrive once their P · V has completed). The row slots need no release barrier: the owner
// of tile i + 2 cannot publish before it has consumed tile i + 1's publication, which the other warpgroup
// makes only after it has read tile i's.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "kimirt/cuda/async_pipeline.cuh"
#include "kimirt/cuda/device_utils.cuh"
#include "kimirt/cuda/mla_decode.h"
#include "kimirt/cuda/mla_decode_common.cuh"
#include "kimirt/cuda/wgmma.cuh"

namespace kimirt::cuda::mla_kernels::seesaw {

constexpr int kM = 64;                               // head rows per block (unused rows: zeros or discarded)
constexpr int kT = kTileRows;                        // cache rows per tile (the N of the score wgmmas)
constexpr int kStages = 4;                           // tiles in shared memory
constexpr int kMinChunk = 4 * kT;                    // at least two tiles per warpgroup (plan_mla_decode)
constexpr int kConsumers = 256;                      // two warpgroups
constexpr int kThreads = kConsumers + 128;           // and the producer warpgroup (one thread copies)
constexpr int kAtoms = kMlaRow / 64;                 // 9 swizzle atoms of 64 dims per row
constexpr int kQAtomBytes = kM * 128;                // 8192
constexpr int kQBytes = kAtoms * kQAtomBytes;        // 73728
constexpr int kTileAtomBytes = kT * 128;             // 4096
constexpr int kTileBytes = kAtoms * kTileAtomBytes;  // 36864
constexpr int kSFrag = kT / 2;                       // 16 score accumulators per thread
constexpr int kPRegs = kT / 16 * 4;                  // 8 packed bf16 pairs: P as A fragments of kT/16 k-steps
constexpr int kOFrag = 128;                          // 64 x 256 fp32 per warpgroup
// A publication's row slot: per head row the new maximum and the rescale factor (two slots, tile parity).
constexpr int kRowSlotBytes = kM * 8;
constexpr int kBarBytes = 2 * kStages * 8;  // full and empty per stage
constexpr int kSmemBytes = 1024 + kQBytes + kStages * kTileBytes + 2 * kRowSlotBytes + kBarBytes;
constexpr int kPubBarrier = 1;       // named barriers 1, 2: publication of tiles with parity 0, 1
constexpr int kWgBarrier = 3;        // named barriers 3, 4: inside warpgroup 0, 1
constexpr int kConsumerBarrier = 5;  // the two consumer warpgroups (the producer group has left)
static_assert(kMlaRow % 64 == 0 && kT == 32, "tile shapes: one tile per 32-row page slice (plan: chunks of 32)");
// P (bf16, [kT/16 k-steps][4][128 threads]) is published in the tile's own rope atom (dims 512-575), which
// only the owner's scores read: it has those scores when it publishes, and the stage is refilled only after
// both groups' P · V. So publications never wait for a slot.
static_assert(kPRegs * 128 * 4 == kTileAtomBytes, "P of a tile fills its rope atom");
static_assert(kSmemBytes <= 227 * 1024, "shared memory of one block");
// An even stage count: stage s then always holds tiles of one owner, the only group that waits on its full
// barrier (after the prologue's wait for Q and tile 0).
static_assert(kStages % 2 == 0, "stages per owner");
// Why not 64-row tiles (m64n64k16 scores, whose operand reads match their math): the other group issues the
// scores of tile i + 1 while tiles i - 1 (its P · V still running) and i are in use, so the ring needs three
// tiles besides Q, and three 72 KB tiles and Q's 72 KB do not fit in 227 KB (with two, the schedule waits on
// itself).

// S = Q · Kᵀ over all 576 dims (36 k16 steps): atom i / 4, 32 bytes further per step inside an atom.
__device__ __forceinline__ void issue_scores(float (&s)[kSFrag], uint64_t dq, uint64_t dk) {
  // Opaque to the compiler: otherwise it computes the 36 Q descriptors (loop-invariant) once, before the
  // tile loop, and keeps them live in 72 registers.
  asm volatile("" : "+l"(dq), "+l"(dk));
#pragma unroll
  for (int i = 0; i < kMlaRow / 16; ++i) {
    const uint64_t a_off = static_cast<uint64_t>(((i >> 2) * kQAtomBytes + (i & 3) * 32) >> 4);
    const uint64_t b_off = static_cast<uint64_t>(((i >> 2) * kTileAtomBytes + (i & 3) * 32) >> 4);
    detail::wgmma_m64n32k16_ss(s, dq + a_off, dk + b_off, i > 0 ? 1 : 0);
  }
}

// O[:, 256·wg ..] += P · V for the tile whose V slice descriptor is dv (k16 steps of 16 rows = 2048 bytes).
__device__ __forceinline__ void issue_pv(float (&o)[kOFrag], const uint32_t (&pa)[kPRegs], uint64_t dv) {
#pragma unroll
  for (int j = 0; j < kT / 16; ++j) {
    detail::wgmma_m64n256k16_rs_tb(o, pa[4 * j], pa[4 * j + 1], pa[4 * j + 2], pa[4 * j + 3],
                                   dv + static_cast<uint64_t>(j * 2048 / 16));
  }
}

__device__ __forceinline__ void rescale(float (&o)[kOFrag], const float (&f)[2]) {
  // Once the running maxima settle the factor is exactly 1 for the whole warp: skip the 128 multiplies.
  if (__any_sync(0xffffffffu, f[0] != 1.0f || f[1] != 1.0f)) {
#pragma unroll
    for (int i = 0; i < kOFrag; ++i) o[i] *= f[(i >> 1) & 1];
  }
}

// The two consumer warpgroups' part of the kernel: each runs run<W>() with its own index W.
struct Consumer {
  const MlaKernelParams& prm;
  uint8_t* ks;        // the ring of tiles
  float2* row_slots;  // [2][kM]
  uint32_t full0, empty0;
  int k_start, k_end, n_tiles, wg, t, lane;
  int r0;                 // this thread's accumulator rows are r0 and r0 + 8
  uint64_t dq, dk0, dv0;  // descriptors: Q, stage 0's K, this group's V slice of stage 0
  float o[kOFrag];        // this group's half of O, columns 256·wg ..
  float m_run[2];         // the running maxima of rows r0, r0 + 8 (the same in both groups)
  float l_own[2];         // this group's share of the row sums (its tiles' keys)

  __device__ __forceinline__ void issue_scores_of(float (&acc)[kSFrag], int tile) {
    const int st = tile % kStages;
    detail::mbar_wait(full0 + 8 * st, (tile / kStages) & 1);
    issue_scores(acc, dq, dk0 + static_cast<uint64_t>(st * (kTileBytes >> 4)));
  }

  // One step per tile, for its owner (kOwn) or for the other group. A group keeps the scores of its own
  // tiles in s: issued in the step before the one in which it owns the tile, they complete with that step's
  // P · V. Each group runs its own instance of the loop (run<W> below), so the roles are known at compile
  // time and one score array suffices (with a role known only at run time, ptxas keeps both groups' arrays
  // live).
  template <bool kOwn>
  __device__ __forceinline__ void step(int tile, float (&s)[kSFrag]) {
    const int stage = tile % kStages;
    uint8_t* tile_smem = ks + stage * kTileBytes;
    uint32_t* p_slot = reinterpret_cast<uint32_t*>(tile_smem + (kAtoms - 1) * kTileAtomBytes);  // the rope atom
    float2* rows = row_slots + (tile & 1) * kM;
    // The other group issues the scores of its next own tile: they run while the owner's softmax does, as
    // does the owner's P · V of the last tile (still in flight: its wait comes only before this tile's).
    // The owner commits no group here: an empty one costs a placeholder wgmma per tile.
    if constexpr (!kOwn) {
      detail::wgmma_fence();
      if (tile >= 1 && tile + 1 < n_tiles) issue_scores_of(s, tile + 1);
      detail::wgmma_commit();
    }
    float rowsum[2] = {0.0f, 0.0f};  // of this tile's P, in its owner
    if constexpr (kOwn) {
      const int valid = min(kT, k_end - (k_start + tile * kT));
      if (valid < kT) {
        // The rows past the chunk's end hold whatever the pages held (or nothing was copied): zeros, so that
        // P = 0 meets finite values in both groups' P · V.
        detail::zero_sw128_rows(tile_smem, kAtoms, kT, valid, t, 128);
        detail::named_barrier_sync(kWgBarrier + wg, 128);
      }
      // Online softmax (log2 domain) on rows r0 and r0 + 8, straight from the score accumulators (written by
      // wgmma only); each pair of weights is packed and published as it is computed. Accumulator i holds key
      // 8·(i / 4) + 2·(lane % 4) + i % 2 of row r0 + 8·((i / 2) % 2).
      auto live = [&](int i) { return valid == kT || 8 * (i >> 2) + 2 * (lane & 3) + (i & 1) < valid; };
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int i = 0; i < kSFrag; ++i) {
        mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], live(i) ? s[i] * prm.scale_log2 : -INFINITY);
      }
      float factor[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        factor[r] = ex2(m_run[r] - fmaxf(m_run[r], mx[r]));  // m_run = -inf on the first tile: 0
        mx[r] = fmaxf(m_run[r], mx[r]);
      }
      // Publication: element j of thread t has the same (row, key) in both groups.
#pragma unroll
      for (int j = 0; j < kPRegs; ++j) {
        float pv[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int i = 2 * j + e;
          pv[e] = live(i) ? ex2(s[i] * prm.scale_log2 - mx[(i >> 1) & 1]) : 0.0f;
          rowsum[(i >> 1) & 1] += pv[e];
        }
        p_slot[j * 128 + t] = detail::pack_bf16x2(pv[0], pv[1]);
      }
      if ((lane & 3) == 0) {
        rows[r0] = make_float2(mx[0], factor[0]);
        rows[r0 + 8] = make_float2(mx[1], factor[1]);
      }
      __syncwarp();  // the other lanes of this warp read these rows below; bar.arrive does not order that
      detail::named_barrier_arrive(kPubBarrier + (tile & 1), kConsumers);
    } else {
      detail::named_barrier_sync(kPubBarrier + (tile & 1), kConsumers);
    }
    // Both groups read the publication (the owner its own writes): the registers the P · V wgmmas consume
    // are then defined outside the role branch (defined inside it, they made ptxas serialize the wgmmas).
    const float2 f0 = rows[r0], f1 = rows[r0 + 8];
    const float factor[2] = {f0.y, f1.y};
    m_run[0] = f0.x, m_run[1] = f1.x;
#pragma unroll
    for (int r = 0; r < 2; ++r) l_own[r] = l_own[r] * factor[r] + rowsum[r];
    // The last tile's P · V (and the other group's new scores) complete; the last tile's stage is free. Its
    // rope atom held P, written through the generic proxy: fenced before the copy engine may refill it.
    detail::wgmma_wait<0>();
    detail::fence_regs(o);
    if constexpr (!kOwn) detail::fence_regs(s);
    if (tile > 0) {
      if constexpr (!kOwn) detail::fence_proxy_async();  // this group owned tile - 1
      detail::mbar_arrive(empty0 + 8 * ((tile - 1) % kStages));
    }
    // Fragments are loaded only now: ptxas serializes wgmmas whose input registers are defined while an
    // earlier wgmma is in flight.
    uint32_t pa[kPRegs];
#pragma unroll
    for (int j = 0; j < kPRegs; ++j) pa[j] = p_slot[j * 128 + t];
    rescale(o, factor);
    detail::wgmma_fence();
    issue_pv(o, pa, dv0 + static_cast<uint64_t>(stage * (kTileBytes >> 4)));
    detail::wgmma_commit();
  }

  // Group W owns the tiles of parity W; it first issues the scores of its first own tile (side by side with
  // the other group's).
  template <int W>
  __device__ __forceinline__ void run() {
#pragma unroll
    for (int i = 0; i < kOFrag; ++i) o[i] = 0.0f;
    m_run[0] = m_run[1] = -INFINITY;
    l_own[0] = l_own[1] = 0.0f;
    float s[kSFrag];
    detail::wgmma_fence();
    if (W == 0 || n_tiles > 1) issue_scores_of(s, W);
    detail::wgmma_commit();
    detail::wgmma_wait<0>();
    detail::fence_regs(s);
    for (int tile = 0; tile < n_tiles; tile += 2) {
      step<W == 0>(tile, s);
      if (tile + 1 < n_tiles) step<W == 1>(tile + 1, s);
    }
    detail::wgmma_wait<0>();
    detail::fence_regs(o);
  }

  // The epilogue. The 4 threads of a row quad hold disjoint keys of l; then the two groups' shares meet in
  // ls, 2 KB of Q's buffer (every score wgmma has completed once both groups are past the barrier).
  __device__ __forceinline__ void finish(float* ls, int b, int split, int h0, int nh, int warp, int tid) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l_own[r] += __shfl_xor_sync(0xffffffffu, l_own[r], 1);
      l_own[r] += __shfl_xor_sync(0xffffffffu, l_own[r], 2);
    }
    detail::named_barrier_sync(kConsumerBarrier, kConsumers);  // every publication has been read
    ls[(wg * 2 + 0) * 128 + t] = l_own[0], ls[(wg * 2 + 1) * 128 + t] = l_own[1];
    detail::named_barrier_sync(kConsumerBarrier, kConsumers);
    float l_run[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) l_run[r] = l_own[r] + ls[((wg ^ 1) * 2 + r) * 128 + t];
    // Stage the normalized rows [64][512] bf16 in the (now idle) tile buffers, then write them coalesced.
    bf16* stage = reinterpret_cast<bf16*>(ks);
    mla_kernels::stage_wgmma_rows(o, l_run, m_run, stage, prm, b, split, h0, nh, wg, warp, lane);
    detail::named_barrier_sync(kConsumerBarrier, kConsumers);
    mla_kernels::write_staged_rows(stage, prm, b, split, h0, nh, tid, kConsumers);
  }
};

__global__ void __launch_bounds__(kThreads, 1)
    mla_decode_seesaw_kernel(const __grid_constant__ CUtensorMap cache_map, const __grid_constant__ CUtensorMap q_map,
                             const __grid_constant__ CUtensorMap q_pe_map, MlaKernelParams prm) {
  const MlaDecodeArgs& a = prm.a;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_aligned_1024(smem_raw);
  uint8_t* qs = smem;
  uint8_t* ks = qs + kQBytes;                                                // kStages tiles
  float2* row_slots = reinterpret_cast<float2*>(ks + kStages * kTileBytes);  // [2][kM]
  uint64_t* bars = reinterpret_cast<uint64_t*>(row_slots + 2 * kM);          // full[kStages], empty[kStages]

  const int group = blockIdx.x, split = blockIdx.y, b = blockIdx.z;
  const int h0 = group * prm.heads_per_group;
  const int nh = min(prm.heads_per_group, a.heads - h0);
  const int k_start = split * prm.chunk;
  const int k_end = chunk_end(prm, b, split);
  const int tid = threadIdx.x;
  // The warpgroup index through a shuffle from lane 0: the compiler then knows it is warp-uniform, so the
  // role branches below are not divergent paths to it (around which it would serialize every wgmma).
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);  // 2: the producer group
  const int t = tid & 127, warp = t >> 5, lane = t & 31;
  if (finish_if_empty(prm, b, split, h0, nh, k_start, k_end, tid, kThreads)) return;

  const int n_tiles = (k_end - k_start + kT - 1) / kT;
  const uint32_t full0 = detail::smem_addr(bars), empty0 = full0 + 8 * kStages;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      detail::mbar_init(full0 + 8 * s, 1);
      detail::mbar_init(empty0 + 8 * s, kConsumers);
    }
    detail::mbar_init_fence();
  }
  __syncthreads();  // the barriers are initialized

  if (wg == 2) {
    // Registers go where the accumulators are: a block of 384 threads gets 168 per thread at launch; the
    // producer group gives most of its share to the two consumer groups (setmaxnreg).
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    // Producer, thread 0 of the group: each tile in one tensor copy (the 3-D tile map: kT rows x 9 atoms of
    // 64 dims, landing atom-major), into its stage once both groups have released the stage's previous
    // tile; Q's bytes counted on tile 0's barrier. Tiles never straddle a page (chunks start at multiples of
    // kT, as pages do); the rows of a last tile past k_end are still in its page, copied and zeroed by the
    // owner. (Copying each 32-row tile as eighteen 16-row x 64-dim boxes limited the ring: with the
    // consumers doing nothing but release stages, this one thread's copies delivered 5 TB/s from L2 into the
    // SMs at 131k, about what the attention needs.) The block table is read a tile ahead.
    // Q is copied right after tile 0: the consumers start on Q and tile 0 while the ring fills (copied after
    // the whole ring, a block's first scores waited for all of it: at 128 blocks that is 18 MB from HBM
    // before any wgmma). Under MlaDecodeArgs::overlap_previous the previous kernel may still be writing q:
    // Q waits for it (griddepcontrol.wait) and comes after tiles 0 and 1, the first own tiles of the two
    // groups, which overlap that kernel's end. (Measured at B=1, 32k: Q after tile 0 / tile 1 / the ring:
    // 29.9 / 30.6 / 31.3 us alone, - / 29.9 / 30.6-30.8 us overlapped.)
    if (t == 0) {
      const int32_t* table = a.block_table + static_cast<int64_t>(b) * a.ld_block_table;
      const int q_after = a.overlap_previous ? min(n_tiles, 2) - 1 : 0;
      int row[1];
      box_rows(table, a.page_size, k_start, kT, k_end, row);
      for (int tile = 0; tile < n_tiles; ++tile) {
        const int stage = tile % kStages;
        const int start = k_start + tile * kT;
        int row_next[1];  // read while this tile waits for its stage
        box_rows(table, a.page_size, start + kT, kT, k_end, row_next);
        if (tile >= kStages) detail::mbar_wait(empty0 + 8 * stage, ((tile / kStages) - 1) & 1);
        const uint32_t bar = full0 + 8 * stage;
        detail::mbar_expect_tx(bar, static_cast<uint32_t>(kTileBytes) + (tile == 0 ? kQBytes : 0));
        detail::tma_load_3d(detail::smem_addr(ks + stage * kTileBytes), &cache_map, 0, row[0], 0, bar);
        row[0] = row_next[0];
        if (tile == q_after) {
          detail::pdl_wait();
          const uint32_t q_dst = detail::smem_addr(qs);
#pragma unroll
          for (int at = 0; at < kAtoms - 1; ++at) {
            detail::tma_load_3d(q_dst + at * kQAtomBytes, &q_map, at * 64, h0, b, full0);
          }
          detail::tma_load_3d(q_dst + (kAtoms - 1) * kQAtomBytes, &q_pe_map, 0, h0, b, full0);
        }
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
  detail::pdl_wait();           // no consumer writes out before the previous kernel has ended
  detail::mbar_wait(full0, 0);  // Q (and tile 0) for both warpgroups

  const uint32_t k_base = detail::smem_addr(ks);
  Consumer c{prm,
             ks,
             row_slots,
             full0,
             empty0,
             k_start,
             k_end,
             n_tiles,
             wg,
             t,
             lane,
             16 * warp + (lane >> 2),
             detail::wgmma_desc_sw128(detail::smem_addr(qs), 16, 1024),
             detail::wgmma_desc_sw128(k_base, 16, 1024),
             detail::wgmma_desc_sw128(k_base + 4 * wg * kTileAtomBytes, kTileAtomBytes, 1024)};
  if (wg == 0) {
    c.run<0>();
  } else {
    c.run<1>();
  }
  c.finish(reinterpret_cast<float*>(qs), b, split, h0, nh, warp, tid);
}

}  // namespace kimirt::cuda::mla_kernels::seesaw
