// Flash-attention forward for MLA prefill, two kernels (mla_prefill.h): kWgmma (mla_prefill_wgmma.cuh) and,
// here, kMma (FA2 structure): a block takes 64 queries of one head of one sequence (4 warps × 16 rows),
// streams 64-key tiles of K and V through double-buffered shared memory with cp.async, keeps Q fragments in
// registers, S and O in fp32 MMA accumulators, and rescales O by the online-softmax correction per tile.
#include "kimirt/cuda/mla_prefill.h"

#include <cmath>

#include "kimirt/cuda/check.h"
#include "kimirt/cuda/device_utils.cuh"
#include "kimirt/cuda/kernel_attr.h"
#include "kimirt/cuda/mla_prefill_wgmma.cuh"
#include "kimirt/cuda/tensor_map.h"

namespace kimirt::cuda {
namespace {

using detail::bf16;

constexpr int kDqk = 192, kDnope = 128, kDv = 128;  // q/k head dim = nope 128 + rope 64
constexpr int kBM = 64, kBN = 64, kWarps = 4, kThreads = kWarps * 32;
constexpr int kQStride = kDqk + 8;  // +8 elements: rows land in distinct banks
constexpr int kVStride = kDv + 8;
constexpr int kQElems = kBM * kQStride;
constexpr int kKElems = kBN * kQStride;
constexpr int kVElems = kBN * kVStride;
constexpr int kSmemBytes = (kQElems + 2 * kKElems + 2 * kVElems) * 2;
constexpr float kLog2e = 1.4426950408889634f;

using mla_prefill_wgmma::Params;  // both kernels take the same arguments

__device__ __forceinline__ uint32_t lds32(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }

__global__ void __launch_bounds__(kThreads) mla_prefill_kernel(Params prm) {
  const MlaPrefillArgs& a = prm.a;
  extern __shared__ __align__(16) bf16 smem[];
  bf16* qs = smem;
  bf16* ks = qs + kQElems;      // [2][kBN][kQStride]
  bf16* vs = ks + 2 * kKElems;  // [2][kBN][kVStride]

  const int b = blockIdx.z, head = blockIdx.y;
  const int q_begin = a.cu_q[b], tq = a.cu_q[b + 1] - q_begin;
  const int k_begin = a.cu_k[b], tk = a.cu_k[b + 1] - k_begin;
  const int m0 = blockIdx.x * kBM;
  if (m0 >= tq) return;
  const int offset = a.causal ? tk - tq : tk;  // position of query 0 (past every key when not causal)
  const int last_q = min(m0 + kBM, tq) - 1;
  // 0 with no key: a non-causal pass over cached rows this sequence has none of, or bad cu_k (causal, Tk < Tq).
  const int n_keys = max(0, min(tk, offset + last_q + 1));
  const int n_tiles = (n_keys + kBN - 1) / kBN;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;

  // Q tile: 64 rows × 24 chunks of 8.
  for (int i = tid; i < kBM * (kDqk / 8); i += kThreads) {
    const int r = i / (kDqk / 8), c = i % (kDqk / 8);
    const bool ok = m0 + r < tq;
    const bf16* src = a.q + static_cast<int64_t>(q_begin + (ok ? m0 + r : 0)) * a.ld_q + head * kDqk + c * 8;
    detail::cp_async16(qs + r * kQStride + c * 8, src, ok);
  }
  auto load_kv = [&](int tile, int stage) {
    bf16* kd = ks + stage * kKElems;
    bf16* vd = vs + stage * kVElems;
    for (int i = tid; i < kBN * (kDqk / 8); i += kThreads) {
      const int r = i / (kDqk / 8), c = i % (kDqk / 8);
      const int key = tile * kBN + r;
      const bool ok = key < tk;
      const int64_t tok = k_begin + (ok ? key : 0);
      const bf16* src = c < kDnope / 8 ? a.k_nope + tok * a.ld_k_nope + head * a.hs_k_nope + c * 8
                                       : a.k_pe + tok * a.ld_k_pe + (c - kDnope / 8) * 8;
      detail::cp_async16(kd + r * kQStride + c * 8, src, ok);
    }
    for (int i = tid; i < kBN * (kDv / 8); i += kThreads) {
      const int r = i / (kDv / 8), c = i % (kDv / 8);
      const int key = tile * kBN + r;
      const bool ok = key < tk;
      const int64_t tok = k_begin + (ok ? key : 0);
      detail::cp_async16(vd + r * kVStride + c * 8, a.v + tok * a.ld_v + head * a.hs_v + c * 8, ok);
    }
  };
  load_kv(0, 0);
  detail::cp_async_commit();

  float o[kDv / 8][4];
#pragma unroll
  for (int n = 0; n < kDv / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.0f, 0.0f};
  uint32_t qf[kDqk / 16][4];
  const int row_lo = warp * 16 + g;  // this thread's rows within the tile: row_lo and row_lo + 8
  const int qpos_lo = offset + m0 + row_lo;
  const int qpos_hi = qpos_lo + 8;

  for (int tile = 0; tile < n_tiles; ++tile) {
    const int stage = tile & 1;
    if (tile + 1 < n_tiles) {
      load_kv(tile + 1, stage ^ 1);
      detail::cp_async_commit();
      detail::cp_async_wait<1>();
    } else {
      detail::cp_async_wait<0>();
    }
    __syncthreads();
    if (tile == 0) {
#pragma unroll
      for (int kk = 0; kk < kDqk / 16; ++kk) {
        const bf16* q0 = qs + row_lo * kQStride + kk * 16 + 2 * t;
        qf[kk][0] = lds32(q0);
        qf[kk][1] = lds32(q0 + 8 * kQStride);
        qf[kk][2] = lds32(q0 + 8);
        qf[kk][3] = lds32(q0 + 8 * kQStride + 8);
      }
    }
    const bf16* kt = ks + stage * kKElems;
    const bf16* vt = vs + stage * kVElems;

    float s[kBN / 8][4];
#pragma unroll
    for (int n = 0; n < kBN / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kDqk / 16; ++kk) {
#pragma unroll
      for (int n = 0; n < kBN / 8; ++n) {
        const bf16* kp = kt + (n * 8 + g) * kQStride + kk * 16 + 2 * t;
        detail::mma_bf16_16816(s[n], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], lds32(kp), lds32(kp + 8));
      }
    }

    // Mask, scale into the log2 domain, online softmax per row.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kBN / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = tile * kBN + n * 8 + 2 * t + (e & 1);
        const int qpos = e < 2 ? qpos_lo : qpos_hi;
        const bool ok = key < tk && key <= qpos;
        s[n][e] = ok ? s[n][e] * prm.scale_log2 : -INFINITY;
        mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
      }
    }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m_run[r], mx[r]);
      alpha[r] = m_new == -INFINITY ? 1.0f : exp2f(m_run[r] - m_new);
      m_run[r] = m_new;
    }
    float rowsum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < kBN / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float m = m_run[e >> 1];
        const float p = m == -INFINITY ? 0.0f : exp2f(s[n][e] - m);
        s[n][e] = p;
        rowsum[e >> 1] += p;
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * alpha[r] + rowsum[r];
#pragma unroll
    for (int n = 0; n < kDv / 8; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }

    // O += P · V: P from the S accumulators (C layout == A layout of the next MMA), V via ldmatrix.trans.
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      const uint32_t p0 = detail::pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
      const uint32_t p1 = detail::pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
      const uint32_t p2 = detail::pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      const uint32_t p3 = detail::pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int np = 0; np < kDv / 16; ++np) {
        const int mi = lane >> 3, r = lane & 7;
        const bf16* vp = vt + (kk * 16 + r + 8 * (mi & 1)) * kVStride + np * 16 + 8 * (mi >> 1);
        uint32_t vb[4];
        detail::ldmatrix_x4_trans(vb, vp);
        detail::mma_bf16_16816(o[2 * np], p0, p1, p2, p3, vb[0], vb[1]);
        detail::mma_bf16_16816(o[2 * np + 1], p0, p1, p2, p3, vb[2], vb[3]);
      }
    }
    __syncthreads();  // the next iteration's prefetch overwrites this stage
  }
  // A block with no key tile (a sequence without keys in a non-causal pass, or bad cu_k) still has its first
  // copies in flight: they land before the block's shared memory is released.
  if (n_tiles == 0) detail::cp_async_wait<0>();

  mla_prefill_wgmma::store_rows(
      a, [&](int j, int e) { return o[j][e]; }, l_run, m_run, head, q_begin, m0 + row_lo, tq, 2 * t);
}

bool stride_ok(int64_t s) { return s > 0 && s % 8 == 0; }

// 16 threads per (token, head) row, 8 columns each. None returns before the __syncwarp: the row's lse is read by all
// 16 and rewritten by the first after a __syncwarp.
template <MlaMergeMode kMode>
__global__ void merge_kernel(const MlaPrefillMergeArgs m) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = idx / 16, rows = m.tokens * m.heads;
  const int c = static_cast<int>(idx % 16) * 8;
  const bool ok = row < rows;
  const int64_t token = ok ? row / m.heads : 0;
  const int head = ok ? static_cast<int>(row % m.heads) : 0;
  float p[8] = {};
  float lp = -INFINITY, la = -INFINITY;
  if (ok) {
    detail::unpack8(detail::load16(m.part + token * m.ld_part + head * kDv + c), p);
    lp = m.part_lse[token * m.ld_part_lse + head];
    if constexpr (kMode != MlaMergeMode::kFirst) la = m.acc_lse[row];
  }
  __syncwarp();
  if (!ok) return;
  float* acc = m.acc + row * kDv + c;
  if constexpr (kMode == MlaMergeMode::kFirst) {
    reinterpret_cast<float4*>(acc)[0] = make_float4(p[0], p[1], p[2], p[3]);
    reinterpret_cast<float4*>(acc)[1] = make_float4(p[4], p[5], p[6], p[7]);
    if (c == 0) m.acc_lse[row] = lp;
  } else {
    const float mx = fmaxf(la, lp);
    float wa = 0.0f, wp = 0.0f;
    if (mx != -INFINITY) wa = exp2f(la - mx), wp = exp2f(lp - mx);
    const float sum = wa + wp, inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    const float4 a0 = reinterpret_cast<const float4*>(acc)[0], a1 = reinterpret_cast<const float4*>(acc)[1];
    const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    float o[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i] = (wa * av[i] + wp * p[i]) * inv;
    if constexpr (kMode == MlaMergeMode::kAccumulate) {
      reinterpret_cast<float4*>(acc)[0] = make_float4(o[0], o[1], o[2], o[3]);
      reinterpret_cast<float4*>(acc)[1] = make_float4(o[4], o[5], o[6], o[7]);
      if (c == 0) m.acc_lse[row] = sum > 0.0f ? mx + log2f(sum) : -INFINITY;
    } else {
      if (m.gate) {
        float g[8];
        detail::unpack8(detail::load16(m.gate + token * m.ld_gate + head * kDv + c), g);
#pragma unroll
        for (int i = 0; i < 8; ++i) o[i] *= detail::sigmoid(g[i]);
      }
      uint4 packed;
      packed.x = detail::pack_bf16x2(o[0], o[1]);
      packed.y = detail::pack_bf16x2(o[2], o[3]);
      packed.z = detail::pack_bf16x2(o[4], o[5]);
      packed.w = detail::pack_bf16x2(o[6], o[7]);
      detail::store16(m.out + token * m.ld_out + head * kDv + c, packed);
    }
  }
}

}  // namespace

const char* mla_prefill_kernel_name(MlaPrefillKernel k) {
  switch (k) {
    case MlaPrefillKernel::kAuto:
      return "auto";
    case MlaPrefillKernel::kMma:
      return "mma";
    case MlaPrefillKernel::kWgmma:
      return "wgmma";
  }
  return "?";
}

namespace {

// kWgmma's launch: a tensor map per operand, each bounded by the rows the batch has (total_q, total_k) and
// by the columns its heads use, so that no copy reads past the caller's buffers (rows past a bound arrive as
// zeros, masked by the kernel).
void launch_wgmma(cudaStream_t stream, const MlaPrefillArgs& a, float scale_log2) {
  namespace pw = mla_prefill_wgmma;
  const auto map = [&](const char* name, const bf16* ptr, int64_t cols, int64_t ld, int64_t rows) {
    const uint64_t dims[2] = {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)};
    const uint64_t strides[1] = {static_cast<uint64_t>(ld) * 2};
    const uint32_t box[2] = {64, 64};
    return make_tensor_map(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, ptr, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B,
                           cat("mla_prefill: ", name));
  };
  const int64_t heads = a.heads;
  const CUtensorMap q_map = map("q", a.q, heads * kDqk, a.ld_q, a.total_q);
  const CUtensorMap k_map = map("k_nope", a.k_nope, (heads - 1) * a.hs_k_nope + kDnope, a.ld_k_nope, a.total_k);
  const CUtensorMap pe_map = map("k_pe", a.k_pe, kDqk - kDnope, a.ld_k_pe, a.total_k);
  const CUtensorMap v_map = map("v", a.v, (heads - 1) * a.hs_v + kDv, a.ld_v, a.total_k);
  const auto kernel = pw::mla_prefill_wgmma_kernel;
  ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), pw::kSmemBytes);
  // Query tiles vary fastest, so that the blocks running at once are few heads' and share their keys and values
  // through L2 (heads fastest: every block another head's, 7-18% slower, docs/PERF.md).
  const dim3 grid(static_cast<unsigned>((int64_t{a.max_q} + pw::kBM - 1) / pw::kBM), static_cast<unsigned>(a.heads),
                  static_cast<unsigned>(a.batch));
  kernel<<<grid, pw::kThreads, pw::kSmemBytes, stream>>>(q_map, k_map, pe_map, v_map, pw::Params{a, scale_log2});
  KIMIRT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void mla_prefill(cudaStream_t stream, const MlaPrefillArgs& a, MlaPrefillKernel kernel) {
  KIMIRT_CUDA_REQUIRE(a.batch >= 0 && a.heads > 0 && a.heads <= 65535 && a.max_q >= 0, "mla_prefill: batch ", a.batch,
                      ", heads ", a.heads, ", max_q ", a.max_q);
  if (a.batch == 0 || a.max_q == 0) return;
  KIMIRT_CUDA_REQUIRE(a.batch <= 65535, "mla_prefill: batch ", a.batch, " exceeds 65535 sequences");
  KIMIRT_CUDA_REQUIRE(a.q && a.k_nope && a.k_pe && a.v && a.out && a.cu_q && a.cu_k, "mla_prefill: null pointer");
  KIMIRT_CUDA_REQUIRE(stride_ok(a.ld_q) && a.ld_q >= int64_t{a.heads} * kDqk, "mla_prefill: ld_q ", a.ld_q,
                      " must be a multiple of 8 and >= heads*192");
  KIMIRT_CUDA_REQUIRE(
      stride_ok(a.ld_k_nope) && a.hs_k_nope % 8 == 0 && stride_ok(a.ld_k_pe) && stride_ok(a.ld_v) && a.hs_v % 8 == 0,
      "mla_prefill: key/value strides (ld_k_nope ", a.ld_k_nope, ", hs_k_nope ", a.hs_k_nope, ", ld_k_pe ", a.ld_k_pe,
      ", ld_v ", a.ld_v, ", hs_v ", a.hs_v, ") must be multiples of 8");
  KIMIRT_CUDA_REQUIRE(stride_ok(a.ld_out) && a.ld_out >= int64_t{a.heads} * kDv, "mla_prefill: ld_out ", a.ld_out,
                      " must be a multiple of 8 and >= heads*128");
  KIMIRT_CUDA_REQUIRE(
      !a.gate || (stride_ok(a.ld_gate) && a.ld_gate >= int64_t{a.heads} * kDv && detail::aligned16(a.gate)),
      "mla_prefill: gate stride ", a.ld_gate, " must be a multiple of 8 and >= heads*128, and gate 16-byte aligned");
  KIMIRT_CUDA_REQUIRE(detail::aligned16(a.q) && detail::aligned16(a.k_nope) && detail::aligned16(a.k_pe) &&
                          detail::aligned16(a.v) && detail::aligned16(a.out),
                      "mla_prefill: q, k_nope, k_pe, v and out must be 16-byte aligned");
  constexpr int64_t k2g = int64_t{1} << 31;  // tensor-copy coordinates are 32-bit
  KIMIRT_CUDA_REQUIRE(a.total_q > 0 && a.total_q < k2g && a.total_k > 0 && a.total_k < k2g, "mla_prefill: total_q ",
                      a.total_q, " and total_k ", a.total_k, " (cu_q[batch], cu_k[batch]) must be in 1..2^31-1");
  KIMIRT_CUDA_REQUIRE(a.hs_k_nope >= 0 && a.hs_v >= 0 && (a.heads - 1) * a.hs_k_nope + kDnope < k2g &&
                          (a.heads - 1) * a.hs_v + kDv < k2g,
                      "mla_prefill: head strides hs_k_nope ", a.hs_k_nope, " and hs_v ", a.hs_v,
                      " must not be negative, and the last head's columns must end below 2^31");
  // A key row must hold every head's columns: a shorter row stride would make the last key's copies read past
  // the total_k rows the caller has.
  KIMIRT_CUDA_REQUIRE(a.ld_k_nope >= (a.heads - 1) * a.hs_k_nope + kDnope && a.ld_k_pe >= kDqk - kDnope &&
                          a.ld_v >= (a.heads - 1) * a.hs_v + kDv,
                      "mla_prefill: row strides ld_k_nope ", a.ld_k_nope, ", ld_k_pe ", a.ld_k_pe, ", ld_v ", a.ld_v,
                      " must hold the last head's columns ((heads-1)*hs_k_nope + 128, 64, (heads-1)*hs_v + 128)");
  KIMIRT_CUDA_REQUIRE(!a.lse || a.ld_lse >= a.heads, "mla_prefill: ld_lse ", a.ld_lse, " must be >= heads (", a.heads,
                      ")");
  KIMIRT_CUDA_REQUIRE(std::isfinite(a.scale) && a.scale >= 0.0f, "mla_prefill: scale ", a.scale,
                      " must be finite and >= 0 (0: 192^-1/2)");
  const float scale_log2 = (a.scale > 0.0f ? a.scale : 1.0f / sqrtf(static_cast<float>(kDqk))) * kLog2e;
  if (kernel != MlaPrefillKernel::kMma) {
    launch_wgmma(stream, a, scale_log2);
    return;
  }
  Params p{a, scale_log2};
  ensure_dynamic_smem(reinterpret_cast<const void*>(&mla_prefill_kernel), kSmemBytes);
  const dim3 grid(static_cast<unsigned>((int64_t{a.max_q} + kBM - 1) / kBM), static_cast<unsigned>(a.heads),
                  static_cast<unsigned>(a.batch));
  mla_prefill_kernel<<<grid, kThreads, kSmemBytes, stream>>>(p);
  KIMIRT_CUDA_CHECK_LAUNCH();
}

void mla_prefill_merge(cudaStream_t stream, const MlaPrefillMergeArgs& m, MlaMergeMode mode) {
  KIMIRT_CUDA_REQUIRE(m.tokens >= 0 && m.heads > 0, "mla_prefill_merge: tokens ", m.tokens, ", heads ", m.heads);
  if (m.tokens == 0) return;
  const int64_t width = int64_t{m.heads} * kDv;
  const bool last = mode == MlaMergeMode::kLast;
  KIMIRT_CUDA_REQUIRE(m.part && m.part_lse && m.acc && m.acc_lse && (!last || m.out),
                      "mla_prefill_merge: part, part_lse, acc, acc_lse (and out for the last pass) must be set");
  KIMIRT_CUDA_REQUIRE(stride_ok(m.ld_part) && m.ld_part >= width && m.ld_part_lse >= m.heads,
                      "mla_prefill_merge: ld_part ", m.ld_part, " (a multiple of 8, >= heads*128) or ld_part_lse ",
                      m.ld_part_lse, " (>= heads)");
  KIMIRT_CUDA_REQUIRE(!last || (stride_ok(m.ld_out) && m.ld_out >= width), "mla_prefill_merge: ld_out ", m.ld_out,
                      " must be a multiple of 8 and >= heads*128");
  KIMIRT_CUDA_REQUIRE(!last || !m.gate || (stride_ok(m.ld_gate) && m.ld_gate >= width && detail::aligned16(m.gate)),
                      "mla_prefill_merge: ld_gate ", m.ld_gate, " must be a multiple of 8 and >= heads*128");
  KIMIRT_CUDA_REQUIRE(detail::aligned16(m.part) && detail::aligned16(m.acc) && (!last || detail::aligned16(m.out)),
                      "mla_prefill_merge: part, acc and out must be 16-byte aligned");
  const int64_t threads = m.tokens * m.heads * 16;
  KIMIRT_CUDA_REQUIRE(threads / 256 < (int64_t{1} << 31), "mla_prefill_merge: ", m.tokens, " tokens are too many");
  const unsigned blocks = static_cast<unsigned>((threads + 255) / 256);
  switch (mode) {
    case MlaMergeMode::kFirst:
      merge_kernel<MlaMergeMode::kFirst><<<blocks, 256, 0, stream>>>(m);
      break;
    case MlaMergeMode::kAccumulate:
      merge_kernel<MlaMergeMode::kAccumulate><<<blocks, 256, 0, stream>>>(m);
      break;
    case MlaMergeMode::kLast:
      merge_kernel<MlaMergeMode::kLast><<<blocks, 256, 0, stream>>>(m);
      break;
  }
  KIMIRT_CUDA_CHECK_LAUNCH();
}

}  // namespace kimirt::cuda
