// Absorbed MLA decode attention on Hopper tensor cores (wgmma), split over the context (flash-decoding).
//
// Why this shape: at batch 1 every query head scores the same cached rows, so the kernel is at the
// compute/bandwidth ridge (≈ 2·(576 + 512)·heads flop per 1152-byte row). Each block therefore takes up to
// 64 heads (the wgmma M) against one 48-row tile of the cache at a time, and every tile is read from HBM
// once for those heads (two head groups of one context chunk run side by side and share it through L2).
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
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <mutex>

#include "kimirt/cuda/check.h"
#include "kimirt/cuda/device_utils.cuh"
#include "kimirt/cuda/kernel_attr.h"
#include "kimirt/cuda/mla_decode.h"
#include "kimirt/cuda/wgmma.cuh"

namespace kimirt::cuda {
namespace {

using detail::bf16;

constexpr int kM = 64;                               // head rows per block (wgmma M; unused rows are zeros)
constexpr int kT = 48;                               // cache rows per tile (wgmma N of the score product)
constexpr int kThreads = 256;                        // two warpgroups
constexpr int kAtoms = kMlaRow / 64;                 // 9 swizzle atoms of 64 dims per row
constexpr int kChunks = kMlaRow / 8;                 // 72 16-byte chunks per row
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

struct Params {
  MlaDecodeArgs a;
  int splits, chunk, heads_per_group;
  float scale_log2;
  bf16* o_part;  // [batch][splits][heads][512]
  float* lse;    // [batch][splits][heads], log2 domain
};

// Byte offset of element chunk c (16 bytes) of row r in a swizzled [rows x 576] operand.
__device__ __forceinline__ uint32_t swz(int r, int c, int atom_bytes) {
  return static_cast<uint32_t>((c >> 3) * atom_bytes + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

__device__ __forceinline__ void mbar_init(uint32_t bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@p bra DONE;\nbra WAIT;\nDONE:\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// Rows [row, row + 16) x dims [col, col + 64) of the cache into a swizzled atom slice, counted on `bar`.
__device__ __forceinline__ void tma_box(uint32_t dst, const CUtensorMap* map, int col, int row, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(bar)
      : "memory");
}

// The 18 k16 steps of one warpgroup's half of the score product, from step S0 on; start-address fields
// advance by (bytes >> 4) (addresses stay below 2^18, so the 14-bit field never carries).
template <int S0>
__device__ __forceinline__ void score_steps(float (&s)[kSFrag], uint64_t dq, uint64_t dk) {
#pragma unroll
  for (int i = 0; i < kHalfSteps; ++i) {
    const int step = S0 + i;
    const uint64_t a_off = static_cast<uint64_t>(((step >> 2) * kQAtomBytes + (step & 3) * 32) >> 4);
    const uint64_t b_off = static_cast<uint64_t>(((step >> 2) * kTileAtomBytes + (step & 3) * 32) >> 4);
    detail::wgmma_m64n48k16_ss(s, dq + a_off, dk + b_off, i > 0 ? 1 : 0);
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    mla_decode_kernel(const __grid_constant__ CUtensorMap cache_map, const __grid_constant__ CUtensorMap q_map,
                      Params prm) {
  const MlaDecodeArgs& a = prm.a;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  uint8_t* qs = smem;
  uint8_t* ks = qs + kQBytes;                                           // two stages
  float* xs = reinterpret_cast<float*>(ks + 2 * kTileBytes);            // [2][kSFrag][128]
  uint64_t* bars = reinterpret_cast<uint64_t*>(xs + 2 * kSFrag * 128);  // [2]

  const int group = blockIdx.x, split = blockIdx.y, b = blockIdx.z;
  const int h0 = group * prm.heads_per_group;
  const int nh = min(prm.heads_per_group, a.heads - h0);
  const int seq_len = a.seq_lens[b];
  const int k_start = split * prm.chunk;
  const int k_end = split == prm.splits - 1 ? seq_len : min(seq_len, k_start + prm.chunk);
  const int tid = threadIdx.x;
  const int wg = tid >> 7, t = tid & 127, warp = t >> 5, lane = t & 31;

  if (k_start >= k_end) {
    // Nothing to attend in this chunk: an empty part (weight 0, zeros, so the merge needs no branch), or
    // zeros when unsplit.
    const int64_t slot0 = (static_cast<int64_t>(b) * prm.splits + split) * a.heads + h0;
    for (int i = tid; i < nh * kMlaLatent / 8; i += kThreads) {
      const int h = i / (kMlaLatent / 8), c = i % (kMlaLatent / 8);
      bf16* dst = prm.splits > 1
                      ? prm.o_part + (slot0 + h) * kMlaLatent
                      : a.out + static_cast<int64_t>(b) * a.ld_out + static_cast<int64_t>(h0 + h) * kMlaLatent;
      detail::store16(dst + c * 8, make_uint4(0, 0, 0, 0));
    }
    if (prm.splits > 1) {
      for (int h = tid; h < nh; h += kThreads) prm.lse[slot0 + h] = -INFINITY;
    }
    return;
  }

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
#pragma unroll
    for (int bx = 0; bx < kBoxes; ++bx) {
      const int key = k_start + tile * kT + bx * kBox;
      rows[bx] = key < k_end ? table[key / a.page_size] * a.page_size + key % a.page_size : 0;
    }
  };
  auto issue_tile = [&](int tile, int slot, const int(&rows)[kBoxes], uint32_t extra_bytes) {
    const int start = k_start + tile * kT;
    const int boxes = min(kBoxes, (k_end - start + kBox - 1) / kBox);
    const uint32_t bar = bar0 + 8 * slot;
    mbar_expect_tx(bar, static_cast<uint32_t>(boxes * kAtoms * kBox * 128) + extra_bytes);
    const uint32_t dst0 = detail::smem_addr(ks + slot * kTileBytes);
#pragma unroll
    for (int bx = 0; bx < kBoxes; ++bx) {
      if (bx < boxes) {
#pragma unroll
        for (int at = 0; at < kAtoms; ++at) {
          tma_box(dst0 + at * kTileAtomBytes + bx * kBox * 128, &cache_map, at * 64, rows[bx], bar);
        }
      }
    }
  };

  // Prologue (thread 0): the barriers; Q (64 rows from h0; rows past the last head are zero-filled by the
  // copy engine, rows of the next head group only give discarded scores) and tile 0 on the first barrier.
  int rows_next[kBoxes];
  if (tid == 0) {
    mbar_init(bar0);
    mbar_init(bar0 + 8);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    const uint32_t q_dst = detail::smem_addr(qs);
#pragma unroll
    for (int at = 0; at < kAtoms; ++at) {
      asm volatile(
          "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
          "[%5];\n" ::"r"(q_dst + at * kQAtomBytes),
          "l"(reinterpret_cast<uint64_t>(&q_map)), "r"(at * 64), "r"(h0), "r"(b), "r"(bar0)
          : "memory");
    }
    lookup(0, rows_next);
    issue_tile(0, 0, rows_next, kQBytes);
    if (n_tiles > 1) lookup(1, rows_next);
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
    mbar_wait(bar0 + 8 * slot, (tile >> 1) & 1);
    const int valid = min(kT, k_end - (k_start + tile * kT));
    if (valid < kT) {
      // The rows past the chunk's end hold whatever the cache pages held (or nothing was copied): zeros,
      // so that P = 0 meets finite values in P·V.
      uint8_t* t = ks + slot * kTileBytes;
      for (int idx = tid; idx < (kT - valid) * kChunks; idx += kThreads) {
        const int r = valid + idx / kChunks, c = idx % kChunks;
        *reinterpret_cast<uint4*>(t + swz(r, c, kTileAtomBytes)) = make_uint4(0, 0, 0, 0);
      }
      detail::fence_proxy_async();
      __syncthreads();
    }

    // S (partial over this warpgroup's 288 dims). The descriptors differ from the tile's base descriptors
    // only in the start address field, by compile-time offsets: one add each instead of a rebuild.
    float s[kSFrag];
    detail::wgmma_fence();
    const uint64_t dk = slot ? dk1 : dk0;
    if (wg == 0) {
      score_steps<0>(s, dq, dk);
    } else {
      score_steps<kHalfSteps>(s, dq, dk);
    }
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
    detail::wgmma_fence();
#pragma unroll
    for (int j = 0; j < kT / 16; ++j) {
      const uint32_t a0 = detail::pack_bf16x2(s[8 * j + 0], s[8 * j + 1]);
      const uint32_t a1 = detail::pack_bf16x2(s[8 * j + 2], s[8 * j + 3]);
      const uint32_t a2 = detail::pack_bf16x2(s[8 * j + 4], s[8 * j + 5]);
      const uint32_t a3 = detail::pack_bf16x2(s[8 * j + 6], s[8 * j + 7]);
      detail::wgmma_m64n256k16_rs_tb(o, a0, a1, a2, a3, (slot ? dv1 : dv0) + static_cast<uint64_t>(j * 2048 / 16));
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
  const int r0 = 16 * warp + (lane >> 2);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float inv_l = l_run[r] > 0.0f ? 1.0f / l_run[r] : 0.0f;
    const int row = r0 + 8 * r;
#pragma unroll
    for (int nb = 0; nb < kOFrag / 4; ++nb) {
      const int col = 256 * wg + 8 * nb + 2 * (lane & 3);
      *reinterpret_cast<uint32_t*>(stage + row * kMlaLatent + col) =
          detail::pack_bf16x2(o[4 * nb + 2 * r] * inv_l, o[4 * nb + 2 * r + 1] * inv_l);
    }
    if (prm.splits > 1 && wg == 0 && (lane & 3) == 0 && row < nh) {
      const int64_t slot = (static_cast<int64_t>(b) * prm.splits + split) * a.heads + h0 + row;
      prm.lse[slot] = l_run[r] > 0.0f ? m_run[r] + log2f(l_run[r]) : -INFINITY;
    }
  }
  __syncthreads();
  for (int idx = tid; idx < nh * (kMlaLatent / 8); idx += kThreads) {
    const int row = idx / (kMlaLatent / 8), c = idx % (kMlaLatent / 8);
    const uint4 v = *reinterpret_cast<const uint4*>(stage + row * kMlaLatent + c * 8);
    bf16* dst;
    if (prm.splits == 1) {
      dst = a.out + static_cast<int64_t>(b) * a.ld_out + static_cast<int64_t>(h0 + row) * kMlaLatent;
    } else {
      const int64_t slot = (static_cast<int64_t>(b) * prm.splits + split) * a.heads + h0 + row;
      dst = prm.o_part + slot * kMlaLatent;
    }
    *reinterpret_cast<uint4*>(dst + c * 8) = v;
  }
}

// Merge of the chunks: out = Σ_s 2^(lse_s − M) · o_s / Σ_s 2^(lse_s − M). Block = (head, quarter of the 512
// columns, sequence); its 256 threads are 16 groups of 16 that each take every 16th chunk (8 columns per
// thread, 16-byte loads, 2 chunks per step unrolled), so a block has 32 chunks' loads in flight. Empty
// chunks carry lse = -inf and zeros: no branch. The groups' sums meet in shared memory.
constexpr int kMergeGroups = 16;
constexpr int kMergeUnroll = 2;
constexpr int kMergeCols = 128;
__global__ void __launch_bounds__(256)
    mla_decode_merge_kernel(const bf16* __restrict__ o_part, const float* __restrict__ lse, int splits, int heads,
                            bf16* __restrict__ out, int64_t ld_out) {
  __shared__ float acc_s[kMergeGroups][kMergeCols + 4];
  __shared__ float den_s[kMergeGroups];
  __shared__ float max_s;
  const int head = blockIdx.x, quarter = blockIdx.y, b = blockIdx.z;
  const int grp = threadIdx.x >> 4, cl = (threadIdx.x & 15) * 8, col = quarter * kMergeCols + cl;
  const int64_t base = static_cast<int64_t>(b) * splits * heads + head;
  if (threadIdx.x < 32) {
    float mx = -INFINITY;
    for (int s = threadIdx.x; s < splits; s += 32) mx = fmaxf(mx, lse[base + static_cast<int64_t>(s) * heads]);
    mx = detail::warp_max(mx);
    if (threadIdx.x == 0) max_s = mx;
  }
  __syncthreads();
  const float mx = max_s == -INFINITY ? 0.0f : max_s;  // all empty: every weight is 0
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  float den = 0.0f;
  for (int s0 = grp; s0 < splits; s0 += kMergeGroups * kMergeUnroll) {
    float w[kMergeUnroll];
    uint4 x[kMergeUnroll];
#pragma unroll
    for (int u = 0; u < kMergeUnroll; ++u) {
      const int s = s0 + u * kMergeGroups;
      const int64_t slot = base + static_cast<int64_t>(s < splits ? s : 0) * heads;
      w[u] = s < splits ? exp2f(lse[slot] - mx) : 0.0f;
      x[u] = detail::ldg16(o_part + slot * kMlaLatent + col);
    }
#pragma unroll
    for (int u = 0; u < kMergeUnroll; ++u) {
      float f[8];
      detail::unpack8(x[u], f);
      den += w[u];
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] += w[u] * f[j];
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) acc_s[grp][cl + j] = acc[j];
  if ((threadIdx.x & 15) == 0) den_s[grp] = den;
  __syncthreads();
  if (grp != 0) return;
  float d = 0.0f;
#pragma unroll
  for (int g = 0; g < kMergeGroups; ++g) d += den_s[g];
  const float inv = d > 0.0f ? 1.0f / d : 0.0f;
  float y[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    float v = 0.0f;
#pragma unroll
    for (int g = 0; g < kMergeGroups; ++g) v += acc_s[g][cl + j];
    y[j] = v * inv;
  }
  detail::store16(out + static_cast<int64_t>(b) * ld_out + static_cast<int64_t>(head) * kMlaLatent + col,
                  detail::pack8(y));
}

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    cudaDriverEntryPointQueryResult q{};
    void* fn = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess) {
      encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    }
    (void)cudaGetLastError();
  });
  KIMIRT_CUDA_REQUIRE(encode, "mla_decode: the driver offers no cuTensorMapEncodeTiled (a Hopper driver is needed)");
  return encode;
}

CUtensorMap cache_tensor_map(const bf16* cache, int64_t rows) {
  const auto encode = tensor_map_encoder();
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(kMlaRow), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(kMlaRow) * 2};
  const cuuint32_t box[2] = {64, kBox};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<bf16*>(cache), dims, strides, box,
                            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  KIMIRT_CUDA_REQUIRE(r == CUDA_SUCCESS, "mla_decode: cuTensorMapEncodeTiled failed (error ", static_cast<int>(r),
                      ") for a cache of ", rows, " rows");
  return map;
}

// q [batch, heads, 576] (batch stride ld_q) as a 3-D tensor for one 64-head x 64-dim box per atom; heads
// past the last are zero-filled by the copy engine.
CUtensorMap q_tensor_map(const bf16* q, int heads, int batch, int64_t ld_q) {
  const auto encode = tensor_map_encoder();
  CUtensorMap map;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(kMlaRow), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(kMlaRow) * 2, static_cast<cuuint64_t>(ld_q) * 2};
  const cuuint32_t box[3] = {64, kM, 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<bf16*>(q), dims, strides, box,
                            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  KIMIRT_CUDA_REQUIRE(r == CUDA_SUCCESS, "mla_decode: cuTensorMapEncodeTiled failed (error ", static_cast<int>(r),
                      ") for q of ", batch, " x ", heads, " heads, ld_q ", ld_q);
  return map;
}

// Encoding a tensor map is a driver call; a decode step repeats the same few (the cache, the q buffer), so
// the last ones are kept (a small table searched linearly, guarded for concurrent streams).
struct MapKey {
  int kind;
  uintptr_t ptr;
  int64_t d0, d1, d2;
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

MlaDecodePlan plan_mla_decode(int batch, int heads, int max_seq_len, int sm_count) {
  KIMIRT_CUDA_REQUIRE(batch >= 0 && heads > 0 && max_seq_len >= 0, "plan_mla_decode: batch ", batch, ", heads ", heads,
                      ", max_seq_len ", max_seq_len);
  MlaDecodePlan p;
  p.head_groups = (heads + kM - 1) / kM;
  p.heads_per_group = (heads + p.head_groups - 1) / p.head_groups;
  // One wave of blocks over the SMs; a chunk of at least two tiles amortizes loading Q and filling the
  // pipeline.
  const int64_t blocks_per_split = std::max<int64_t>(1, static_cast<int64_t>(batch) * p.head_groups);
  int64_t splits = (std::max(sm_count, 1) + blocks_per_split - 1) / blocks_per_split;
  splits = std::clamp<int64_t>(splits, 1, std::max<int64_t>(1, max_seq_len / (2 * kT)));
  int64_t chunk = (std::max(max_seq_len, 1) + splits - 1) / splits;
  chunk = (chunk + kMlaChunkAlign - 1) / kMlaChunkAlign * kMlaChunkAlign;
  splits = std::max<int64_t>(1, (max_seq_len + chunk - 1) / chunk);
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
  KIMIRT_CUDA_REQUIRE(a.num_pages >= 0 && a.num_pages * int64_t{a.page_size} < (int64_t{1} << 32),
                      "mla_decode: num_pages ", a.num_pages, " out of range");
  KIMIRT_CUDA_REQUIRE(detail::aligned16(a.q) && detail::aligned16(a.cache) && detail::aligned16(a.out),
                      "mla_decode: q, cache and out must be 16-byte aligned");
  KIMIRT_CUDA_REQUIRE(
      plan.splits >= 1 && plan.splits <= 65535 && plan.chunk > 0 && plan.chunk % kMlaChunkAlign == 0 &&
          plan.head_groups * plan.heads_per_group >= a.heads && plan.heads_per_group <= kM && plan.heads_per_group > 0,
      "mla_decode: plan (splits ", plan.splits, ", chunk ", plan.chunk, ", head groups ", plan.head_groups, " x ",
      plan.heads_per_group, ") does not fit ", a.heads, " heads; use plan_mla_decode");
  Params p{a,
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
  const CUtensorMap map = cached_map({0, reinterpret_cast<uintptr_t>(a.cache), rows, 0, 0},
                                     [&] { return cache_tensor_map(a.cache, rows); });
  const CUtensorMap q_map = cached_map({1, reinterpret_cast<uintptr_t>(a.q), a.heads, a.batch, a.ld_q},
                                       [&] { return q_tensor_map(a.q, a.heads, a.batch, a.ld_q); });
  ensure_dynamic_smem(reinterpret_cast<const void*>(&mla_decode_kernel), kSmemBytes);
  const dim3 grid(static_cast<unsigned>(plan.head_groups), static_cast<unsigned>(plan.splits),
                  static_cast<unsigned>(a.batch));
  mla_decode_kernel<<<grid, kThreads, kSmemBytes, stream>>>(map, q_map, p);
  KIMIRT_CUDA_CHECK_LAUNCH();
  if (plan.splits > 1) {
    mla_decode_merge_kernel<<<dim3(static_cast<unsigned>(a.heads), kMlaLatent / kMergeCols,
                                   static_cast<unsigned>(a.batch)),
                              256, 0, stream>>>(p.o_part, p.lse, plan.splits, a.heads, a.out, a.ld_out);
    KIMIRT_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace kimirt::cuda
