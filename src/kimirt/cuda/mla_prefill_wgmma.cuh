// kWgmma of the MLA prefill attention (mla_prefill.h) on Hopper's warpgroup MMA, warp-specialized as FA3 is
// (a producer warp's tensor copies feed the consumers through a ring of stages).
//
// Block = 128 queries of one head of one sequence: two consumer warpgroups of 64 query rows each and one
// producer warp. The producer copies Q once (three 64-dim atoms per warpgroup) and then, per 64-key tile, K
// (k_nope's two atoms and the shared k_pe atom) and V (two atoms) with tensor copies into a ring of kStages
// stages; each copy lands in the 128-byte swizzle that wgmma reads. Per tile a consumer warpgroup
//   S[64 x 64] = Q · Kᵀ     12 wgmma m64n64k16, both operands from shared memory (K-major);
//   masks (causal, the sequence's end), scales into the log2 domain, runs the online softmax on S in
//   registers, rescales O, and packs P to bf16 in place: the accumulator layout is the A-fragment layout;
//   O[64 x 128] += P · V    4 wgmma m64n128k16, P from registers, V from shared memory (MN-major),
// then releases the stage. The two warpgroups share each stage, so K and V are read from L2 once per 128
// queries (the kMma kernel: once per 64), and one warpgroup's softmax can run while the other's wgmmas do.
// Nothing orders the two: making them take turns (FA3's ping-pong), or pipelining S of the next tile inside a
// warpgroup, measured slower (docs/PERF.md, 2026-11-30).
// Included by mla_prefill.cu only.
#pragma once

#include <cuda.h>

#include "kimirt/cuda/async_pipeline.cuh"
#include "kimirt/cuda/device_utils.cuh"
#include "kimirt/cuda/mla_prefill.h"
#include "kimirt/cuda/wgmma.cuh"

namespace kimirt::cuda::mla_prefill_wgmma {

using detail::bf16;

constexpr int kDqk = 192, kDv = 128;
constexpr int kBM = 128;            // queries per block: two consumer warpgroups of 64 rows
constexpr int kBN = 64;             // keys per tile
constexpr int kStages = 4;          // tiles in flight
constexpr int kAtom = 64 * 128;     // 64 rows x 64 bf16 values (one 128-byte swizzled row each)
constexpr int kQAtoms = kDqk / 64;  // 3 per warpgroup
constexpr int kKAtoms = kDqk / 64;  // k_nope 0-1, k_pe 2
constexpr int kVAtoms = kDv / 64;   // 2
constexpr int kStageBytes = (kKAtoms + kVAtoms) * kAtom;
constexpr int kSmemQ = 0;
constexpr int kSmemKV = kSmemQ + 2 * kQAtoms * kAtom;
constexpr int kSmemBars = kSmemKV + kStages * kStageBytes;
constexpr int kSmemBytes = kSmemBars + (2 * kStages + 1) * 8 + 1024;  // + the alignment slack
constexpr int kConsumerWarps = 8;
constexpr int kThreads = kConsumerWarps * 32 + 32;
static_assert(kSmemBytes <= 227 * 1024, "MLA prefill (wgmma) shared memory");
static_assert(kBN == 64 && kDv == 128, "the S and O fragments below are written for m64n64 and m64n128");

struct Params {
  MlaPrefillArgs a;
  float scale_log2;
};

// The epilogue both prefill kernels share. A thread holds two rows of O (r and r + 8 of a 16-row slice; the
// row of r is `row`, counted from the sequence's first query) in the m16n8 accumulator layout: o(j, e) is
// row r + 8·(e / 2), column 8j + c2 + e % 2, for 16 blocks j. The quad completes the row sums l, then each
// row before the sequence's end is normalized, multiplied by σ(gate) when there is one, and stored as bf16;
// with a.lse, the quad's first lane stores the row's m + log2(l) (m: the row's running maximum, the same in
// every lane of the quad).
template <class O>
__device__ __forceinline__ void store_rows(const MlaPrefillArgs& a, O o, float (&l)[2], const float (&m)[2], int head,
                                           int q_begin, int row, int tq, int c2) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (row + 8 * h >= tq) continue;
    const float inv_l = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
    const int64_t token = q_begin + row + 8 * h;
    if (a.lse && c2 == 0) a.lse[token * a.ld_lse + head] = l[h] > 0.0f ? m[h] + log2f(l[h]) : -INFINITY;
    bf16* dst = a.out + token * a.ld_out + head * kDv;
    const bf16* gp = a.gate ? a.gate + token * a.ld_gate + head * kDv : nullptr;
#pragma unroll
    for (int j = 0; j < kDv / 8; ++j) {
      const int col = 8 * j + c2;
      float v0 = o(j, 2 * h) * inv_l, v1 = o(j, 2 * h + 1) * inv_l;
      if (gp) {
        const float2 gv = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(gp + col));
        v0 *= detail::sigmoid(gv.x);
        v1 *= detail::sigmoid(gv.y);
      }
      *reinterpret_cast<uint32_t*>(dst + col) = detail::pack_bf16x2(v0, v1);
    }
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    mla_prefill_wgmma_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                             const __grid_constant__ CUtensorMap pe_map, const __grid_constant__ CUtensorMap v_map,
                             const Params prm) {
  const MlaPrefillArgs& a = prm.a;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = detail::smem_aligned_1024(smem_raw);
  const uint32_t base = detail::smem_addr(smem);
  const uint32_t full0 = base + kSmemBars, empty0 = full0 + 8 * kStages, q_bar = empty0 + 8 * kStages;

  const int b = blockIdx.z, head = blockIdx.y;
  const int q_begin = a.cu_q[b], tq = a.cu_q[b + 1] - q_begin;
  const int k_begin = a.cu_k[b], tk = a.cu_k[b + 1] - k_begin;
  // Under the causal mask a head's last query tiles see the most keys: they are dispatched first.
  const int m0 = (gridDim.x - 1 - blockIdx.x) * kBM;
  if (m0 >= tq) return;
  const int offset = a.causal ? tk - tq : tk;  // position of query 0 (past every key when not causal)
  const int last_q = min(m0 + kBM, tq) - 1;
  const int n_keys = max(0, min(tk, offset + last_q + 1));
  const int n_tiles = (n_keys + kBN - 1) / kBN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      detail::mbar_init(full0 + 8 * s, 1);
      detail::mbar_init(empty0 + 8 * s, kConsumerWarps);
    }
    detail::mbar_init(q_bar, 1);
    detail::mbar_init_fence();
  }
  __syncthreads();

  if (warp == kConsumerWarps) {
    if (lane == 0) {
      detail::mbar_expect_tx(q_bar, 2 * kQAtoms * kAtom);
      for (int w = 0; w < 2; ++w)
        for (int t = 0; t < kQAtoms; ++t)
          detail::tma_load_2d(base + kSmemQ + (w * kQAtoms + t) * kAtom, &q_map, head * kDqk + t * 64,
                              q_begin + m0 + 64 * w, q_bar);
      const int k_col = head * static_cast<int>(a.hs_k_nope), v_col = head * static_cast<int>(a.hs_v);
      uint32_t s = 0, phase = 0;
      for (int tile = 0; tile < n_tiles; ++tile) {
        detail::mbar_wait(empty0 + 8 * s, phase ^ 1);  // the first round passes: the "previous" phase
        const uint32_t full = full0 + 8 * s, st = base + kSmemKV + s * kStageBytes;
        const int row = k_begin + tile * kBN;
        detail::mbar_expect_tx(full, kStageBytes);
        detail::tma_load_2d(st, &k_map, k_col, row, full);
        detail::tma_load_2d(st + kAtom, &k_map, k_col + 64, row, full);
        detail::tma_load_2d(st + 2 * kAtom, &pe_map, 0, row, full);
        detail::tma_load_2d(st + 3 * kAtom, &v_map, v_col, row, full);
        detail::tma_load_2d(st + 4 * kAtom, &v_map, v_col + 64, row, full);
        if (++s == kStages) s = 0, phase ^= 1;
      }
    }
    return;  // the consumers wait for every copy, so the block's shared memory outlives them
  }

  // This thread's rows of its warpgroup's 64 (the m64 accumulator layout): r and r + 8; its columns of each
  // 8-wide block j: 8j + 2·(lane % 4) + {0, 1} (values 4j, 4j+1 on row r, 4j+2, 4j+3 on row r + 8).
  const int wg = warp / 4;
  const int r = (warp % 4) * 16 + lane / 4, c2 = 2 * (lane % 4);
  const int qpos[2] = {offset + m0 + 64 * wg + r, offset + m0 + 64 * wg + r + 8};
  const uint64_t dq = detail::wgmma_desc_sw128(base + kSmemQ + wg * kQAtoms * kAtom, 16, 1024);

  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  detail::mbar_wait(q_bar, 0);

  uint32_t s = 0, phase = 0;
  for (int tile = 0; tile < n_tiles; ++tile) {
    const uint32_t st = base + kSmemKV + s * kStageBytes;
    detail::mbar_wait(full0 + 8 * s, phase);
    if (tile * kBN + kBN > tk) {
      // The sequence ends inside this tile. Its rows past the end (the next sequence's keys, or the copy's zero
      // fill) get P = 0, but 0 · NaN or 0 · Inf is NaN: their V is zeroed first, by both warpgroups, before
      // either reads the stage (masking S alone suffices for K: a select, not a product).
      detail::zero_sw128_rows(smem + kSmemKV + s * kStageBytes + kKAtoms * kAtom, kVAtoms, kBN, max(0, tk - tile * kBN),
                              threadIdx.x, kConsumerWarps * 32);
      detail::named_barrier_sync(1, kConsumerWarps * 32);
    }
    const uint64_t dk = detail::wgmma_desc_sw128(st, 16, 1024);
    // V as the MN-major B operand: its two 64-dim atoms are LBO apart, a k16 step is 16 rows (2048 bytes).
    const uint64_t dv = detail::wgmma_desc_sw128(st + kKAtoms * kAtom, kAtom, 1024);

    float sc[32];
    detail::wgmma_fence();
#pragma unroll
    for (int i = 0; i < kDqk / 16; ++i) {
      const uint64_t off = static_cast<uint64_t>(((i >> 2) * kAtom + (i & 3) * 32) >> 4);
      detail::wgmma_m64n64k16_ss(sc, dq + off, dk + off, i > 0 ? 1 : 0);
    }
    detail::wgmma_commit();
    detail::wgmma_wait<0>();
    detail::fence_regs(sc);

    // Mask (the causal bound and the sequence's end: rows past it belong to the next sequence or are the
    // copy's zero fill), scale into the log2 domain, online softmax per row.
    const int key0 = tile * kBN + c2;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + 8 * j + (e & 1);
        const bool ok = key < tk && key <= qpos[e >> 1];
        sc[4 * j + e] = ok ? sc[4 * j + e] * prm.scale_log2 : -INFINITY;
        mx[e >> 1] = fmaxf(mx[e >> 1], sc[4 * j + e]);
      }
    }
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      const float m_new = fmaxf(m_run[h], mx[h]);
      alpha[h] = m_new == -INFINITY ? 1.0f : detail::ex2(m_run[h] - m_new);
      m_run[h] = m_new;
    }
    // A row with every key so far masked keeps m = -inf: its weights are 0, not 2^(-inf + inf).
    const float m_use[2] = {m_run[0] == -INFINITY ? 0.0f : m_run[0], m_run[1] == -INFINITY ? 0.0f : m_run[1]};
    float rowsum[2] = {0.0f, 0.0f};
    uint32_t pa[16];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float p0 = detail::ex2(sc[4 * j] - m_use[0]), p1 = detail::ex2(sc[4 * j + 1] - m_use[0]);
      const float p2 = detail::ex2(sc[4 * j + 2] - m_use[1]), p3 = detail::ex2(sc[4 * j + 3] - m_use[1]);
      rowsum[0] += p0 + p1;
      rowsum[1] += p2 + p3;
      // The A fragment of k16 step j / 2: rows r, r + 8 at keys 16·(j/2) + c2 (j even) or + 8 + c2 (j odd).
      pa[2 * j] = detail::pack_bf16x2(p0, p1);
      pa[2 * j + 1] = detail::pack_bf16x2(p2, p3);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) l_run[h] = l_run[h] * alpha[h] + rowsum[h];
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      o[4 * j] *= alpha[0];
      o[4 * j + 1] *= alpha[0];
      o[4 * j + 2] *= alpha[1];
      o[4 * j + 3] *= alpha[1];
    }

    detail::wgmma_fence();
#pragma unroll
    for (int k = 0; k < kBN / 16; ++k) {
      // Registers a0..a3 of step k: (r, 16k + c2), (r + 8, 16k + c2), (r, 16k + 8 + c2), (r + 8, 16k + 8 + c2).
      detail::wgmma_m64n128k16_rs_tb(o, pa[4 * k], pa[4 * k + 1], pa[4 * k + 2], pa[4 * k + 3],
                                     dv + static_cast<uint64_t>(k * 2048 / 16));
    }
    detail::wgmma_commit();
    detail::wgmma_wait<0>();
    detail::fence_regs(o);
    __syncwarp();
    if (lane == 0) detail::mbar_arrive(empty0 + 8 * s);  // this warp's reads of the stage are done
    if (++s == kStages) s = 0, phase ^= 1;
  }

  store_rows(
      a, [&](int j, int e) { return o[4 * j + e]; }, l_run, m_run, head, q_begin, m0 + 64 * wg + r, tq, c2);
}

}  // namespace kimirt::cuda::mla_prefill_wgmma
