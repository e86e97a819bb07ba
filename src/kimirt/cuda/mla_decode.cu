// Absorbed MLA decode attention on tensor cores, split over the context (flash-decoding).
//
// Block = (head group of ≤ 64 heads, context chunk, sequence); 8 warps: warp w owns m-tile (w & 3) of 16
// heads and half (w >> 2). Per 32-row cache tile (a three-stage cp.async pipeline):
//   S:  warp computes scores of its 16 heads × 16 rows (its half of the tile) over all 576 dims;
//   softmax: the two warps of an m-tile exchange row maxima through shared memory, write P (bf16) there;
//   O:  warp accumulates its 16 heads × 256 output columns (its half of the 512) over all 32 rows, with the
//       V fragments read by ldmatrix.trans straight from the cached rows' first 512 values.
#include <algorithm>

#include "kimirt/cuda/check.h"
#include "kimirt/cuda/device_utils.cuh"
#include "kimirt/cuda/kernel_attr.h"
#include "kimirt/cuda/mla_decode.h"

namespace kimirt::cuda {
namespace {

using detail::bf16;

constexpr int kTile = 32;
constexpr int kStages = 3;  // cache tiles in flight: one computed on, two loading
constexpr int kMaxHeads = 64;
constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr int kRowStride = kMlaRow + 8;  // conflict-free fragment loads and ldmatrix rows
constexpr int kPStride = kTile + 8;
constexpr int kQElems = kMaxHeads * kRowStride;
constexpr int kKElems = kTile * kRowStride;
constexpr int kPElems = kMaxHeads * kPStride;
constexpr int kSmemBytes = (kQElems + kStages * kKElems + kPElems) * 2 + 4 * kMaxHeads * 4;
constexpr float kLog2e = 1.4426950408889634f;

struct Params {
  MlaDecodeArgs a;
  int splits, chunk, heads_per_group;
  float scale_log2;
  bf16* o_part;  // [batch][splits][heads][512]
  float* lse;    // [batch][splits][heads], log2 domain
};

__device__ __forceinline__ uint32_t lds32(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }

__global__ void __launch_bounds__(kThreads, 1) mla_decode_kernel(Params prm) {
  const MlaDecodeArgs& a = prm.a;
  extern __shared__ __align__(16) bf16 smem[];
  bf16* qs = smem;
  bf16* ks = qs + kQElems;
  bf16* ps = ks + kStages * kKElems;
  float* red_max = reinterpret_cast<float*>(ps + kPElems);  // [2][64]
  float* red_l = red_max + 2 * kMaxHeads;                   // [2][64]

  const int group = blockIdx.x, split = blockIdx.y, b = blockIdx.z;
  const int h0 = group * prm.heads_per_group;
  const int nh = min(prm.heads_per_group, a.heads - h0);
  const int mt = (nh + 15) / 16;
  const int seq_len = a.seq_lens[b];
  const int k_start = split * prm.chunk;
  const int k_end = split == prm.splits - 1 ? seq_len : min(seq_len, k_start + prm.chunk);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int mi = warp & 3, half = warp >> 2;
  const bool active = mi < mt;

  if (k_start >= k_end) {
    // Nothing to attend in this chunk: mark it empty for the merge (or write zeros when unsplit).
    if (prm.splits > 1) {
      for (int h = tid; h < nh; h += kThreads)
        prm.lse[(static_cast<int64_t>(b) * prm.splits + split) * a.heads + h0 + h] = -INFINITY;
    } else {
      for (int i = tid; i < nh * kMlaLatent; i += kThreads) {
        a.out[b * a.ld_out + static_cast<int64_t>(h0 + i / kMlaLatent) * kMlaLatent + i % kMlaLatent] =
            __float2bfloat16_rn(0.0f);
      }
    }
    return;
  }

  for (int i = tid; i < kMaxHeads * (kMlaRow / 8); i += kThreads) {
    const int r = i / (kMlaRow / 8), c = i % (kMlaRow / 8);
    const bool ok = r < nh;
    const bf16* src =
        a.q + static_cast<int64_t>(b) * a.ld_q + static_cast<int64_t>(h0 + (ok ? r : 0)) * kMlaRow + c * 8;
    detail::cp_async16(qs + r * kRowStride + c * 8, src, ok);
  }
  const int32_t* table = a.block_table + static_cast<int64_t>(b) * a.ld_block_table;
  auto load_tile = [&](int tile_start, int stage) {
    bf16* dst = ks + stage * kKElems;
    for (int i = tid; i < kTile * (kMlaRow / 8); i += kThreads) {
      const int r = i / (kMlaRow / 8), c = i % (kMlaRow / 8);
      const int key = tile_start + r;
      const bool ok = key < k_end;
      const bf16* src = a.cache;
      if (ok) {
        const int64_t page = table[key / a.page_size];
        src = a.cache + (page * a.page_size + key % a.page_size) * kMlaRow + c * 8;
      }
      detail::cp_async16(dst + r * kRowStride + c * 8, src, ok);
    }
  };
  const int n_tiles = (k_end - k_start + kTile - 1) / kTile;
  // Group g of cp.async holds tile g (the first also Q); a group is committed every iteration, empty past
  // the last tile, so "all but the newest kStages - 1 groups" is always "up to the current tile".
  load_tile(k_start, 0);
  detail::cp_async_commit();
  if (n_tiles > 1) load_tile(k_start + kTile, 1);
  detail::cp_async_commit();

  float o[kMlaLatent / 2 / 8][4];
#pragma unroll
  for (int n = 0; n < kMlaLatent / 2 / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.0f, 0.0f};
  const int row_lo = mi * 16 + g;

  for (int tile = 0; tile < n_tiles; ++tile) {
    const int stage = tile % kStages;
    const int tile_start = k_start + tile * kTile;
    if (tile + 2 < n_tiles) load_tile(tile_start + 2 * kTile, (tile + 2) % kStages);
    detail::cp_async_commit();
    detail::cp_async_wait<kStages - 1>();
    __syncthreads();
    const bf16* kt = ks + stage * kKElems;

    float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
    if (active) {
#pragma unroll 4
      for (int kk = 0; kk < kMlaRow / 16; ++kk) {
        const bf16* q0 = qs + row_lo * kRowStride + kk * 16 + 2 * t;
        const uint32_t a0 = lds32(q0), a1 = lds32(q0 + 8 * kRowStride), a2 = lds32(q0 + 8),
                       a3 = lds32(q0 + 8 * kRowStride + 8);
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          const bf16* kp = kt + (half * 16 + n * 8 + g) * kRowStride + kk * 16 + 2 * t;
          detail::mma_bf16_16816(s[n], a0, a1, a2, a3, lds32(kp), lds32(kp + 8));
        }
      }
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = tile_start + half * 16 + n * 8 + 2 * t + (e & 1);
          s[n][e] = key < k_end ? s[n][e] * prm.scale_log2 : -INFINITY;
          mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      }
      if (t == 0) {
        red_max[half * kMaxHeads + row_lo] = mx[0];
        red_max[half * kMaxHeads + row_lo + 8] = mx[1];
      }
    }
    __syncthreads();
    if (active) {
      float alpha[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = row_lo + 8 * r;
        const float m_tile = fmaxf(red_max[row], red_max[kMaxHeads + row]);
        const float m_new = fmaxf(m_run[r], m_tile);
        alpha[r] = m_new == -INFINITY ? 1.0f : exp2f(m_run[r] - m_new);
        m_run[r] = m_new;
      }
      float rowsum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float m = m_run[e >> 1];
          const float p = m == -INFINITY ? 0.0f : exp2f(s[n][e] - m);
          s[n][e] = p;
          rowsum[e >> 1] += p;
        }
        const int col = half * 16 + n * 8 + 2 * t;
        *reinterpret_cast<uint32_t*>(ps + row_lo * kPStride + col) = detail::pack_bf16x2(s[n][0], s[n][1]);
        *reinterpret_cast<uint32_t*>(ps + (row_lo + 8) * kPStride + col) = detail::pack_bf16x2(s[n][2], s[n][3]);
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * alpha[r] + rowsum[r];
#pragma unroll
      for (int n = 0; n < kMlaLatent / 2 / 8; ++n) {
        o[n][0] *= alpha[0];
        o[n][1] *= alpha[0];
        o[n][2] *= alpha[1];
        o[n][3] *= alpha[1];
      }
    }
    __syncthreads();
    if (active) {
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        const bf16* pp = ps + row_lo * kPStride + kk * 16 + 2 * t;
        const uint32_t p0 = lds32(pp), p1 = lds32(pp + 8 * kPStride), p2 = lds32(pp + 8),
                       p3 = lds32(pp + 8 * kPStride + 8);
        const int lm = lane >> 3, lr = lane & 7;
#pragma unroll
        for (int np = 0; np < kMlaLatent / 2 / 16; ++np) {
          const bf16* vp =
              kt + (kk * 16 + lr + 8 * (lm & 1)) * kRowStride + half * (kMlaLatent / 2) + np * 16 + 8 * (lm >> 1);
          uint32_t vb[4];
          detail::ldmatrix_x4_trans(vb, vp);
          detail::mma_bf16_16816(o[2 * np], p0, p1, p2, p3, vb[0], vb[1]);
          detail::mma_bf16_16816(o[2 * np + 1], p0, p1, p2, p3, vb[2], vb[3]);
        }
      }
    }
    __syncthreads();
  }

  if (active) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
      l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
    }
    if (t == 0) {
      red_l[half * kMaxHeads + row_lo] = l_run[0];
      red_l[half * kMaxHeads + row_lo + 8] = l_run[1];
    }
  }
  __syncthreads();
  if (!active) return;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row_lo + 8 * r;
    if (row >= nh) continue;
    const float l = red_l[row] + red_l[kMaxHeads + row];
    const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;
    const int head = h0 + row;
    bf16* dst;
    if (prm.splits == 1) {
      dst = a.out + static_cast<int64_t>(b) * a.ld_out + static_cast<int64_t>(head) * kMlaLatent;
    } else {
      const int64_t slot = (static_cast<int64_t>(b) * prm.splits + split) * a.heads + head;
      dst = prm.o_part + slot * kMlaLatent;
      if (half == 0 && t == 0) prm.lse[slot] = l > 0.0f ? m_run[r] + log2f(l) : -INFINITY;
    }
#pragma unroll
    for (int n = 0; n < kMlaLatent / 2 / 8; ++n) {
      const int col = half * (kMlaLatent / 2) + n * 8 + 2 * t;
      *reinterpret_cast<uint32_t*>(dst + col) = detail::pack_bf16x2(o[n][2 * r] * inv_l, o[n][2 * r + 1] * inv_l);
    }
  }
}

// Merge of the chunks: out = Σ_s 2^(lse_s − M) · o_s / Σ_s 2^(lse_s − M). One block per (head, sequence).
__global__ void mla_decode_merge_kernel(const bf16* __restrict__ o_part, const float* __restrict__ lse, int splits,
                                        int heads, bf16* __restrict__ out, int64_t ld_out) {
  const int head = blockIdx.x, b = blockIdx.y;
  const int64_t base = static_cast<int64_t>(b) * splits * heads + head;
  float mx = -INFINITY;
  for (int s = 0; s < splits; ++s) mx = fmaxf(mx, lse[base + static_cast<int64_t>(s) * heads]);
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  float denom = 0.0f;
  const int col = threadIdx.x * 4;
  if (mx != -INFINITY) {
    for (int s = 0; s < splits; ++s) {
      const int64_t slot = base + static_cast<int64_t>(s) * heads;
      const float l = lse[slot];
      if (l == -INFINITY) continue;
      const float w = exp2f(l - mx);
      denom += w;
      const uint2 raw = *reinterpret_cast<const uint2*>(o_part + slot * kMlaLatent + col);
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
      const float2 x0 = __bfloat1622float2(h[0]), x1 = __bfloat1622float2(h[1]);
      acc[0] += w * x0.x;
      acc[1] += w * x0.y;
      acc[2] += w * x1.x;
      acc[3] += w * x1.y;
    }
  }
  const float inv = denom > 0.0f ? 1.0f / denom : 0.0f;
  __nv_bfloat162 r[2] = {__floats2bfloat162_rn(acc[0] * inv, acc[1] * inv),
                         __floats2bfloat162_rn(acc[2] * inv, acc[3] * inv)};
  *reinterpret_cast<uint2*>(out + static_cast<int64_t>(b) * ld_out + static_cast<int64_t>(head) * kMlaLatent + col) =
      *reinterpret_cast<const uint2*>(r);
}

uint64_t part_bytes(int batch, int splits, int heads) {
  return (static_cast<uint64_t>(batch) * splits * heads * kMlaLatent * 2 + 255) / 256 * 256;
}

}  // namespace

MlaDecodePlan plan_mla_decode(int batch, int heads, int max_seq_len, int sm_count) {
  KIMIRT_CUDA_REQUIRE(batch >= 0 && heads > 0 && max_seq_len >= 0, "plan_mla_decode: batch ", batch, ", heads ", heads,
                      ", max_seq_len ", max_seq_len);
  MlaDecodePlan p;
  p.head_groups = (heads + kMaxHeads - 1) / kMaxHeads;
  p.heads_per_group = (heads + p.head_groups - 1) / p.head_groups;
  const int64_t blocks_per_split = std::max<int64_t>(1, static_cast<int64_t>(batch) * p.head_groups);
  int64_t splits = (std::max(sm_count, 1) + blocks_per_split - 1) / blocks_per_split;
  splits = std::clamp<int64_t>(splits, 1, std::max<int64_t>(1, (max_seq_len + 127) / 128));
  int64_t chunk = (std::max(max_seq_len, 1) + splits - 1) / splits;
  chunk = (chunk + kTile - 1) / kTile * kTile;
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
  KIMIRT_CUDA_REQUIRE(a.page_size > 0 && a.page_size % kTile == 0, "mla_decode: page_size ", a.page_size,
                      " must be a positive multiple of ", kTile);
  KIMIRT_CUDA_REQUIRE(a.q && a.cache && a.block_table && a.seq_lens && a.out, "mla_decode: null pointer");
  KIMIRT_CUDA_REQUIRE(a.ld_q >= int64_t{a.heads} * kMlaRow && a.ld_q % 8 == 0, "mla_decode: ld_q ", a.ld_q,
                      " must be >= heads*576 and a multiple of 8");
  KIMIRT_CUDA_REQUIRE(a.ld_out >= int64_t{a.heads} * kMlaLatent && a.ld_out % 8 == 0, "mla_decode: ld_out ", a.ld_out,
                      " must be >= heads*512 and a multiple of 8");
  KIMIRT_CUDA_REQUIRE(a.ld_block_table > 0, "mla_decode: ld_block_table ", a.ld_block_table);
  KIMIRT_CUDA_REQUIRE(detail::aligned16(a.q) && detail::aligned16(a.cache) && detail::aligned16(a.out),
                      "mla_decode: q, cache and out must be 16-byte aligned");
  KIMIRT_CUDA_REQUIRE(plan.splits >= 1 && plan.splits <= 65535 && plan.chunk > 0 && plan.chunk % kTile == 0 &&
                          plan.head_groups * plan.heads_per_group >= a.heads && plan.heads_per_group <= kMaxHeads &&
                          plan.heads_per_group > 0,
                      "mla_decode: plan (splits ", plan.splits, ", chunk ", plan.chunk, ", head groups ",
                      plan.head_groups, " x ", plan.heads_per_group, ") does not fit ", a.heads,
                      " heads; use plan_mla_decode");
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
  ensure_dynamic_smem(reinterpret_cast<const void*>(&mla_decode_kernel), kSmemBytes);
  const dim3 grid(static_cast<unsigned>(plan.head_groups), static_cast<unsigned>(plan.splits),
                  static_cast<unsigned>(a.batch));
  mla_decode_kernel<<<grid, kThreads, kSmemBytes, stream>>>(p);
  KIMIRT_CUDA_CHECK_LAUNCH();
  if (plan.splits > 1) {
    mla_decode_merge_kernel<<<dim3(static_cast<unsigned>(a.heads), static_cast<unsigned>(a.batch)), kMlaLatent / 4, 0,
                              stream>>>(p.o_part, p.lse, plan.splits, a.heads, a.out, a.ld_out);
    KIMIRT_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace kimirt::cuda
