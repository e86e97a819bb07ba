// The memory-bound MLA decode kernel (plan kernel kMma16): up to 16 query heads per block against one
// context chunk of the paged latent cache, on mma.sync m16n8k16 tensor-core tiles. Included by
// mla_decode.cu only; what it shares with the other decode kernels is in mla_decode_common.cuh.
//
// Why this shape: with ≤ 16 heads a cached row (1152 bytes) carries ≤ 16·2·1088 flop, far below the
// bandwidth ridge, so the block's only job is to keep the copy engine streaming. Padding the heads to
// wgmma's M = 64 would quadruple the tensor work and put it back on the critical path; M = 16 is exactly
// one mma.sync row tile. The block is
//   warp 8       producer: looks up the block table (32 pages per lane-parallel load), issues each 32-row
//                tile as one tensor copy (the tile map: 32 rows x 9 atoms of 64 dims, 128-byte swizzle,
//                landing atom-major) into a 4-stage ring;
//                mbarriers: "full" per stage (transaction bytes), "empty" per stage (128 consumer arrivals);
//   warps 0-3    consumer group 0: even tiles;  warps 4-7  consumer group 1: odd tiles.
// So two to four tiles (74-147 KB) are in flight per SM while the groups compute, and two independent
// softmax chains hide each other's latency. The stage count is even on purpose: stage t % 4 then always
// belongs to the same group, which consumed the stage's previous tile itself, so a parity wait can never
// see the phase of an older tile that has not landed yet (with an odd count it could, when tiles land out
// of order). Inside a group, warp w computes the partial scores of all 32 keys over dims [144w, 144w + 144)
// (Q staged in shared memory once); the 4 partials meet in shared memory (one named barrier per tile, and one
// more in a chunk's partial last tile) and every warp sums them in the same order, so all four run the same
// online softmax bit for bit.
// Warp w then accumulates O[:, 128w .. 128w + 127] += P · V (P straight from the score registers, V by
// ldmatrix.trans). At the end each group hands the other its (m, l) and half of its O columns through shared
// memory and combines and normalizes the half it keeps (both halves at once: the epilogue follows the last
// tile, so its latency is the block's); the block writes the chunk's [heads x 512] rows (bf16) and lse.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "kimirt/cuda/async_pipeline.cuh"
#include "kimirt/cuda/device_utils.cuh"
#include "kimirt/cuda/mla_decode.h"
#include "kimirt/cuda/mla_decode_common.cuh"

namespace kimirt::cuda::mla_kernels {

namespace mma16 {

constexpr int kHeads = kMlaMma16Heads;  // the mma M
constexpr int kRows = kTileRows;        // cache rows per tile
constexpr int kStages = 4;              // even: see the top of the file
constexpr int kGroupWarps = 4;
constexpr int kGroups = 2;
constexpr int kGroupThreads = kGroupWarps * 32;
constexpr int kConsumers = kGroups * kGroupThreads;                       // 256
constexpr int kThreads = kConsumers + 32;                                 // + the producer warp
constexpr int kAtoms = kMlaRow / 64;                                      // 9
constexpr int kAtomBytes = kRows * 128;                                   // 4096
constexpr int kTileBytes = kAtoms * kAtomBytes;                           // 36864
constexpr int kSSteps = kMlaRow / kGroupWarps / 16;                       // 9 k16 steps of the scores per warp
constexpr int kKeyTiles = kRows / 8;                                      // 4 n8 tiles of keys
constexpr int kOTiles = kMlaLatent / kGroupWarps / 8;                     // 16 n8 tiles of O per warp
constexpr int kXchgFloat4s = kGroups * 2 * kGroupWarps * kKeyTiles * 32;  // double-buffered per group
constexpr int kQLd = kMlaRow * 2 + 16;                                    // bytes per Q row in shared memory (padded)
constexpr int kQOffset = kStages * kTileBytes + kXchgFloat4s * 16;
constexpr int kBarOffset = kQOffset + kHeads * kQLd;
constexpr int kSmemBytes = 1024 + kBarOffset + 2 * kStages * 8;
constexpr int kStageLd = kMlaLatent + 8;  // bf16 per staged output row (padded: no bank conflicts)
// The epilogue reuses the ring: group g hands its O half and (m, l) over in stage g, warp wq at byte
// kHandOffBytes · wq (inside the two atoms of V it reads itself), the bf16 output rows are staged in stage 2.
constexpr int kVAtomsPerWarp = kMlaLatent / kGroupWarps / 64;  // atoms of the V columns a warp accumulates: 2
constexpr int kHandOffBytes = kVAtomsPerWarp * kAtomBytes;     // one warp's slot
constexpr int kOutStage = 2;                                   // the stage that holds the staged output rows
static_assert(((kOTiles / 2) + 1) * 32 * 16 <= kHandOffBytes, "a warp's hand-off fits the atoms of its own V columns");
static_assert(kOutStage >= kGroups && kOutStage < kStages && kOutStage % kGroups == 0,
              "the output stage is none of the hand-off stages, and group 0's (free once group 0 is done)");

static_assert(kHeads == 16 && kMlaRow % (kGroupWarps * 16) == 0 && kMlaLatent % (kGroupWarps * 16) == 0,
              "warp split of the dims");
static_assert(kGroupWarps * kHandOffBytes <= kTileBytes && kHeads * kStageLd * 2 <= kTileBytes && kGroups == 2,
              "epilogue fits the ring");
static_assert(kSmemBytes <= 227 * 1024, "shared memory of one block");
static_assert(kStages % kGroups == 0, "a stage serves one consumer group");

// Producer warp: block-table lookups and bulk copies, one tile per ring stage, waiting for the stage's
// previous tile to be released. Lane i holds the page id of page base + i (and the next 32 in `nxt`), so
// a lookup is a shuffle. A tile never straddles a page (chunks start at multiples of 32 rows, pages are
// multiples of 32): the rows of a last tile past k_end are still in its page, copied and masked by the
// consumers (scores -inf, V zeros). `cur` and `nxt` arrive preloaded for the first 64 pages of the chunk.
__device__ __forceinline__ void produce(const CUtensorMap* map, const MlaDecodeArgs& a, int b, int k_start, int k_end,
                                        int n_tiles, uint32_t tiles, uint32_t full0, uint32_t empty0, int lane, int cur,
                                        int nxt) {
  const int32_t* table = a.block_table + static_cast<int64_t>(b) * a.ld_block_table;
  const int ps = a.page_size;
  const int page_end = static_cast<int>((int64_t{k_end} + ps - 1) / ps);  // k_end may be within a page of 2^31
  int base = k_start / ps;
  auto entry = [&](int page) { return page < page_end ? __ldg(table + page) : 0; };
  // Evict-first: the automatic plan gives kMma16 at most 16 heads, one head group, so each cache row is read once
  // per step (a plan forcing kMma16 for more heads reads a row once per head group).
  const uint64_t policy = detail::l2_evict_first_policy();
  for (int t = 0; t < n_tiles; ++t) {
    const int st = t % kStages;
    const int key = k_start + t * kRows;
    const int page = key / ps;
    while (page - base >= 32) {  // uniform over the warp: keys only grow
      base += 32;
      cur = nxt;
      nxt = entry(base + 32 + lane);
    }
    const int row = __shfl_sync(0xffffffffu, cur, page - base) * ps + key % ps;
    if (lane == 0) {
      if (t >= kStages) detail::mbar_wait(empty0 + 8 * st, ((t / kStages) - 1) & 1);
      const uint32_t bar = full0 + 8 * st;
      detail::mbar_expect_tx(bar, static_cast<uint32_t>(kTileBytes));
      detail::tma_load_3d_hint(tiles + st * kTileBytes, map, 0, row, 0, bar, policy);
    }
    __syncwarp();
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    mla_decode_mma16_kernel(const __grid_constant__ CUtensorMap cache_map, const MlaKernelParams prm) {
  const MlaDecodeArgs& a = prm.a;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_aligned_1024(smem_raw);
  const uint32_t tiles = detail::smem_addr(smem);
  float4* xchg = reinterpret_cast<float4*>(smem + kStages * kTileBytes);
  uint8_t* q_smem = smem + kQOffset;
  const uint32_t full0 = tiles + kBarOffset, empty0 = full0 + 8 * kStages;

  const int group = blockIdx.x, split = blockIdx.y, b = blockIdx.z;
  const int h0 = group * prm.heads_per_group;
  const int nh = min(prm.heads_per_group, a.heads - h0);
  const int k_start = split * prm.chunk;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  constexpr int kProducerWarp = kGroups * kGroupWarps;
  // The producer's first page ids do not depend on the sequence length: load them alongside it rather than
  // after it (two dependent global loads before the first copy would lengthen every call's ramp). Entries
  // past the sequence's pages are read (the table row has ld_block_table of them) but never used.
  int page_cur = 0, page_nxt = 0;
  if (warp == kProducerWarp) {
    const int32_t* table = a.block_table + static_cast<int64_t>(b) * a.ld_block_table;
    const int64_t p0 = k_start / a.page_size + lane;
    page_cur = p0 < a.ld_block_table ? __ldg(table + p0) : 0;
    page_nxt = p0 + 32 < a.ld_block_table ? __ldg(table + p0 + 32) : 0;
  }
  const int k_end = chunk_end(prm, b, split);
  if (finish_if_empty(prm, b, split, h0, nh, k_start, k_end, tid, kThreads)) return;
  const int n_tiles = (k_end - k_start + kRows - 1) / kRows;
  if (tid == 0) {
#pragma unroll
    for (int st = 0; st < kStages; ++st) {
      detail::mbar_init(full0 + 8 * st, 1);
      detail::mbar_init(empty0 + 8 * st, kGroupThreads);
    }
    detail::mbar_init_fence();
  }
  __syncthreads();  // the last block-wide barrier: the producer leaves early
  if (warp == kProducerWarp) {
    produce(&cache_map, a, b, k_start, k_end, n_tiles, tiles, full0, empty0, lane, page_cur, page_nxt);
    return;
  }

  const int grp = warp / kGroupWarps, wq = warp % kGroupWarps, g = lane >> 2, tq = lane & 3;
  // Under MlaDecodeArgs::overlap_previous the previous kernel may still be writing q (the producer, which
  // reads neither q nor the outputs, is already copying tiles); a no-op otherwise.
  detail::pdl_wait();
  // Q [16 heads x 576] into shared memory once (heads past the group's last are zeros: their scores are
  // discarded). The A fragments are re-read per tile with ldmatrix rather than kept in registers: 36 more
  // registers would spill, with 9 warps a block gets at most 168 per thread. Rows padded by 16 bytes so that
  // the 8 rows of one ldmatrix matrix hit different banks.
  {
    // ld.global.cg, not the read-only path: under overlap_previous q is written during this kernel's
    // lifetime (before the wait above), which the non-coherent path's contract excludes.
    const bf16* qb = a.q + static_cast<int64_t>(b) * a.ld_q + static_cast<int64_t>(h0) * kMlaRow;
    for (int i = tid; i < kHeads * (kMlaLatent / 8); i += kConsumers) {
      const int h = i / (kMlaLatent / 8), c = i % (kMlaLatent / 8);
      const uint4 v =
          h < nh ? __ldcg(reinterpret_cast<const uint4*>(qb + h * kMlaRow + c * 8)) : make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(q_smem + h * kQLd + c * 16) = v;
    }
    // The rope part from its own buffer (MlaDecodeArgs::q_pe; q's own values 512..575 when not given).
    const bf16* pb = a.q_pe + static_cast<int64_t>(b) * a.ld_q_pe + static_cast<int64_t>(h0) * a.ld_q_pe_head;
    for (int i = tid; i < kHeads * (kMlaRope / 8); i += kConsumers) {
      const int h = i / (kMlaRope / 8), c = i % (kMlaRope / 8);
      const uint4 v =
          h < nh ? __ldcg(reinterpret_cast<const uint4*>(pb + h * a.ld_q_pe_head + c * 8)) : make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(q_smem + h * kQLd + (kMlaLatent / 8 + c) * 16) = v;
    }
  }
  constexpr int kBothGroups = 3;  // named barrier of all consumer warps
  detail::named_barrier_sync(kBothGroups, kConsumers);
  // A fragment of k16 step kk (this warp's dims 144·wq + 16·kk): matrix j = lane / 8 is heads
  // (lane % 8) + 8·(j % 2) at dims + 8·(j / 2).
  const uint32_t q_addr =
      detail::smem_addr(q_smem) + static_cast<uint32_t>(((lane & 7) + 8 * ((lane >> 3) & 1)) * kQLd +
                                                        (wq * (kMlaRow / kGroupWarps) + 8 * (lane >> 4)) * 2);
  // Per-lane ldmatrix addresses inside a tile, computed per use (a table of them would cost 17 registers).
  // Scores: matrix j = lane / 8 is keys 8·(j / 2) + (lane % 8) at dim chunk 18·wq + 2·kk + j % 2 (b0, b1 of
  // key tiles 0 and 1; key tiles 2 and 3 are 16 rows = 2048 bytes further). P·V: matrix j is keys
  // (lane % 8) + 8·(j % 2) at dim chunk 16·wq + 2·np + j / 2 (b0, b1 of O tiles 2·np and 2·np + 1), the
  // second k16 step 2048 bytes further; 16·wq starts an atom, so only the swizzle term depends on the lane.
  const int lj = lane >> 3, lr = lane & 7;
  const int k_chunk0 = 18 * wq + (lj & 1);
  const uint32_t k_row = static_cast<uint32_t>((8 * (lj >> 1) + lr) * 128);
  const uint32_t v_base = static_cast<uint32_t>(kVAtomsPerWarp * wq * kAtomBytes + (lr + 8 * (lj & 1)) * 128);
  const int v_xor = (lj >> 1) ^ lr;
  auto k_addr = [&](uint32_t tile, int kk) {
    const int c = k_chunk0 + 2 * kk;
    return tile + static_cast<uint32_t>((c >> 3) * kAtomBytes + (((c & 7) ^ lr) << 4)) + k_row;
  };
  auto v_addr = [&](uint32_t tile, int np, int ks) {
    return tile + v_base +
           static_cast<uint32_t>((np >> 2) * kAtomBytes + ks * 16 * 128 + (((2 * (np & 3)) ^ v_xor) << 4));
  };

  float o[kOTiles][4];
#pragma unroll
  for (int n = 0; n < kOTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.0f, 0.0f};

  int it = 0;
  for (int t = grp; t < n_tiles; t += kGroups, ++it) {
    const int st = t % kStages;
    const uint32_t tile = tiles + st * kTileBytes;
    detail::mbar_wait(full0 + 8 * st, (t / kStages) & 1);

    // Partial scores over this warp's dims, 4 key tiles of 8.
    float s[kKeyTiles][4];
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kSSteps; ++kk) {
      uint32_t qf[4], k01[4], k23[4];
      detail::ldsm_x4(qf, q_addr + kk * 32);
      const uint32_t ka = k_addr(tile, kk);
      detail::ldsm_x4(k01, ka);
      detail::ldsm_x4(k23, ka + 16 * 128);
      detail::mma_bf16_16816(s[0], qf[0], qf[1], qf[2], qf[3], k01[0], k01[1]);
      detail::mma_bf16_16816(s[1], qf[0], qf[1], qf[2], qf[3], k01[2], k01[3]);
      detail::mma_bf16_16816(s[2], qf[0], qf[1], qf[2], qf[3], k23[0], k23[1]);
      detail::mma_bf16_16816(s[3], qf[0], qf[1], qf[2], qf[3], k23[2], k23[3]);
    }
    // The four warps' partials, summed in warp order by every warp (identical scores in all four). The
    // exchange area alternates between two buffers, so one barrier per tile suffices: a warp writes a
    // buffer again only after the next tile's barrier, which every warp reaches after its reads of it.
    float4* xg = xchg + (grp * 2 + (it & 1)) * (kGroupWarps * kKeyTiles * 32);
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n)
      xg[(wq * kKeyTiles + n) * 32 + lane] = make_float4(s[n][0], s[n][1], s[n][2], s[n][3]);
    detail::named_barrier_sync(1 + grp, kGroupThreads);
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) {
      float4 v = xg[n * 32 + lane];
#pragma unroll
      for (int w = 1; w < kGroupWarps; ++w) {
        const float4 u = xg[(w * kKeyTiles + n) * 32 + lane];
        v.x += u.x, v.y += u.y, v.z += u.z, v.w += u.w;
      }
      s[n][0] = v.x, s[n][1] = v.y, s[n][2] = v.z, s[n][3] = v.w;
    }

    // Online softmax (log2 domain) for heads g (elements 0, 1) and g + 8 (elements 2, 3); keys past the
    // chunk's end (only in its last tile) get -inf, whatever the tile buffer held there.
    const int valid = min(kRows, k_end - (k_start + t * kRows));
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = 8 * n + 2 * tq + (e & 1);
        s[n][e] = key < valid ? s[n][e] * prm.scale_log2 : -INFINITY;
        mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
      }
    }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m_run[r], mx[r]);  // finite: key 0 of every tile is valid
      alpha[r] = ex2(m_run[r] - m_new);            // 0 on the group's first tile
      m_run[r] = m_new;
    }
    float rowsum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] = ex2(s[n][e] - m_run[e >> 1]);
        rowsum[e >> 1] += s[n][e];
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * alpha[r] + rowsum[r];
    // Once the running maxima settle alpha is exactly 1 for the whole warp: skip the 64 multiplies.
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
      for (int n = 0; n < kOTiles; ++n) {
        o[n][0] *= alpha[0];
        o[n][1] *= alpha[0];
        o[n][2] *= alpha[1];
        o[n][3] *= alpha[1];
      }
    }

    // A chunk's partial last tile: its rows past the end hold whatever the page held there, and P is 0 for
    // them, but 0 · NaN is not 0, so they are zeroed first. In shared memory, once per tile, rather than in
    // the V fragments: when that masking was a branch inside the loop below, it kept the compiler from issuing
    // each ldmatrix ahead of the mma that needs it (P · V then took 0.46-0.78 of a tile's ~1.9 µs: PERF.md,
    // machines AD and AE). The group's reads of the keys are done (each warp's scores were in its stores
    // before the barrier above); the stage is this group's alone.
    if (valid < kRows) {
      detail::zero_sw128_rows(smem + st * kTileBytes, kAtoms, kRows, valid, wq * 32 + lane, kGroupThreads);
      detail::named_barrier_sync(1 + grp, kGroupThreads);
    }
    // O[:, 128·wq ..] += P · V over the tile's 32 keys (2 k16 steps).
#pragma unroll
    for (int ks = 0; ks < kRows / 16; ++ks) {
      const uint32_t p0 = detail::pack_bf16x2(s[2 * ks][0], s[2 * ks][1]);
      const uint32_t p1 = detail::pack_bf16x2(s[2 * ks][2], s[2 * ks][3]);
      const uint32_t p2 = detail::pack_bf16x2(s[2 * ks + 1][0], s[2 * ks + 1][1]);
      const uint32_t p3 = detail::pack_bf16x2(s[2 * ks + 1][2], s[2 * ks + 1][3]);
#pragma unroll
      for (int np = 0; np < kOTiles / 2; ++np) {
        uint32_t vb[4];
        detail::ldsm_x4_trans(vb, v_addr(tile, np, ks));
        detail::mma_bf16_16816(o[2 * np], p0, p1, p2, p3, vb[0], vb[1]);
        detail::mma_bf16_16816(o[2 * np + 1], p0, p1, p2, p3, vb[2], vb[3]);
      }
    }
    detail::mbar_arrive(empty0 + 8 * st);  // this thread's reads of the stage are done
  }

  // Epilogue. The 4 lanes of a quad hold disjoint keys of l.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
  // The two groups' (m, l, O) meet in the idle ring: each group combines, normalizes and stages half of the
  // columns (warp wq of group 0 the first 64 of its 128, O tiles 0-7; of group 1 the other 64), handing the
  // other half and its (m, l) to the other group, so that both halves are done at once. Warp wq hands off in
  // stage `grp` (one of its group's own stages: no copy refills it after the group's last tile) inside atoms
  // 2wq and 2wq + 1, the V columns only this warp reads there (the keys were read by every warp of the group
  // before its last exchange barrier). So each warp writes as soon as its own loop ends, and the group with the
  // chunk's last tile meets one barrier before the combine, not two. The combined rows are staged in stage
  // kOutStage (group 0's: free once group 0 is at the barrier).
  constexpr int kHalf = kOTiles / 2;
  // Warp wq's slot: its O half [j][lane] (4 KB), then its (m, l) [lane] (512 bytes).
  auto o_hand = [&](int from, int w) {
    return reinterpret_cast<float4*>(smem + from * kTileBytes + w * kHandOffBytes);
  };
  auto ml_hand = [&](int from, int w) { return o_hand(from, w) + kHalf * 32; };
  bf16* stage = reinterpret_cast<bf16*>(smem + kOutStage * kTileBytes);  // [16][kStageLd]
  const bool first = grp == 0;
  __syncwarp();  // every lane's ldmatrix of the warp's last tile precedes the overwrite
#pragma unroll
  for (int j = 0; j < kHalf; ++j) {
    o_hand(grp, wq)[j * 32 + lane] =
        first ? make_float4(o[kHalf + j][0], o[kHalf + j][1], o[kHalf + j][2], o[kHalf + j][3])
              : make_float4(o[j][0], o[j][1], o[j][2], o[j][3]);
  }
  ml_hand(grp, wq)[lane] = make_float4(m_run[0], m_run[1], l_run[0], l_run[1]);
  detail::named_barrier_sync(kBothGroups, kConsumers);
  {
    const int other = grp ^ 1;
    float4 u[kHalf];
#pragma unroll
    for (int j = 0; j < kHalf; ++j) u[j] = o_hand(other, wq)[j * 32 + lane];
    // A group may have had no tile (m = -inf, l = 0, O = 0): its weight is then 0. Both groups form l from group
    // 0's and group 1's terms in one explicit rounding order, so that both halves of a row are normalized by the
    // same l (left to the compiler, the multiply it contracts into the add could differ between the groups).
    const float4 ml = ml_hand(other, wq)[lane];
    const float m_oth[2] = {ml.x, ml.y}, l_oth[2] = {ml.z, ml.w};  // the other group's
    float w_mine[2], w_oth[2], inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m = fmaxf(m_run[r], m_oth[r]);
      w_mine[r] = ex2(m_run[r] - m);
      w_oth[r] = ex2(m_oth[r] - m);
      const float l_g0 = first ? l_run[r] : l_oth[r], w_g0 = first ? w_mine[r] : w_oth[r];
      const float l_g1 = first ? l_oth[r] : l_run[r], w_g1 = first ? w_oth[r] : w_mine[r];
      const float l = __fmaf_rn(l_g0, w_g0, __fmul_rn(l_g1, w_g1));
      inv[r] = l > 0.0f ? __fdividef(1.0f, l) : 0.0f;  // l >= 1 (group 0 has tile 0); the guard costs a select
      m_run[r] = m;
      l_run[r] = l;
    }
    const int n0 = first ? 0 : kHalf;
#pragma unroll
    for (int j = 0; j < kHalf; ++j) {
      float mine[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) mine[e] = first ? o[j][e] : o[kHalf + j][e];
      const int col = 128 * wq + 8 * (n0 + j) + 2 * tq;
      *reinterpret_cast<uint32_t*>(stage + g * kStageLd + col) = detail::pack_bf16x2(
          (mine[0] * w_mine[0] + u[j].x * w_oth[0]) * inv[0], (mine[1] * w_mine[0] + u[j].y * w_oth[0]) * inv[0]);
      *reinterpret_cast<uint32_t*>(stage + (g + 8) * kStageLd + col) = detail::pack_bf16x2(
          (mine[2] * w_mine[1] + u[j].z * w_oth[1]) * inv[1], (mine[3] * w_mine[1] + u[j].w * w_oth[1]) * inv[1]);
    }
    if (prm.splits > 1 && first && wq == 0 && tq == 0) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int h = g + 8 * r;
        if (h < nh) {
          const int64_t slot = (static_cast<int64_t>(b) * prm.splits + split) * a.heads + h0 + h;
          prm.lse[slot] = l_run[r] > 0.0f ? m_run[r] + log2f(l_run[r]) : -INFINITY;
        }
      }
    }
  }
  detail::named_barrier_sync(kBothGroups, kConsumers);
  for (int idx = tid; idx < nh * (kMlaLatent / 8); idx += kConsumers) {
    const int row = idx / (kMlaLatent / 8), c = idx % (kMlaLatent / 8);
    const uint4 v = *reinterpret_cast<const uint4*>(stage + row * kStageLd + c * 8);
    bf16* dst;
    if (prm.splits == 1) {
      dst = a.out + static_cast<int64_t>(b) * a.ld_out + static_cast<int64_t>(h0 + row) * kMlaLatent;
    } else {
      dst = prm.o_part + ((static_cast<int64_t>(b) * prm.splits + split) * a.heads + h0 + row) * kMlaLatent;
    }
    detail::store16(dst + c * 8, v);
  }
}

}  // namespace mma16
}  // namespace kimirt::cuda::mla_kernels
