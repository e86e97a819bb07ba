// The MLA decode kernel for many heads per block (plan kernel kSeesaw): up to 64 query heads (the wgmma M)
// against one context chunk, the two warpgroups taking alternate 32-row tiles for the scores ("seesaw",
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
// warpgroup issues the scores of its own next tile before it waits for the publication, so its score
// wgmmas run while the owner's softmax runs on the CUDA cores:
//   wg 0:  S0 | softmax0 pub | PV0 | S2 .. (wait pub1) PV1 | softmax2 pub | PV2 | S4 ..
//   wg 1:  S1 ..(wait pub0) PV0 | softmax1 pub | PV1 | S3 .. (wait pub2) PV2 | ...
// The softmaxes form one chain across the warpgroups (tile i's maximum starts from tile i-1's), which is
// what makes the two halves of O consistent: every tile's P is relative to the same running maximum in
// both. Each warpgroup keeps the row sums of its own tiles, rescaled by every tile's factor; the two meet
// at the end.
//
// Shared memory: Q (64 rows x 576, 72 KB) for the whole chunk, a ring of four 32-row cache tiles (36 KB
// each), and two publication slots (tile parity). Tiles arrive by bulk tensor copies (one 3-D box per
// tile, 128-byte swizzle) issued by thread 0 of a producer warpgroup once both consumer warpgroups have
// released the stage ("empty" mbarrier: all 256 consumer threads arrive once their P·V has completed). The
// publication slots need no release barrier: the owner of tile i + 2 cannot publish before it has consumed
// tile i + 1's publication, which the other warpgroup makes only after it has read tile i's.
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
constexpr int kT = 32;                               // cache rows per tile
constexpr int kStages = 4;                           // tiles in shared memory
constexpr int kConsumers = 256;                      // two warpgroups
constexpr int kThreads = kConsumers + 128;           // and the producer warpgroup (one thread copies)
constexpr int kAtoms = kMlaRow / 64;                 // 9 swizzle atoms of 64 dims per row
constexpr int kQAtomBytes = kM * 128;                // 8192
constexpr int kTileAtomBytes = kT * 128;             // 4096
constexpr int kQBytes = kAtoms * kQAtomBytes;        // 73728
constexpr int kTileBytes = kAtoms * kTileAtomBytes;  // 36864
constexpr int kSFrag = kT / 2;                       // 16 score accumulators per thread
constexpr int kPRegs = kT / 16 * 4;                  // 8 packed bf16 pairs: P as A fragments of kT/16 k-steps
constexpr int kOFrag = 128;                          // 64 x 256 fp32 per warpgroup
// A publication slot: P fragments [kPRegs][128 threads], then per head row the new maximum and the
// rescale factor [64][2].
constexpr int kPubWords = kPRegs * 128 + kM * 2;
constexpr int kPubBytes = 2 * kPubWords * 4;  // two slots
constexpr int kBarBytes = 2 * kStages * 8;    // full and empty per stage
constexpr int kSmemBytes = 1024 + kQBytes + kStages * kTileBytes + kPubBytes + kBarBytes;
constexpr int kPubBarrier = 1;       // named barriers 1, 2: publication of tiles with parity 0, 1
constexpr int kWgBarrier = 3;        // named barriers 3, 4: inside warpgroup 0, 1
constexpr int kConsumerBarrier = 5;  // the two consumer warpgroups (the producer group has left)
constexpr int kMinChunk = 4 * kT;    // at least two tiles per warpgroup (plan_mla_decode)

static_assert(kMlaRow % 64 == 0 && kT == 32, "tile shapes: one tile per 32-row page slice (plan: chunks of 32)");
static_assert(kSmemBytes <= 227 * 1024, "shared memory of one block");
// An even stage count: stage s then always holds tiles of one owner, the only group that waits on its full
// barrier (after the prologue's wait for Q and tile 0).
static_assert(kStages % 2 == 0, "stages per owner");

// 2^x on the special-function unit, flushing denormal results (the softmax weights need no more).
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// S = Q · Kᵀ over all 576 dims (36 k16 steps): atom i / 4, 32 bytes further per step inside an atom.
__device__ __forceinline__ void issue_scores(float (&s)[kSFrag], uint64_t dq, uint64_t dk) {
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

__global__ void __launch_bounds__(kThreads, 1)
    mla_decode_seesaw_kernel(const __grid_constant__ CUtensorMap cache_map, const __grid_constant__ CUtensorMap q_map,
                             MlaKernelParams prm) {
  const MlaDecodeArgs& a = prm.a;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_aligned_1024(smem_raw);
  uint8_t* qs = smem;
  uint8_t* ks = qs + kQBytes;                                              // kStages tiles
  uint32_t* pub = reinterpret_cast<uint32_t*>(ks + kStages * kTileBytes);  // [2][kPubWords]
  uint64_t* bars = reinterpret_cast<uint64_t*>(pub + 2 * kPubWords);       // full[kStages], empty[kStages]

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
    // Producer, thread 0 of the group: each tile in one tensor copy (the 3-D tile map: 32 rows x 9 atoms of
    // 64 dims, landing atom-major), into its stage once both groups have released the stage's previous
    // tile; Q's bytes counted on tile 0's barrier. Tiles never straddle a page (chunks start at multiples of
    // 32, as pages do); the rows of a last tile past k_end are still in its page, copied and zeroed by the
    // owner. (Copying each tile as eighteen 16-row x 64-dim boxes limited the ring: with the consumers
    // doing nothing but release stages, this one thread's copies delivered 5 TB/s from L2 into the SMs at
    // 131k, about what the attention needs.) The block table is read a tile ahead. Under
    // MlaDecodeArgs::overlap_previous the previous kernel may still be writing q: the first tiles are copied
    // before the wait, q after it (griddepcontrol.wait is a no-op otherwise).
    if (t == 0) {
      const int32_t* table = a.block_table + static_cast<int64_t>(b) * a.ld_block_table;
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
        if (tile == min(n_tiles, kStages) - 1) {
          detail::pdl_wait();
          const uint32_t q_dst = detail::smem_addr(qs);
#pragma unroll
          for (int at = 0; at < kAtoms; ++at) {
            detail::tma_load_3d(q_dst + at * kQAtomBytes, &q_map, at * 64, h0, b, full0);
          }
        }
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
  detail::pdl_wait();           // no consumer writes out before the previous kernel has ended
  detail::mbar_wait(full0, 0);  // Q (and tile 0) for both warpgroups

  float o[kOFrag];
#pragma unroll
  for (int i = 0; i < kOFrag; ++i) o[i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY};  // the running maxima of rows r0, r0 + 8 (same in both groups)
  float l_own[2] = {0.0f, 0.0f};            // this group's share of the row sums (its tiles' keys)
  const int r0 = 16 * warp + (lane >> 2);
  const uint32_t k_base = detail::smem_addr(ks);
  const uint64_t dq = detail::wgmma_desc_sw128(detail::smem_addr(qs), 16, 1024);
  const uint64_t dk0 = detail::wgmma_desc_sw128(k_base, 16, 1024);
  const uint64_t dv0 = detail::wgmma_desc_sw128(k_base + 4 * wg * kTileAtomBytes, kTileAtomBytes, 1024);
  auto issue_scores_of = [&](float(&acc)[kSFrag], int tile) {
    const int st = tile % kStages;
    detail::mbar_wait(full0 + 8 * st, (tile / kStages) & 1);
    issue_scores(acc, dq, dk0 + static_cast<uint64_t>(st * (kTileBytes >> 4)));
  };

  // Each group's scores of its first own tile, side by side; from then on a group's scores are issued in
  // the step before the one in which it owns the tile, and complete with that step's P · V. The scores of
  // even tiles live in s_even, of odd ones in s_odd (the loop below is unrolled by two, so that each step
  // names them statically): one array would be read by the owner while, as far as the compiler can tell,
  // a wgmma of the other role still writes it, and ptxas would serialize every wgmma.
  float s_even[kSFrag], s_odd[kSFrag];
  detail::wgmma_fence();
  if (wg == 0) issue_scores_of(s_even, 0);
  if (wg == 1 && n_tiles > 1) issue_scores_of(s_odd, 1);
  detail::wgmma_commit();
  detail::wgmma_wait<0>();
  detail::fence_regs(s_even);
  detail::fence_regs(s_odd);

  auto step = [&](int tile, float(&s)[kSFrag], float(&s_next)[kSFrag]) {
    const int stage = tile % kStages;
    uint32_t* slot = pub + (tile & 1) * kPubWords;
    const bool owner = (tile & 1) == wg;
    // The other group issues the scores of its next own tile: they run while the owner's softmax does, as
    // does the owner's P · V of the last tile (still in flight: its wait comes only before this tile's).
    detail::wgmma_fence();
    if (!owner && tile >= 1 && tile + 1 < n_tiles) issue_scores_of(s_next, tile + 1);
    detail::wgmma_commit();
    float rowsum[2] = {0.0f, 0.0f};  // of this tile's P, in its owner
    if (owner) {
      const int valid = min(kT, k_end - (k_start + tile * kT));
      if (valid < kT) {
        // The rows past the chunk's end hold whatever the pages held (or nothing was copied): zeros, so that
        // P = 0 meets finite values in both groups' P · V.
        zero_tile_rows(ks + stage * kTileBytes, valid, kT, kTileAtomBytes, t, 128);
        detail::named_barrier_sync(kWgBarrier + wg, 128);
      }
      // Online softmax (log2 domain) on rows r0 and r0 + 8. P lives in its own registers: the score
      // accumulators are written by wgmma only.
      float p[kSFrag];
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int i = 0; i < kSFrag; ++i) {
        p[i] = s[i] * prm.scale_log2;
        if (valid < kT && 8 * (i >> 2) + 2 * (lane & 3) + (i & 1) >= valid) p[i] = -INFINITY;
        mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], p[i]);
      }
      float factor[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        factor[r] = ex2(m_run[r] - fmaxf(m_run[r], mx[r]));  // m_run = -inf on the first tile: 0
        mx[r] = fmaxf(m_run[r], mx[r]);
      }
#pragma unroll
      for (int i = 0; i < kSFrag; ++i) {
        p[i] = ex2(p[i] - mx[(i >> 1) & 1]);
        rowsum[(i >> 1) & 1] += p[i];
      }
      // Publication: element j of thread t has the same (row, key) in both groups.
#pragma unroll
      for (int j = 0; j < kPRegs; ++j) slot[j * 128 + t] = detail::pack_bf16x2(p[2 * j], p[2 * j + 1]);
      if ((lane & 3) == 0) {
        float2* rows = reinterpret_cast<float2*>(slot + kPRegs * 128);
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
    const float2* rows = reinterpret_cast<const float2*>(slot + kPRegs * 128);
    const float2 f0 = rows[r0], f1 = rows[r0 + 8];
    const float factor[2] = {f0.y, f1.y};
    m_run[0] = f0.x, m_run[1] = f1.x;
#pragma unroll
    for (int r = 0; r < 2; ++r) l_own[r] = l_own[r] * factor[r] + rowsum[r];
    // The last tile's P · V (and the other group's new scores) complete; the last tile's stage is free.
    detail::wgmma_wait<0>();
    detail::fence_regs(o);
    detail::fence_regs(s_next);
    if (tile > 0) detail::mbar_arrive(empty0 + 8 * ((tile - 1) % kStages));
    // Fragments are loaded only now: ptxas serializes wgmmas whose input registers are defined while an
    // earlier wgmma is in flight.
    uint32_t pa[kPRegs];
#pragma unroll
    for (int j = 0; j < kPRegs; ++j) pa[j] = slot[j * 128 + t];
    rescale(o, factor);
    detail::wgmma_fence();
    issue_pv(o, pa, dv0 + static_cast<uint64_t>(stage * (kTileBytes >> 4)));
    detail::wgmma_commit();
  };
  for (int tile = 0; tile < n_tiles; tile += 2) {
    step(tile, s_even, s_odd);
    if (tile + 1 < n_tiles) step(tile + 1, s_odd, s_even);
  }
  detail::wgmma_wait<0>();
  detail::fence_regs(o);

  // Epilogue: the 4 threads of a row quad hold disjoint keys of l; then the two groups' shares meet.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_own[r] += __shfl_xor_sync(0xffffffffu, l_own[r], 1);
    l_own[r] += __shfl_xor_sync(0xffffffffu, l_own[r], 2);
  }
  detail::named_barrier_sync(kConsumerBarrier, kConsumers);  // every publication has been read
  float* ls = reinterpret_cast<float*>(pub);                 // [2 groups][2][128]
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

}  // namespace kimirt::cuda::mla_kernels::seesaw
