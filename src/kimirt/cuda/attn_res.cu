// AttnRes mix + RMSNorm. A token is handled by a cluster of two blocks, each owning half of the hidden
// dimension: a block stages its half of every candidate in shared memory (so HBM is read once), reduces
// Σv² and ⟨v, u⟩ per candidate, and the two blocks add their partial sums through distributed shared
// memory. Two versions, kept and compared by the benchmark (AttnResKernel): one cluster per token, and
// persistent clusters that stream tokens through a ring of shared-memory slots.
#include <cooperative_groups.h>

#include <algorithm>

#include "kimirt/cuda/async_pipeline.cuh"
#include "kimirt/cuda/attn_res.h"
#include "kimirt/cuda/check.h"
#include "kimirt/cuda/device_utils.cuh"
#include "kimirt/cuda/kernel_attr.h"

namespace kimirt::cuda {
namespace {

namespace cg = cooperative_groups;
using detail::bf16;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxSmemBytes = 200 * 1024;
constexpr int kStats = 2 * kAttnResMaxCandidates;

struct Candidates {
  const bf16* p[kAttnResMaxCandidates];
};

// Partial sums per value that block_sum leaves in `red` (its size: kFoldParts · WARPS · N floats).
constexpr int kFoldParts = 4;

// The block's sum of value t (< n) for thread t. Each warp folds its lanes only down to four partial sums
// per value (xor 16, 8, 4), value after value within a level so that the shuffles of different values are in
// flight together; lanes 0-3 store them and thread t adds the 4 · WARPS partials of value t. (A full warp
// reduction per value, each value's five dependent shuffles guarded by its own branch, was 16% of the
// per-token kernel's instructions and a serial chain of ~90 shuffle latencies per warp. A reduce-scatter
// over the lanes, 31 shuffles for up to 32 values, made the kernel 30% slower: the 32-value array costs
// more registers than it saves.)
template <int WARPS, int N>
__device__ __forceinline__ float block_sum(float (&v)[N], int n, float* red) {
  constexpr int kParts = kFoldParts * WARPS;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o >= kFoldParts; o >>= 1) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if (i < n) v[i] += __shfl_xor_sync(0xffffffffu, v[i], o);
    }
  }
  if (lane < kFoldParts) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if (i < n) red[(warp * kFoldParts + lane) * N + i] = v[i];
    }
  }
  __syncthreads();
  const int t = static_cast<int>(threadIdx.x);
  float sum[2] = {0.0f, 0.0f};
  if (t < n) {
#pragma unroll
    for (int p = 0; p < kParts; ++p) sum[p & 1] += red[p * N + t];
  }
  return sum[0] + sum[1];
}

// Every thread reads the n totals that threads 0..n-1 wrote.
template <int N>
__device__ __forceinline__ void read_totals(float (&v)[N], int n, const float* totals) {
  __syncthreads();
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if (i < n) v[i] = totals[i];
  }
}

// Sums v over the two blocks of the cluster; every thread of both gets the same result (added in rank
// order). Each block's total goes to `partial`, which the other block reads after the cluster barrier;
// a few threads combine the two into `totals` for everyone. (Every thread summing all warps' partials, and
// reading the other block's, made these reductions most of the kernel's time.) `partial` must not be
// reused before the next cluster barrier: callers alternate two buffers.
template <int WARPS, int N>
__device__ __forceinline__ void cluster_sums(float (&v)[N], int n, float* red, float* partial, float* totals,
                                             cg::cluster_group& cluster) {
  const int t = static_cast<int>(threadIdx.x);
  const float sum = block_sum<WARPS>(v, n, red);
  if (t < n) partial[t] = sum;
  cluster.sync();
  if (t < n) {
    const unsigned rank = cluster.block_rank();
    const float ours = partial[t], theirs = cluster.map_shared_rank(partial, rank ^ 1)[t];
    totals[t] = rank == 0 ? ours + theirs : theirs + ours;
  }
  read_totals(v, n, totals);
}

// cluster_sums for the per-token kernel, without cluster barriers: each block sends its n sums into the
// other block's `inbox` with st.async, which completes the receiver's mbarrier `xbar` (used once: parity 0),
// and combines them in rank order. The blocks' exchange barriers must have been initialized cluster-wide
// (cluster_arrive_relaxed after mbar_init_fence, cluster_wait before the first exchange). Every thread gets
// the same result; totals is scratch shared by the block.
template <int WARPS, int N>
__device__ __forceinline__ void exchange_sums(float (&v)[N], int n, float* red, float* inbox, uint64_t* xbar,
                                              float* totals, unsigned rank) {
  const int t = static_cast<int>(threadIdx.x);
  const float ours = block_sum<WARPS>(v, n, red);
  if (t < n) {
    const uint32_t bar = detail::smem_addr(xbar);
    detail::st_async_cluster(detail::cluster_map(detail::smem_addr(inbox + t), rank ^ 1), __float_as_uint(ours),
                             detail::cluster_map(bar, rank ^ 1));
    if (t == 0) detail::mbar_expect_tx(bar, static_cast<uint32_t>(n * 4));
    detail::mbar_wait_cluster(bar, 0);
    const float theirs = inbox[t];
    totals[t] = rank == 0 ? ours + theirs : theirs + ours;
  }
  read_totals(v, n, totals);
}

// The per-token math both kernels share. A block owns `mine` 16-byte vectors (8 hidden elements each) of a
// token's half of the hidden dimension; `slot` points at candidate 0's vectors in shared memory, candidate i
// at slot + i · mine.

// Σv² and ⟨v, u⟩ of one candidate's vectors held by this thread, two partial sums each (half the length of
// the dependent FMA chains).
template <int VPT, int THREADS>
__device__ __forceinline__ void candidate_stats(const uint4* cand, int mine, const float (&uf)[VPT][8], float& ss,
                                                float& dot) {
  float s2[2] = {0.0f, 0.0f}, d2[2] = {0.0f, 0.0f};
#pragma unroll
  for (int v = 0; v < VPT; ++v) {
    const int vi = threadIdx.x + v * THREADS;
    if (vi < mine) {
      float f[8];
      detail::unpack8(cand[vi], f);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        s2[j & 1] = fmaf(f[j], f[j], s2[j & 1]);
        d2[j & 1] = fmaf(f[j], uf[v][j], d2[j & 1]);
      }
    }
  }
  ss = s2[0] + s2[1];
  dot = d2[0] + d2[1];
}

// The depth softmax from the cluster's sums (Σv², ⟨v, u⟩ per candidate, interleaved), computed once by
// warp 0 (lane i for candidate i) into alpha_s and read by every thread after the barrier. (Each of the
// block's threads computing all of it, IEEE divisions and square roots included, was as many instructions
// as the arithmetic on the data; every warp computing it lane-parallel, with shuffles instead of the
// barrier, measured no faster for the per-token kernel and 14% slower for the pipelined one.) Both blocks of
// the cluster compute bit-identical weights.
__device__ __forceinline__ void depth_softmax(const float (&stats)[kStats], int count, int hidden, float res_eps,
                                              float* alpha_s, float (&alpha)[kAttnResMaxCandidates]) {
  if (threadIdx.x < 32) {
    const int lane = static_cast<int>(threadIdx.x);
    // Lane i picks its candidate's sums first, then computes one score (a division and a square root per
    // unrolled candidate had every lane run twelve of each, while the block waited at the barrier below).
    float sq = 0.0f, dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kAttnResMaxCandidates; ++i) {
      if (i == lane) sq = stats[2 * i], dot = stats[2 * i + 1];
    }
    const float score = lane < count ? dot * rsqrtf(sq / static_cast<float>(hidden) + res_eps) : -INFINITY;
    const float smax = detail::warp_max(score);
    const float e = lane < count ? expf(score - smax) : 0.0f;
    const float denom = detail::warp_sum(e);
    if (lane < count) alpha_s[lane] = e / denom;
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kAttnResMaxCandidates; ++i) alpha[i] = i < count ? alpha_s[i] : 0.0f;
}

// h = bf16(Σ α_i v_i) for this thread's vectors, written to `mixed_row` (may be null); returns Σh².
template <int VPT, int THREADS>
__device__ __forceinline__ float mix_candidates(const uint4* slot, int count, int mine,
                                                const float (&alpha)[kAttnResMaxCandidates], float (&h)[VPT][8],
                                                bf16* mixed_row) {
  float ss = 0.0f;
#pragma unroll
  for (int v = 0; v < VPT; ++v) {
    const int vi = threadIdx.x + v * THREADS;
    if (vi < mine) {
#pragma unroll
      for (int j = 0; j < 8; ++j) h[v][j] = 0.0f;
#pragma unroll
      for (int i = 0; i < kAttnResMaxCandidates; ++i) {
        if (i < count) {
          float f[8];
          detail::unpack8(slot[i * mine + vi], f);
#pragma unroll
          for (int j = 0; j < 8; ++j) h[v][j] += alpha[i] * f[j];
        }
      }
      const uint4 packed = detail::pack8(h[v]);
      detail::unpack8(packed, h[v]);  // h as stored, in bf16
#pragma unroll
      for (int j = 0; j < 8; ++j) ss += h[v][j] * h[v][j];
      if (mixed_row) detail::store16(mixed_row + vi * 8, packed);
    }
  }
  return ss;
}

// y = bf16(bf16(h · rs) · w), written to `normed_row`.
template <int VPT, int THREADS>
__device__ __forceinline__ void store_normed(const float (&h)[VPT][8], const uint4 (&w8)[VPT], float rs, int mine,
                                             bf16* normed_row) {
#pragma unroll
  for (int v = 0; v < VPT; ++v) {
    const int vi = threadIdx.x + v * THREADS;
    if (vi < mine) detail::store16(normed_row + vi * 8, detail::normalize8(h[v], rs, w8[v]));
  }
}

// This thread's vectors of u (8 floats each) and of the norm weight (8 packed bf16 each).
template <int VPT, int THREADS>
__device__ __forceinline__ void load_weights(const float* __restrict__ u, const bf16* __restrict__ w, int first,
                                             int mine, float (&uf)[VPT][8], uint4 (&w8)[VPT]) {
#pragma unroll
  for (int v = 0; v < VPT; ++v) {
    const int vi = threadIdx.x + v * THREADS;
    if (vi < mine) {
      const float4 a = __ldg(reinterpret_cast<const float4*>(u + (first + vi) * 8));
      const float4 b = __ldg(reinterpret_cast<const float4*>(u + (first + vi) * 8 + 4));
      uf[v][0] = a.x, uf[v][1] = a.y, uf[v][2] = a.z, uf[v][3] = a.w;
      uf[v][4] = b.x, uf[v][5] = b.y, uf[v][6] = b.z, uf[v][7] = b.w;
      w8[v] = detail::ldg16(w + (first + vi) * 8);
    }
  }
}

// Version 1 (default): a two-block cluster per token, launched for every token. Lane i of each block's warp
// 0 hands the copy of its half of candidate i to the bulk-copy engine (one barrier per candidate, so
// candidate i's statistics are computed while later ones arrive); three clusters' worth of tokens stay
// resident per SM for K3, overlapping one token's loads with another's arithmetic and barriers. The two
// blocks swap their sums with st.async (exchange_sums) instead of cluster barriers, whose fences were among
// the largest stalls. On the H200 at [4096, 7168] x 9: 0.73 of the copy ceiling (0.55 with cluster
// barriers, one thread issuing all copies from a local-memory copy of the pointers, and twelve divisions
// per softmax lane).
template <int VPT>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads)
    attn_res_kernel(const __grid_constant__ Candidates cand, int count, int64_t ld_in, int hidden,
                    const float* __restrict__ u, float res_eps, const bf16* __restrict__ norm_w, float norm_eps,
                    bf16* mixed, bf16* normed, int64_t ld_out) {
  extern __shared__ uint4 stage[];  // [count][my vectors]
  __shared__ float red[kFoldParts * kWarps * kStats];
  __shared__ float inbox_a[kStats], inbox_b[1], totals[kStats];  // see exchange_sums
  __shared__ float alpha_s[kAttnResMaxCandidates];
  __shared__ __align__(8) uint64_t bars[kAttnResMaxCandidates], xbars[2];
  const unsigned rank = cg::this_cluster().block_rank();
  const int64_t token = blockIdx.x >> 1;
  const int vectors = hidden / 8;
  const int first = rank == 0 ? 0 : (vectors + 1) / 2;
  const int mine = rank == 0 ? (vectors + 1) / 2 : vectors / 2;

  // Lane i of warp 0 sets up and issues candidate i's copy (one thread issuing all of them in turn, with the
  // candidate pointers read from a local-memory copy of the parameters, held the whole block at the barrier
  // below).
  if (threadIdx.x < 32) {
    const int lane = static_cast<int>(threadIdx.x);
    if (lane < count) detail::mbar_init(detail::smem_addr(&bars[lane]), 1);
    if (lane == 0) {
      detail::mbar_init(detail::smem_addr(&xbars[0]), 1);
      detail::mbar_init(detail::smem_addr(&xbars[1]), 1);
    }
    detail::mbar_init_fence();
    if (lane < count) {
      const uint32_t bar = detail::smem_addr(&bars[lane]);
      detail::mbar_expect_tx(bar, static_cast<uint32_t>(mine * 16));
      if (mine > 0) {
        detail::bulk_load(detail::smem_addr(stage + lane * mine),
                          cand.p[lane] + token * ld_in + static_cast<int64_t>(first) * 8,
                          static_cast<uint32_t>(mine * 16), bar);
      }
    }
  }
  float uf[VPT][8];
  uint4 w8[VPT];
  load_weights<VPT, kThreads>(u, norm_w, first, mine, uf, w8);
  __syncthreads();  // the barriers are initialized
  detail::cluster_arrive_relaxed();

  float part[kStats];
#pragma unroll
  for (int i = 0; i < kStats; ++i) part[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < kAttnResMaxCandidates; ++i) {
    if (i < count) {
      detail::mbar_wait(detail::smem_addr(&bars[i]), 0);
      candidate_stats<VPT, kThreads>(stage + i * mine, mine, uf, part[2 * i], part[2 * i + 1]);
    }
  }
  detail::cluster_wait();  // the other block's exchange barriers are initialized
  exchange_sums<kWarps>(part, 2 * count, red, inbox_a, &xbars[0], totals, rank);
  float alpha[kAttnResMaxCandidates];
  depth_softmax(part, count, hidden, res_eps, alpha_s, alpha);

  float h[VPT][8];
  float ss[1] = {mix_candidates<VPT, kThreads>(stage, count, mine, alpha, h,
                                               mixed ? mixed + token * ld_out + first * 8 : nullptr)};
  exchange_sums<kWarps>(ss, 1, red, inbox_b, &xbars[1], totals, rank);
  const float rs = 1.0f / sqrtf(ss[0] / static_cast<float>(hidden) + norm_eps);
  store_normed<VPT, kThreads>(h, w8, rs, mine, normed + token * ld_out + first * 8);
  // No cluster barrier at the end: both of this block's inboxes have been filled (waited for), and the other
  // block reads nothing of ours.
}

// Version 2: persistent two-block clusters, as many as fit at once, each walking its share of
// the tokens through a ring of up to three token slots in shared memory. Every thread copies its own
// vectors of the next tokens with cp.async while the block computes the current one, so HBM does not wait
// on the arithmetic or the cluster barriers (for K3, 9 x 7 KiB per half token: two tokens, 126 KiB per SM,
// on the way). A thread reads back only the bytes it copied, so its own wait_group is all the
// synchronization the ring needs. The norm weight and u are loaded once per block instead of per token.
// Slower than version 1 on the H200 (0.30 of the ceiling at 4096 tokens): one 512-thread block per SM,
// and its per-token barriers (two cluster-wide, five block-wide) stop all of its warps at once, where
// version 1's three resident blocks interleave. (Thread 0 issuing bulk copies instead of cp.async per
// thread measured the same.)
constexpr int kPipeThreads = 512;
constexpr int kPipeWarps = kPipeThreads / 32;
constexpr int kMaxStages = 3;
constexpr int kMaxRingBytes = 220 * 1024;
// The ring plus the kernel's static shared arrays (red, partial_a, partial_b, totals, alpha_s) must fit one
// block's 227 KiB: more candidates or warps shrink the ring.
static_assert(kMaxRingBytes + 4 * (kFoldParts * kPipeWarps * kStats + 2 * kStats + 4 + kAttnResMaxCandidates) <=
                  227 * 1024,
              "attn_res pipelined kernel: shared memory");

template <int VPT>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kPipeThreads, 1)
    attn_res_pipelined_kernel(Candidates cand, int count, int64_t ld_in, int hidden, int64_t tokens,
                              const float* __restrict__ u, float res_eps, const bf16* __restrict__ norm_w,
                              float norm_eps, bf16* mixed, bf16* normed, int64_t ld_out, int stages) {
  extern __shared__ uint4 ring[];  // [stages][count][my vectors]
  __shared__ float red[kFoldParts * kPipeWarps * kStats];
  __shared__ float partial_a[kStats], partial_b[4], totals[kStats];  // see cluster_sums
  __shared__ float alpha_s[kAttnResMaxCandidates];
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank();
  const int64_t cluster_id = blockIdx.x >> 1, clusters = gridDim.x >> 1;
  const int vectors = hidden / 8;
  const int first = rank == 0 ? 0 : (vectors + 1) / 2;
  const int mine = rank == 0 ? (vectors + 1) / 2 : vectors / 2;
  const int64_t my_tokens = cluster_id < tokens ? (tokens - 1 - cluster_id) / clusters + 1 : 0;

  // This thread's copies of the cluster's k-th token into ring slot k % stages; one commit group per call,
  // empty past the last token, so that "all but the newest stages - 1 groups" is always token k's.
  const auto issue = [&](int64_t k) {
    if (k < my_tokens) {
      const int s = static_cast<int>(k % stages);
      const int64_t offset = (cluster_id + k * clusters) * ld_in + static_cast<int64_t>(first) * 8;
#pragma unroll
      for (int i = 0; i < kAttnResMaxCandidates; ++i) {
        if (i < count) {
#pragma unroll
          for (int v = 0; v < VPT; ++v) {
            const int vi = threadIdx.x + v * kPipeThreads;
            if (vi < mine) detail::cp_async16(ring + (s * count + i) * mine + vi, cand.p[i] + offset + vi * 8, true);
          }
        }
      }
    }
    detail::cp_async_commit();
  };
  for (int k = 0; k < stages; ++k) issue(k);
  float uf[VPT][8];
  uint4 w8[VPT];
  load_weights<VPT, kPipeThreads>(u, norm_w, first, mine, uf, w8);

  for (int64_t k = 0; k < my_tokens; ++k) {
    const int s = static_cast<int>(k % stages);
    const int64_t token = cluster_id + k * clusters;
    const uint4* slot = ring + s * count * mine;
    // Groups 0..k must be complete; the newest stages - 1 may still be in flight.
    if (stages == 3) {
      detail::cp_async_wait<2>();
    } else if (stages == 2) {
      detail::cp_async_wait<1>();
    } else {
      detail::cp_async_wait<0>();
    }

    float part[kStats];
#pragma unroll
    for (int i = 0; i < kStats; ++i) part[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < kAttnResMaxCandidates; ++i) {
      if (i < count) candidate_stats<VPT, kPipeThreads>(slot + i * mine, mine, uf, part[2 * i], part[2 * i + 1]);
    }
    cluster_sums<kPipeWarps>(part, 2 * count, red, partial_a, totals, cluster);
    float alpha[kAttnResMaxCandidates];
    depth_softmax(part, count, hidden, res_eps, alpha_s, alpha);

    float h[VPT][8];
    float ss[1] = {mix_candidates<VPT, kPipeThreads>(slot, count, mine, alpha, h,
                                                     mixed ? mixed + token * ld_out + first * 8 : nullptr)};
    issue(k + stages);  // this thread is done reading its bytes of slot s
    cluster_sums<kPipeWarps>(ss, 1, red, partial_b, totals, cluster);
    const float rs = 1.0f / sqrtf(ss[0] / static_cast<float>(hidden) + norm_eps);
    store_normed<VPT, kPipeThreads>(h, w8, rs, mine, normed + token * ld_out + first * 8);
  }
  detail::cp_async_wait<0>();
  cluster.sync();  // keep our shared memory alive until the other block has read it
}

__global__ void pseudo_query_kernel(const bf16* norm_w, const bf16* proj_w, float* u, int64_t hidden) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < hidden) u[i] = __bfloat162float(norm_w[i]) * __bfloat162float(proj_w[i]);
}

struct LaunchArgs {
  Candidates c;
  int count;
  int64_t ld_in, tokens;
  int hidden;
  const float* u;
  float res_eps;
  const bf16* norm_w;
  float norm_eps;
  bf16 *mixed, *normed;
  int64_t ld_out;
};

template <int VPT>
void launch_per_token(cudaStream_t stream, const LaunchArgs& a, int smem) {
  const void* kernel = reinterpret_cast<const void*>(&attn_res_kernel<VPT>);
  ensure_dynamic_smem(kernel, smem);
  attn_res_kernel<VPT><<<static_cast<unsigned>(2 * a.tokens), kThreads, smem, stream>>>(
      a.c, a.count, a.ld_in, a.hidden, a.u, a.res_eps, a.norm_w, a.norm_eps, a.mixed, a.normed, a.ld_out);
  KIMIRT_CUDA_CHECK_LAUNCH();
}

// Clusters of this kernel (its two-block shape is compiled in) that fit on the current device at once with
// `smem` bytes each.
int resident_clusters(const void* kernel, int smem) {
  const int clusters = max_active_clusters(kernel, 1, kPipeThreads, smem);
  if (clusters <= 0) {
    int device = 0;
    KIMIRT_CUDA_CHECK(cudaGetDevice(&device));
    KIMIRT_CUDA_REQUIRE(false, "attn_res_mix_norm: no two-block cluster with ", smem,
                        " bytes of shared memory per block fits on device ", device);
  }
  return clusters;
}

template <int VPT>
void launch_pipelined(cudaStream_t stream, const LaunchArgs& a, int stages, int smem) {
  const void* kernel = reinterpret_cast<const void*>(&attn_res_pipelined_kernel<VPT>);
  ensure_dynamic_smem(kernel, smem);
  const int64_t clusters = std::min<int64_t>(a.tokens, resident_clusters(kernel, smem));
  attn_res_pipelined_kernel<VPT><<<static_cast<unsigned>(2 * clusters), kPipeThreads, smem, stream>>>(
      a.c, a.count, a.ld_in, a.hidden, a.tokens, a.u, a.res_eps, a.norm_w, a.norm_eps, a.mixed, a.normed, a.ld_out,
      stages);
  KIMIRT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void attn_res_pseudo_query(cudaStream_t stream, const __nv_bfloat16* norm_w, const __nv_bfloat16* proj_w, float* u,
                           int64_t hidden) {
  KIMIRT_CUDA_REQUIRE(hidden > 0 && norm_w && proj_w && u, "attn_res_pseudo_query: hidden ", hidden,
                      " or a null pointer");
  pseudo_query_kernel<<<static_cast<unsigned>((hidden + 255) / 256), 256, 0, stream>>>(norm_w, proj_w, u, hidden);
  KIMIRT_CUDA_CHECK_LAUNCH();
}

void attn_res_mix_norm(cudaStream_t stream, const __nv_bfloat16* const* candidates, int count, int64_t ld_in,
                       int64_t tokens, int64_t hidden, const float* u, float res_eps, const __nv_bfloat16* norm_w,
                       float norm_eps, __nv_bfloat16* mixed, __nv_bfloat16* normed, int64_t ld_out,
                       AttnResKernel kernel) {
  KIMIRT_CUDA_REQUIRE(count >= 1 && count <= kAttnResMaxCandidates, "attn_res_mix_norm: ", count, " candidates (1..",
                      kAttnResMaxCandidates, " supported)");
  check_norm_eps("attn_res_mix_norm", "res_eps", res_eps);
  check_norm_eps("attn_res_mix_norm", "norm_eps", norm_eps);
  KIMIRT_CUDA_REQUIRE(hidden > 0 && hidden % 8 == 0 && hidden <= 8 * 8 * kThreads, "attn_res_mix_norm: hidden ", hidden,
                      " must be a multiple of 8 and at most ", 8 * 8 * kThreads);
  const int64_t half = (hidden / 8 + 1) / 2;  // vectors of the first block of a token's cluster
  const int64_t smem = static_cast<int64_t>(count) * half * 16;
  KIMIRT_CUDA_REQUIRE(smem <= kMaxSmemBytes, "attn_res_mix_norm: ", count, " candidates of width ", hidden, " need ",
                      smem, " bytes of shared memory (at most ", kMaxSmemBytes, ")");
  KIMIRT_CUDA_REQUIRE(ld_in >= hidden && ld_in % 8 == 0 && ld_out >= hidden && ld_out % 8 == 0,
                      "attn_res_mix_norm: row strides (in ", ld_in, ", out ", ld_out,
                      ") must be >= hidden and multiples of 8");
  KIMIRT_CUDA_REQUIRE(tokens >= 0 && tokens < (1ll << 30), "attn_res_mix_norm: token count ", tokens,
                      " (at most 2^30: two blocks per token)");
  KIMIRT_CUDA_REQUIRE(candidates && u && norm_w && normed && detail::aligned16(u) && detail::aligned16(norm_w) &&
                          detail::aligned16(normed) && (!mixed || detail::aligned16(mixed)),
                      "attn_res_mix_norm: u, norm_w, normed (and mixed) must be non-null and 16-byte aligned");
  Candidates c{};
  for (int i = 0; i < count; ++i) {
    KIMIRT_CUDA_REQUIRE(candidates[i] && detail::aligned16(candidates[i]), "attn_res_mix_norm: candidate ", i,
                        " is null or not 16-byte aligned");
    c.p[i] = candidates[i];
  }
  if (tokens == 0) return;
  const LaunchArgs a{c,        count, ld_in,  tokens, static_cast<int>(hidden), u, res_eps, norm_w,
                     norm_eps, mixed, normed, ld_out};
  // The ring of the pipelined version: as many token slots (up to three) as fit.
  const int stages = static_cast<int>(std::min<int64_t>(kMaxStages, kMaxRingBytes / smem));
  const bool pipelined = kernel == AttnResKernel::kPipelined;
  if (pipelined) {
    KIMIRT_CUDA_REQUIRE(stages >= 1, "attn_res_mix_norm: ", count, " candidates of width ", hidden,
                        " do not fit one ring slot");
    const int s = static_cast<int>(stages * smem);
    const int64_t vpt = (half + kPipeThreads - 1) / kPipeThreads;
    if (vpt <= 1) return launch_pipelined<1>(stream, a, stages, s);
    return launch_pipelined<2>(stream, a, stages, s);  // hidden ≤ 16384: at most 1024 vectors per block
  }
  const int s = static_cast<int>(smem);
  const int64_t vpt = (half + kThreads - 1) / kThreads;
  if (vpt <= 1) return launch_per_token<1>(stream, a, s);
  if (vpt <= 2) return launch_per_token<2>(stream, a, s);
  if (vpt <= 4) return launch_per_token<4>(stream, a, s);
  return launch_per_token<8>(stream, a, s);
}

}  // namespace kimirt::cuda
