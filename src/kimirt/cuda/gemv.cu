// Skinny GEMM (M ≤ 16) on tensor cores, bandwidth-bound on W.
//
// Fragment trick: the order in which an MMA sums over k does not matter as long as W and x use the same
// order. Lane (g = lane / 4, t = lane % 4) loads 16 contiguous bytes (k = 8t..8t+7 of a 32-wide chunk)
// from W rows g and g + 8 and from token row g, and feeds them to two m16n8k16 MMAs: physical k 8t..8t+3
// play the logical k {2t, 2t+1, 2t+8, 2t+9} of the first MMA, 8t+4..8t+7 those of the second. Every load
// is a full 16-byte vector and every 64-byte row segment is read by four adjacent lanes.
#include <algorithm>
#include <type_traits>

#include "kimirt/cuda/async_pipeline.cuh"
#include "kimirt/cuda/check.h"
#include "kimirt/cuda/device_utils.cuh"
#include "kimirt/cuda/gemv.h"
#include "kimirt/cuda/kernel_attr.h"

namespace kimirt::cuda {
namespace {

using detail::bf16;

// Calls f with std::type_identity<OutT>, OutT the element type of y_type: one launch site per kernel for both
// output types.
template <typename F>
void with_out_type(OutType y_type, F&& f) {
  if (y_type == OutType::kF32) {
    f(std::type_identity<float>{});
  } else {
    KIMIRT_CUDA_REQUIRE(y_type == OutType::kBF16, "skinny_gemm: unknown output type ", static_cast<int>(y_type));
    f(std::type_identity<bf16>{});
  }
}

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 16;   // rows of W per block (one MMA tile)
constexpr int kUnroll = 4;  // 32-wide chunks in flight per warp per iteration
constexpr int kChunk = 32;

struct Params {
  const bf16* x;
  int64_t ldx;
  const bf16* w;
  int64_t ldw;
  void* y;
  int64_t ldy;
  int m, n, k;
  int k_per_split;
  int splits;
  float beta;
  float* partial;  // [batch, splits, m, n] when splits > 1
  int64_t stride_x, stride_w, stride_y;
  const bf16* gate;    // optional, as y (SkinnyGemmArgs::gate)
  const bf16* x_norm;  // optional RMSNorm weight [k] of x's rows (SkinnyGemmArgs::x_norm; splits == 1)
  float x_norm_eps;
};

// gate: BF16 y with beta 0 only (skinny_gemm_supported); the product is rounded to bf16 first, as the
// unfused path stores it, then gated as sigmoid_gate_mul does.
template <typename OutT>
__device__ __forceinline__ void store_out(void* y, int64_t index, float v, float beta, const bf16* gate) {
  OutT* p = static_cast<OutT*>(y) + index;
  if constexpr (sizeof(OutT) == 4) {
    if (beta != 0.0f) v += *p;
    *p = v;
  } else {
    if (beta != 0.0f) v += __bfloat162float(*p);
    if (gate) v = __bfloat162float(__float2bfloat16_rn(v)) * detail::sigmoid(__bfloat162float(gate[index]));
    *p = __float2bfloat16_rn(v);
  }
}

// WIDE (short rows, K <= 256, e.g. the per-head W_UK absorption): each warp owns its own 16 rows over the
// whole K range, so a block covers 64 rows and its warps need no reduction; otherwise the 4 warps split K
// for one 16-row tile (more blocks: better for K = 512, where WIDE left too few warps streaming).
// NORM (p.x_norm, the block covers all of K): the MMA operand is bf16(x ⊙ x_norm) and each lane also sums
// the squares of the raw x it loads; the block's sums give each token's rms⁻¹, applied to its outputs.
template <int NT, typename OutT, bool WIDE, bool NORM>
__global__ void __launch_bounds__(kThreads) skinny_kernel(Params p) {
  constexpr int kCols = 8 * NT;
  __shared__ float red[kWarps][kRows][kCols + 1];
  __shared__ float sumsq[kWarps][kCols];
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int row0 = WIDE ? (blockIdx.x * kWarps + warp) * kRows : blockIdx.x * kRows;
  const int64_t entry = blockIdx.z;
  // A kernel launched after this one as a programmatic dependent (the MLA decode attention after the W_UK
  // absorption) may start its independent work now; it must wait (griddepcontrol.wait) before reading y, and
  // before writing x, w, gate or y, which this kernel may still be reading (y too when beta is 1).
  // With K split, its predecessor is the reduce kernel instead, which does not trigger early.
  detail::pdl_launch_dependents();
  const bf16* x_base = p.x + entry * p.stride_x;
  const bf16* w_base = p.w + entry * p.stride_w;
  const int k_begin = blockIdx.y * p.k_per_split;
  const int k_end = min(p.k, k_begin + p.k_per_split);

  const int r_lo = row0 + g, r_hi = row0 + g + 8;
  const bool v_lo = r_lo < p.n, v_hi = r_hi < p.n;
  const bf16* w_lo = w_base + static_cast<int64_t>(v_lo ? r_lo : 0) * p.ldw + 8 * t;
  const bf16* w_hi = w_base + static_cast<int64_t>(v_hi ? r_hi : 0) * p.ldw + 8 * t;
  const bf16* xr[NT];
  bool xv[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int tok = g + 8 * j;
    xv[j] = tok < p.m;
    xr[j] = x_base + static_cast<int64_t>(xv[j] ? tok : 0) * p.ldx + 8 * t;
  }

  float acc[NT][4];
  float ss[NT];  // NORM: this lane's sum of x² per token
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = ss[j] = 0.0f;

  const uint4 zero = make_uint4(0, 0, 0, 0);
  constexpr int kStride = WIDE ? kChunk : kChunk * kWarps;  // between a warp's consecutive chunks
  for (int kk = k_begin + (WIDE ? 0 : kChunk * warp); kk < k_end; kk += kStride * kUnroll) {
    uint4 wl[kUnroll], wh[kUnroll], xx[kUnroll][NT], nw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      // Loads are unconditional (from a clamped, valid address) and masked afterwards, so the compiler
      // issues all of them before the first MMA instead of branching around each.
      const int kc_raw = kk + u * kStride;
      const bool in = kc_raw < k_end;
      const int kc = in ? kc_raw : k_begin;
      const uint4 a = detail::ldcs16(w_lo + kc);
      const uint4 b = detail::ldcs16(w_hi + kc);
      wl[u] = (in && v_lo) ? a : zero;
      wh[u] = (in && v_hi) ? b : zero;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const uint4 c = detail::ldg16(xr[j] + kc);
        xx[u][j] = (in && xv[j]) ? c : zero;
      }
      if constexpr (NORM) nw[u] = detail::ldg16(p.x_norm + 8 * t + kc);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if constexpr (NORM) {
        float wn[8];
        detail::unpack8(nw[u], wn);
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          float f[8];
          detail::unpack8(xx[u][j], f);
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            ss[j] = fmaf(f[e], f[e], ss[j]);
            f[e] *= wn[e];
          }
          xx[u][j] = detail::pack8(f);
        }
      }
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        detail::mma_bf16_16816(acc[j], wl[u].x, wh[u].x, wl[u].y, wh[u].y, xx[u][j].x, xx[u][j].y);
        detail::mma_bf16_16816(acc[j], wl[u].z, wh[u].z, wl[u].w, wh[u].w, xx[u][j].z, xx[u][j].w);
      }
    }
  }

#pragma unroll
  for (int j = 0; j < NT; ++j) {
    red[warp][g][8 * j + 2 * t] = acc[j][0];
    red[warp][g][8 * j + 2 * t + 1] = acc[j][1];
    red[warp][g + 8][8 * j + 2 * t] = acc[j][2];
    red[warp][g + 8][8 * j + 2 * t + 1] = acc[j][3];
  }
  if constexpr (NORM) {
    // The four lanes of a quad loaded disjoint parts of token g + 8j's chunks.
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      ss[j] += __shfl_xor_sync(0xffffffffu, ss[j], 1);
      ss[j] += __shfl_xor_sync(0xffffffffu, ss[j], 2);
      if (t == 0) sumsq[warp][g + 8 * j] = ss[j];
    }
  }
  __syncthreads();
  // WIDE: warp w's rows are red[w]; otherwise the tile's rows are the sum over the warps.
  for (int idx = threadIdx.x; idx < (WIDE ? kWarps : 1) * kRows * kCols; idx += kThreads) {
    const int tile = WIDE ? idx / (kRows * kCols) : 0;
    const int r = idx % kRows;
    const int tok = (idx / kRows) % kCols;
    const int row = (WIDE ? (blockIdx.x * kWarps + tile) * kRows : row0) + r;
    if (row >= p.n || tok >= p.m) continue;
    float s = 0.0f;
    if (WIDE) {
      s = red[tile][r][tok];
    } else {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) s += red[w][r][tok];
    }
    if constexpr (NORM) {
      // WIDE: every warp read all of x; otherwise the warps' chunks partition it. The same formula as rms_norm.
      float q = 0.0f;
      if (WIDE) {
        q = sumsq[tile][tok];
      } else {
#pragma unroll
        for (int w = 0; w < kWarps; ++w) q += sumsq[w][tok];
      }
      s *= 1.0f / sqrtf(q / static_cast<float>(p.k) + p.x_norm_eps);
    }
    if (p.splits == 1) {
      store_out<OutT>(p.y, entry * p.stride_y + static_cast<int64_t>(tok) * p.ldy + row, s, p.beta, p.gate);
    } else {
      p.partial[((entry * p.splits + blockIdx.y) * p.m + tok) * p.n + row] = s;
    }
  }
}

template <typename OutT>
__global__ void skinny_reduce_kernel(const float* __restrict__ partial, int splits, int m, int n, void* y, int64_t ldy,
                                     int64_t stride_y, float beta, const bf16* gate) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t entry = blockIdx.y;
  if (idx >= static_cast<int64_t>(m) * n) return;
  const int tok = static_cast<int>(idx / n);
  const int row = static_cast<int>(idx % n);
  float s = 0.0f;
  for (int sp = 0; sp < splits; ++sp) s += partial[((entry * splits + sp) * m + tok) * n + row];
  store_out<OutT>(y, entry * stride_y + static_cast<int64_t>(tok) * ldy + row, s, beta, gate);
}

// ---- Row-streaming kernel (batch 1, m <= 4): a warp reads whole rows of W, 512 contiguous bytes per load
// instruction and 8 loads per lane in flight, so HBM sees long sequential bursts instead of the 64-byte
// pieces of 16 rows that the MMA fragment layout asks for. The dot products are fp32 FMAs (at m <= 4 they
// cost less than the bytes). K may be split over up to 8 warps of one block (small N), joined in shared
// memory: one launch, no workspace.

constexpr int kRowsThreads = 256;
constexpr int kRowsWarps = kRowsThreads / 32;
constexpr int kRowsPersistentThreads = 1024;

struct RowsParams {
  const bf16* x;
  int64_t ldx;
  const bf16* w;
  int64_t ldw;
  void* y;
  int64_t ldy;
  int m, n, k;
  int splits;       // warps sharing a row group (1, 2, 4, 8)
  int k_per_split;  // multiple of 8
  float beta;
  const bf16* gate;  // optional, as y (SkinnyGemmArgs::gate)
};

// One warp's R x NM dot products over k in [kb, ke) of rows row0 .. row0 + R - 1, summed over the warp.
template <int NM, int R>
__device__ __forceinline__ void rows_dot(const RowsParams& p, int row0, int kb, int ke, int lane, float (&acc)[R][NM]) {
  constexpr int U = 8 / R;  // 16-byte loads per row per lane in flight: R * U = 8
  const bf16* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wr[r] = p.w + static_cast<int64_t>(min(row0 + r, p.n - 1)) * p.ldw;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NM; ++t) acc[r][t] = 0.0f;

  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int k0 = kb + 8 * lane; k0 < ke; k0 += 256 * U) {
    uint4 wv[U][R], xv[U][NM];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      // Unconditional loads from a clamped address, masked afterwards: all of them issue before the FMAs.
      const int kk = k0 + 256 * u;
      const bool in = kk < ke;
      const int kc = in ? kk : kb;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint4 v = detail::ldcs16(wr[r] + kc);
        wv[u][r] = in ? v : zero;
      }
#pragma unroll
      for (int t = 0; t < NM; ++t) {
        const uint4 v = detail::ldg16(p.x + static_cast<int64_t>(t < p.m ? t : 0) * p.ldx + kc);
        xv[u][t] = in && t < p.m ? v : zero;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float xf[NM][8];
#pragma unroll
      for (int t = 0; t < NM; ++t) detail::unpack8(xv[u][t], xf[t]);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float wf[8];
        detail::unpack8(wv[u][r], wf);
#pragma unroll
        for (int t = 0; t < NM; ++t)
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[r][t] = fmaf(wf[j], xf[t][j], acc[r][t]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NM; ++t) acc[r][t] = detail::warp_sum(acc[r][t]);
}

template <int NM, int R, typename OutT>
__device__ __forceinline__ void rows_store(const RowsParams& p, int row0, int lane, const float (&acc)[R][NM]) {
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NM; ++t) {
      // Lane r * NM + t stores one output.
      if (lane == r * NM + t && row0 + r < p.n && t < p.m) {
        store_out<OutT>(p.y, static_cast<int64_t>(t) * p.ldy + row0 + r, acc[r][t], p.beta, p.gate);
      }
    }
}

template <int NM, int R, typename OutT, int THREADS>
__global__ void __launch_bounds__(THREADS) gemv_rows_kernel(RowsParams p) {
  constexpr int kW = THREADS / 32;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float acc[R][NM];
  if (p.splits == 1) {
    // Warps take row groups strided over the grid: one each when the grid covers them, several when
    // SkinnyConfig::max_blocks caps the grid.
    for (int row0 = (blockIdx.x * kW + warp) * R; row0 < p.n; row0 += gridDim.x * kW * R) {
      rows_dot<NM, R>(p, row0, 0, p.k, lane, acc);
      rows_store<NM, R, OutT>(p, row0, lane, acc);
    }
    return;
  }
  // K split over `splits` adjacent warps of the block, joined in shared memory.
  __shared__ float red[kW][R * NM];
  const int unit = blockIdx.x * kW + warp;
  const int split = unit % p.splits, row0 = unit / p.splits * R;
  const int kb = split * p.k_per_split;
  rows_dot<NM, R>(p, row0, kb, min(p.k, kb + p.k_per_split), lane, acc);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < NM; ++t) red[warp][r * NM + t] = acc[r][t];
  }
  __syncthreads();
  if (split != 0 || row0 >= p.n) return;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NM; ++t) {
      float s = 0.0f;
      for (int j = 0; j < p.splits; ++j) s += red[warp + j][r * NM + t];
      acc[r][t] = s;
    }
  rows_store<NM, R, OutT>(p, row0, lane, acc);
}

template <int NM, int R>
void launch_rows(cudaStream_t stream, const RowsParams& p, OutType y_type, unsigned blocks) {
  with_out_type(y_type, [&](auto out) {
    gemv_rows_kernel<NM, R, typename decltype(out)::type, kRowsThreads><<<blocks, kRowsThreads, 0, stream>>>(p);
  });
  KIMIRT_CUDA_CHECK_LAUNCH();
}

// The capped grid (SkinnyConfig::max_blocks): 1024-thread blocks, one token, two rows per warp, each block
// alone on its SM, so that the grid keeps exactly `blocks` SMs (the layer plans the attention around the
// rest). Today the registers see to that: this instance uses 64 per thread without spilling (ptxas -v, CUDA
// 13.0; more tokens or one row per warp spill), and 64 x 1024 is the whole register file. Should a compiler
// need fewer, smem_for_one_block_per_sm reserves shared memory instead.
template <typename OutT>
const void* rows_persistent_kernel() {
  return reinterpret_cast<const void*>(gemv_rows_kernel<1, 2, OutT, kRowsPersistentThreads>);
}

void launch_rows_persistent(cudaStream_t stream, const RowsParams& p, OutType y_type, unsigned blocks) {
  with_out_type(y_type, [&](auto out) {
    using OutT = typename decltype(out)::type;
    const int smem = smem_for_one_block_per_sm(rows_persistent_kernel<OutT>(), kRowsPersistentThreads);
    gemv_rows_kernel<1, 2, OutT, kRowsPersistentThreads><<<blocks, kRowsPersistentThreads, smem, stream>>>(p);
  });
  KIMIRT_CUDA_CHECK_LAUNCH();
}

// Rows per warp and K splits for shapes the dispatch table does not list, from the H200 sweep of the K3
// decode shapes (kimirt-bench --only gemm): long rows of wide weights want one warp per 2 rows (enough
// warps in flight, few reductions); narrow weights want K split so that ~1600 warps stream.
SkinnyConfig choose_rows_config(int64_t n, int64_t k, int sm_count) {
  (void)k;
  SkinnyConfig c;
  c.kernel = SkinnyConfig::Kernel::kRows;
  c.splits = 1;
  if (n >= 8192) {
    c.rows_per_warp = 2;
  } else if (n >= 4096) {
    c.rows_per_warp = 1;
  } else if (n >= 2048) {
    c.rows_per_warp = 2;
  } else {
    c.rows_per_warp = 1;
    const int64_t want = static_cast<int64_t>(std::max(sm_count, 1)) * 12;
    while (n * c.splits < want && c.splits < 8) c.splits *= 2;
  }
  return c;
}

void run_rows(cudaStream_t stream, const SkinnyGemmArgs& a, SkinnyConfig c) {
  RowsParams p{
      a.x,      a.ldx, a.w,    a.ldw, a.y, a.ldy, static_cast<int>(a.m), static_cast<int>(a.n), static_cast<int>(a.k),
      c.splits, 0,     a.beta, a.gate};
  p.k_per_split = static_cast<int>((a.k / c.splits + 7) / 8 * 8);
  const int64_t groups = (a.n + c.rows_per_warp - 1) / c.rows_per_warp;
  const int64_t warps = groups * c.splits;
  if (c.max_blocks > 0) {
    const int64_t per_block = kRowsPersistentThreads / 32;
    launch_rows_persistent(stream, p, a.y_type,
                           static_cast<unsigned>(std::min<int64_t>(c.max_blocks, (warps + per_block - 1) / per_block)));
    return;
  }
  const unsigned blocks = static_cast<unsigned>((warps + kRowsWarps - 1) / kRowsWarps);
  const int nm = a.m == 1 ? 1 : (a.m == 2 ? 2 : 4);
  if (c.rows_per_warp == 1) {
    if (nm == 1) launch_rows<1, 1>(stream, p, a.y_type, blocks);
    if (nm == 2) launch_rows<2, 1>(stream, p, a.y_type, blocks);
    if (nm == 4) launch_rows<4, 1>(stream, p, a.y_type, blocks);
  } else {
    if (nm == 1) launch_rows<1, 2>(stream, p, a.y_type, blocks);
    if (nm == 2) launch_rows<2, 2>(stream, p, a.y_type, blocks);
    if (nm == 4) launch_rows<4, 2>(stream, p, a.y_type, blocks);
  }
}

struct Split {
  int splits;
  int k_per_split;
};

bool wide_rows(int64_t k) { return k <= 256; }

Split choose_split(int64_t m, int64_t n, int64_t k, int64_t batch, int sm_count, uint64_t workspace_bytes) {
  const int64_t rows_per_block = wide_rows(k) ? kRows * kWarps : kRows;
  const int64_t row_blocks = (n + rows_per_block - 1) / rows_per_block * batch;
  const int64_t target_blocks = static_cast<int64_t>(std::max(sm_count, 1)) * 8;
  int64_t splits = (target_blocks + row_blocks - 1) / row_blocks;
  splits = std::clamp<int64_t>(splits, 1, std::max<int64_t>(1, k / 512));
  while (splits > 1 && static_cast<uint64_t>(batch * splits * m * n) * sizeof(float) > workspace_bytes) --splits;
  int64_t per = (k + splits - 1) / splits;
  per = (per + kChunk - 1) / kChunk * kChunk;
  splits = (k + per - 1) / per;
  return {static_cast<int>(splits), static_cast<int>(per)};
}

template <int NT, bool WIDE, bool NORM>
void launch(cudaStream_t stream, const Params& p, OutType y_type, dim3 grid) {
  with_out_type(y_type, [&](auto out) {
    skinny_kernel<NT, typename decltype(out)::type, WIDE, NORM><<<grid, kThreads, 0, stream>>>(p);
  });
  KIMIRT_CUDA_CHECK_LAUNCH();
}

template <int NT>
void launch(cudaStream_t stream, const Params& p, OutType y_type, dim3 grid, bool wide) {
  if (p.x_norm) {
    wide ? launch<NT, true, true>(stream, p, y_type, grid) : launch<NT, false, true>(stream, p, y_type, grid);
  } else {
    wide ? launch<NT, true, false>(stream, p, y_type, grid) : launch<NT, false, false>(stream, p, y_type, grid);
  }
}

}  // namespace

bool skinny_gemm_supported(const SkinnyGemmArgs& a) {
  const bool batch_ok = a.batch == 1 || (a.batch > 1 && a.batch <= 65535 && a.stride_x % 8 == 0 &&
                                         a.stride_w % 8 == 0 && a.stride_x >= 0 && a.stride_w >= 0 && a.stride_y >= 0);
  return a.m >= 1 && a.m <= kSkinnyMaxM && a.n >= 1 && a.n < (1ll << 30) && a.k >= kChunk && a.k % kChunk == 0 &&
         a.k < (1ll << 30) && a.ldx >= a.k && a.ldw >= a.k && a.ldy >= a.n && a.ldx % 8 == 0 && a.ldw % 8 == 0 && a.x &&
         a.w && a.y && detail::aligned16(a.x) && detail::aligned16(a.w) && (a.beta == 0.0f || a.beta == 1.0f) &&
         batch_ok && (!a.gate || (a.y_type == OutType::kBF16 && a.beta == 0.0f)) &&
         (!a.x_norm || detail::aligned16(a.x_norm));
}

uint64_t skinny_gemm_workspace_bytes(int64_t m, int64_t n, int64_t k, int sm_count, int64_t batch) {
  const Split s = choose_split(m, n, k, batch, sm_count, ~0ull);
  return s.splits > 1 ? static_cast<uint64_t>(batch * s.splits * m * n) * sizeof(float) : 0;
}

int skinny_capped_blocks_per_sm(OutType y_type) {
  int blocks = 0;
  with_out_type(y_type, [&](auto out) {
    const void* kernel = rows_persistent_kernel<typename decltype(out)::type>();
    blocks =
        max_blocks_per_sm(kernel, kRowsPersistentThreads, smem_for_one_block_per_sm(kernel, kRowsPersistentThreads));
  });
  return blocks;
}

SkinnyConfig skinny_gemm_config(const SkinnyGemmArgs& a, int sm_count) {
  // The rows kernel pays fp32 FMAs per token; past 2 tokens (or for short rows) the MMA kernel is faster.
  if (a.batch == 1 && a.m <= 2 && a.k > 2048) return choose_rows_config(a.n, a.k, sm_count);
  SkinnyConfig c;
  c.kernel = SkinnyConfig::Kernel::kMma;
  return c;
}

void skinny_gemm(cudaStream_t stream, const SkinnyGemmArgs& a, void* workspace, uint64_t workspace_bytes,
                 int sm_count) {
  skinny_gemm(stream, a, workspace, workspace_bytes, sm_count, SkinnyConfig{});
}

void skinny_gemm(cudaStream_t stream, const SkinnyGemmArgs& a, void* workspace, uint64_t workspace_bytes, int sm_count,
                 const SkinnyConfig& config) {
  if (a.m == 0) return;
  KIMIRT_CUDA_REQUIRE(skinny_gemm_supported(a), "skinny_gemm: unsupported call m=", a.m, " n=", a.n, " k=", a.k,
                      " ldx=", a.ldx, " ldw=", a.ldw, " ldy=", a.ldy, " beta=", a.beta, " batch=", a.batch,
                      a.gate ? " gated" : "", a.x_norm ? " x_norm" : "",
                      " (needs 1 <= m <= 16, n < 2^30, k a multiple of 32 below 2^30, strides multiples of 8, x and w "
                      "16-byte aligned, a gate only with bf16 y and beta 0, x_norm 16-byte aligned)");
  SkinnyConfig c = config.kernel == SkinnyConfig::Kernel::kAuto ? skinny_gemm_config(a, sm_count) : config;
  if (a.x_norm && config.kernel == SkinnyConfig::Kernel::kAuto) c.kernel = SkinnyConfig::Kernel::kMma;
  if (c.kernel != SkinnyConfig::Kernel::kMma) {
    KIMIRT_CUDA_REQUIRE(!a.x_norm, "skinny_gemm: the rows kernel does not take x_norm (the mma kernel does)");
    KIMIRT_CUDA_REQUIRE(a.batch == 1 && a.m <= 4 && (c.rows_per_warp == 1 || c.rows_per_warp == 2) &&
                            (c.splits == 1 || c.splits == 2 || c.splits == 4 || c.splits == 8) && c.max_blocks >= 0 &&
                            (c.max_blocks == 0 || (a.m == 1 && c.rows_per_warp == 2 && c.splits == 1)) &&
                            a.n * c.splits < (1ll << 30),
                        "skinny_gemm: the rows kernel needs batch 1, m <= 4, 1 or 2 rows per warp, 1, 2, 4 or 8 "
                        "splits with n * splits < 2^30, and max_blocks >= 0; a capped grid (max_blocks) takes m = 1, 2 "
                        "rows per warp and one split (got batch ",
                        a.batch, ", m ", a.m, ", n ", a.n, ", ", c.rows_per_warp, " rows, ", c.splits,
                        " splits, max_blocks ", c.max_blocks, ")");
    run_rows(stream, a, c);
    return;
  }
  // A normed call's blocks each need all of K (a token's rms); without workspace choose_split gives one split.
  const Split s = choose_split(a.m, a.n, a.k, a.batch, sm_count, workspace && !a.x_norm ? workspace_bytes : 0);
  Params p{a.x,
           a.ldx,
           a.w,
           a.ldw,
           a.y,
           a.ldy,
           static_cast<int>(a.m),
           static_cast<int>(a.n),
           static_cast<int>(a.k),
           s.k_per_split,
           s.splits,
           a.beta,
           static_cast<float*>(workspace),
           a.stride_x,
           a.stride_w,
           a.stride_y,
           a.gate,
           a.x_norm,
           a.x_norm_eps};
  const bool wide = wide_rows(a.k);
  const int64_t rows_per_block = wide ? kRows * kWarps : kRows;
  const dim3 grid(static_cast<unsigned>((a.n + rows_per_block - 1) / rows_per_block), static_cast<unsigned>(s.splits),
                  static_cast<unsigned>(a.batch));
  if (a.m <= 8) {
    launch<1>(stream, p, a.y_type, grid, wide);
  } else {
    launch<2>(stream, p, a.y_type, grid, wide);
  }
  if (s.splits > 1) {
    const int64_t total = a.m * a.n;
    const int threads = 256;
    const dim3 blocks(static_cast<unsigned>((total + threads - 1) / threads), static_cast<unsigned>(a.batch));
    with_out_type(a.y_type, [&](auto out) {
      skinny_reduce_kernel<typename decltype(out)::type>
          <<<blocks, threads, 0, stream>>>(p.partial, s.splits, p.m, p.n, a.y, a.ldy, a.stride_y, a.beta, a.gate);
    });
    KIMIRT_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace kimirt::cuda
