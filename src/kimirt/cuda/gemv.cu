// Skinny GEMM (M ≤ 16) on tensor cores, bandwidth-bound on W.
//
// Fragment trick: the order in which an MMA sums over k does not matter as long as W and x use the same
// order. Lane (g = lane / 4, t = lane % 4) loads 16 contiguous bytes (k = 8t..8t+7 of a 32-wide chunk)
// from W rows g and g + 8 and from token row g, and feeds them to two m16n8k16 MMAs: physical k 8t..8t+3
// play the logical k {2t, 2t+1, 2t+8, 2t+9} of the first MMA, 8t+4..8t+7 those of the second. Every load
// is a full 16-byte vector and every 64-byte row segment is read by four adjacent lanes.
#include <algorithm>

#include "kimirt/cuda/check.h"
#include "kimirt/cuda/device_utils.cuh"
#include "kimirt/cuda/gemv.h"

namespace kimirt::cuda {
namespace {

using detail::bf16;

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
};

template <typename OutT>
__device__ __forceinline__ void store_out(void* y, int64_t index, float v, float beta) {
  OutT* p = static_cast<OutT*>(y) + index;
  if constexpr (sizeof(OutT) == 4) {
    if (beta != 0.0f) v += *p;
    *p = v;
  } else {
    if (beta != 0.0f) v += __bfloat162float(*p);
    *p = __float2bfloat16_rn(v);
  }
}

template <int NT, typename OutT>
__global__ void __launch_bounds__(kThreads) skinny_kernel(Params p) {
  constexpr int kCols = 8 * NT;
  __shared__ float red[kWarps][kRows][kCols + 1];
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int row0 = blockIdx.x * kRows;
  const int64_t entry = blockIdx.z;
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
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int kk = k_begin + kChunk * warp; kk < k_end; kk += kChunk * kWarps * kUnroll) {
    uint4 wl[kUnroll], wh[kUnroll], xx[kUnroll][NT];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      // Loads are unconditional (from a clamped, valid address) and masked afterwards, so the compiler
      // issues all of them before the first MMA instead of branching around each.
      const int kc_raw = kk + u * kChunk * kWarps;
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
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
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
  __syncthreads();
  for (int idx = threadIdx.x; idx < kRows * kCols; idx += kThreads) {
    const int r = idx % kRows;
    const int tok = idx / kRows;
    const int row = row0 + r;
    if (row >= p.n || tok >= p.m) continue;
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += red[w][r][tok];
    if (p.splits == 1) {
      store_out<OutT>(p.y, entry * p.stride_y + static_cast<int64_t>(tok) * p.ldy + row, s, p.beta);
    } else {
      p.partial[((entry * p.splits + blockIdx.y) * p.m + tok) * p.n + row] = s;
    }
  }
}

template <typename OutT>
__global__ void skinny_reduce_kernel(const float* __restrict__ partial, int splits, int m, int n, void* y, int64_t ldy,
                                     int64_t stride_y, float beta) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t entry = blockIdx.y;
  if (idx >= static_cast<int64_t>(m) * n) return;
  const int tok = static_cast<int>(idx / n);
  const int row = static_cast<int>(idx % n);
  float s = 0.0f;
  for (int sp = 0; sp < splits; ++sp) s += partial[((entry * splits + sp) * m + tok) * n + row];
  store_out<OutT>(y, entry * stride_y + static_cast<int64_t>(tok) * ldy + row, s, beta);
}

struct Split {
  int splits;
  int k_per_split;
};

Split choose_split(int64_t m, int64_t n, int64_t k, int64_t batch, int sm_count, uint64_t workspace_bytes) {
  const int64_t row_blocks = (n + kRows - 1) / kRows * batch;
  const int64_t target_blocks = static_cast<int64_t>(std::max(sm_count, 1)) * 8;
  int64_t splits = (target_blocks + row_blocks - 1) / row_blocks;
  splits = std::clamp<int64_t>(splits, 1, std::max<int64_t>(1, k / 512));
  while (splits > 1 && static_cast<uint64_t>(batch * splits * m * n) * sizeof(float) > workspace_bytes) --splits;
  int64_t per = (k + splits - 1) / splits;
  per = (per + kChunk - 1) / kChunk * kChunk;
  splits = (k + per - 1) / per;
  return {static_cast<int>(splits), static_cast<int>(per)};
}

template <int NT>
void launch(cudaStream_t stream, const Params& p, OutType y_type, dim3 grid) {
  if (y_type == OutType::kF32) {
    skinny_kernel<NT, float><<<grid, kThreads, 0, stream>>>(p);
  } else {
    skinny_kernel<NT, bf16><<<grid, kThreads, 0, stream>>>(p);
  }
  KIMIRT_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool skinny_gemm_supported(const SkinnyGemmArgs& a) {
  const bool batch_ok = a.batch == 1 || (a.batch > 1 && a.batch <= 65535 && a.stride_x % 8 == 0 &&
                                         a.stride_w % 8 == 0 && a.stride_x >= 0 && a.stride_w >= 0 && a.stride_y >= 0);
  return a.m >= 1 && a.m <= kSkinnyMaxM && a.n >= 1 && a.n < (1ll << 31) && a.k >= kChunk && a.k % kChunk == 0 &&
         a.k < (1ll << 31) && a.ldx >= a.k && a.ldw >= a.k && a.ldy >= a.n && a.ldx % 8 == 0 && a.ldw % 8 == 0 && a.x &&
         a.w && a.y && detail::aligned16(a.x) && detail::aligned16(a.w) && (a.beta == 0.0f || a.beta == 1.0f) &&
         batch_ok;
}

uint64_t skinny_gemm_workspace_bytes(int64_t m, int64_t n, int64_t k, int sm_count, int64_t batch) {
  const Split s = choose_split(m, n, k, batch, sm_count, ~0ull);
  return s.splits > 1 ? static_cast<uint64_t>(batch * s.splits * m * n) * sizeof(float) : 0;
}

void skinny_gemm(cudaStream_t stream, const SkinnyGemmArgs& a, void* workspace, uint64_t workspace_bytes,
                 int sm_count) {
  if (a.m == 0) return;
  KIMIRT_CUDA_REQUIRE(skinny_gemm_supported(a), "skinny_gemm: unsupported call m=", a.m, " n=", a.n, " k=", a.k,
                      " ldx=", a.ldx, " ldw=", a.ldw, " ldy=", a.ldy, " beta=", a.beta, " batch=", a.batch,
                      " (needs 1 <= m <= 16, k a multiple of 32, strides multiples of 8, x and w 16-byte aligned)");
  const Split s = choose_split(a.m, a.n, a.k, a.batch, sm_count, workspace ? workspace_bytes : 0);
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
           a.stride_y};
  const dim3 grid(static_cast<unsigned>((a.n + kRows - 1) / kRows), static_cast<unsigned>(s.splits),
                  static_cast<unsigned>(a.batch));
  if (a.m <= 8) {
    launch<1>(stream, p, a.y_type, grid);
  } else {
    launch<2>(stream, p, a.y_type, grid);
  }
  if (s.splits > 1) {
    const int64_t total = a.m * a.n;
    const int threads = 256;
    const dim3 blocks(static_cast<unsigned>((total + threads - 1) / threads), static_cast<unsigned>(a.batch));
    if (a.y_type == OutType::kF32) {
      skinny_reduce_kernel<float>
          <<<blocks, threads, 0, stream>>>(p.partial, s.splits, p.m, p.n, a.y, a.ldy, a.stride_y, a.beta);
    } else {
      skinny_reduce_kernel<bf16>
          <<<blocks, threads, 0, stream>>>(p.partial, s.splits, p.m, p.n, a.y, a.ldy, a.stride_y, a.beta);
    }
    KIMIRT_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace kimirt::cuda
