// Sampling kernel. A row is split over C blocks (C up to 16 when the batch is small, so that a batch-1
// decode uses most of the GPU instead of one SM); each block keeps its slice of the row in shared memory
// and the blocks of a row meet at barriers (a counter in the workspace) to add up their 256-bin
// histograms, so every pass of the radix selections reads shared memory, not the row again:
//   1 pass  max / argmax (greedy stops here);
//   4 passes top-k threshold (8-bit digits of the order-preserving key, counts);
//   4 passes top-p threshold (same digits, 2^-32 fixed-point probability mass of the top-k survivors);
//   1 pass  Gumbel-max over the kept set, joined across the blocks.
// All sums are integer (counts, fixed-point mass) and joined in block order, so the result does not depend
// on C, i.e. not on the batch a request happens to be in. With top-k ≤ 256 (the usual case) the filters
// run on candidate lists instead of the row: see the two candidate paths in sample_kernel.
#include <algorithm>
#include <cmath>
#include <mutex>

#include "kimirt/cuda/check.h"
#include "kimirt/cuda/device_utils.cuh"
#include "kimirt/cuda/kernel_attr.h"
#include "kimirt/cuda/philox.cuh"
#include "kimirt/cuda/sampling.h"

namespace kimirt::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 256;
constexpr int kMaxBlocksPerRow = 16;
constexpr int kCacheFloats = 40960;  // 160 KiB: a row slice beyond this is read from global memory
constexpr float kLog2e = 1.4426950408889634f;

// Per row, for the blocks of that row (only used when C > 1).
constexpr int kCandCap = 512;   // top-k candidates one block may hand to block 0
constexpr int kFastMaxK = 256;  // the candidate paths serve top_k up to this
constexpr int kSoloCap = 1024;  // candidates of a row handled by one block

struct RowScratch {
  unsigned int counter;  // barrier arrivals; back to 0 when the row's blocks leave
  unsigned int pad[31];
  float best[kMaxBlocksPerRow];
  int best_id[kMaxBlocksPerRow];
  float win[kMaxBlocksPerRow];
  int win_id[kMaxBlocksPerRow];
  int count[kMaxBlocksPerRow];
  float cand_val[kMaxBlocksPerRow][kCandCap];
  int cand_id[kMaxBlocksPerRow][kCandCap];
  // Double-buffered by pass parity: a block may write the next pass's histogram while a slower one still
  // reads this pass's (it cannot be two passes behind: it has to arrive at the barrier in between).
  unsigned long long hist[2][kMaxBlocksPerRow][kBins];
};

__device__ __forceinline__ bool pair_better(float a, int ia, float b, int ib) { return a > b || (a == b && ia < ib); }

// Block-wide (value, id) argmax, ties to the lower id; result valid in every thread.
__device__ void block_argmax(float& v, int& id, float* sv, int* si) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, id, o);
    if (pair_better(ov, oi, v, id)) v = ov, id = oi;
  }
  if (lane == 0) sv[warp] = v, si[warp] = id;
  __syncthreads();
  v = lane < kWarps ? sv[lane] : -INFINITY;
  id = lane < kWarps ? si[lane] : 0x7fffffff;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, id, o);
    if (pair_better(ov, oi, v, id)) v = ov, id = oi;
  }
  __syncthreads();
}

// All blocks of the row have arrived `generation` times: the writes before each block's arrival are
// visible after it.
__device__ void row_barrier(RowScratch* rs, int blocks, unsigned int generation) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(&rs->counter, 1u);
    const unsigned int target = generation * static_cast<unsigned int>(blocks);
    unsigned int seen = 0;
    while (true) {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(seen) : "l"(&rs->counter) : "memory");
      if (seen >= target) break;
      __nanosleep(20);
    }
  }
  __syncthreads();
}

// The best (value, id) of the row's blocks, in block order (all loads issued together).
__device__ __forceinline__ void join_pairs(const float* vals, const int* ids, int blocks, float& best, int& best_id) {
  float v[kMaxBlocksPerRow];
  int id[kMaxBlocksPerRow];
#pragma unroll
  for (int j = 0; j < kMaxBlocksPerRow; ++j) {
    v[j] = j < blocks ? __ldcg(vals + j) : -INFINITY;
    id[j] = j < blocks ? __ldcg(ids + j) : 0x7fffffff;
  }
  best = -INFINITY, best_id = 0x7fffffff;
#pragma unroll
  for (int j = 0; j < kMaxBlocksPerRow; ++j) {
    if (pair_better(v[j], id[j], best, best_id)) best = v[j], best_id = id[j];
  }
}

struct Shared {
  unsigned long long whist[kWarps][kBins];  // per-warp private histograms
  unsigned long long hist[kBins];           // this row's histogram of the current pass
  float sv[kWarps];
  int si[kWarps];
  uint32_t sel_bin;
  unsigned long long sel_rest;
};

// The histogram of the current pass over the whole row (the blocks' parts added in block order) lands in
// sh.hist. Callers fill sh.whist first.
__device__ void join_histogram(Shared& sh, RowScratch* rs, int blocks, int c, unsigned int& generation) {
  __syncthreads();
  const int buf = (generation + 1) & 1;
  for (int b = threadIdx.x; b < kBins; b += kThreads) {
    unsigned long long s = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += sh.whist[w][b];
    sh.hist[b] = s;
    if (blocks > 1) rs->hist[buf][c][b] = s;
  }
  if (blocks > 1) {
    row_barrier(rs, blocks, ++generation);
    // All 16 loads issued together (unrolled, predicated): a rolled loop waited one L2 trip per block.
    for (int b = threadIdx.x; b < kBins; b += kThreads) {
      unsigned long long part[kMaxBlocksPerRow];
#pragma unroll
      for (int j = 0; j < kMaxBlocksPerRow; ++j) part[j] = j < blocks ? __ldcg(&rs->hist[buf][j][b]) : 0ull;
      unsigned long long s = 0;
#pragma unroll
      for (int j = 0; j < kMaxBlocksPerRow; ++j) s += part[j];
      sh.hist[b] = s;
    }
  }
  __syncthreads();
}

// Warp 0 finds the highest bin b with cum(> b) + hist[b] >= target, where cum(> b) counts from `above`;
// sets sh.sel_bin = b and sh.sel_rest = cum(> b). (Bin 0 when none reaches the target.)
__device__ void select_bin(Shared& sh, unsigned long long above, unsigned long long target) {
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    // Lane l holds bins 255 - 8l - j (j < 8): descending order along the lanes.
    unsigned long long part = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) part += sh.hist[kBins - 1 - 8 * lane - j];
    unsigned long long incl = part;  // inclusive prefix over lanes 0..lane
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned long long v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    const unsigned long long excl = incl - part;
    const bool reach = above + incl >= target;
    const unsigned int mask = __ballot_sync(0xffffffffu, reach);
    const int first = mask ? __ffs(mask) - 1 : 31;
    if (lane == first) {
      unsigned long long cum = above + excl;
      int b = kBins - 1 - 8 * lane;
      for (int j = 0; j < 8; ++j, --b) {
        if (b == 0 || cum + sh.hist[b] >= target) break;
        cum += sh.hist[b];
      }
      sh.sel_bin = static_cast<uint32_t>(b);
      sh.sel_rest = cum;
    }
  }
  __syncthreads();
}

// Count histograms use 32-bit atomics on the low word of the (zeroed) 64-bit bins: native shared-memory
// adds, where 64-bit ones are compare-and-swap loops that crawl when a warp's lanes share a bin (the top
// digit of the keys falls in a handful of bins). Counts never reach 2^32, so the high word stays 0.
__device__ __forceinline__ void count_add(unsigned long long* bin) {
  atomicAdd(reinterpret_cast<unsigned int*>(bin), 1u);
}

__device__ __forceinline__ void zero_whist(Shared& sh) {
  unsigned long long* p = &sh.whist[0][0];
  for (int i = threadIdx.x; i < kWarps * kBins; i += kThreads) p[i] = 0;
  __syncthreads();
}

// f(val(i), i) for this thread's share of i < n, four values fetched before any is used: every pass of
// the selections goes through here, and on a row longer than the shared-memory cache val reads global
// memory, where a loop with one load per iteration waited one round trip per element.
template <typename Val, typename F>
__device__ __forceinline__ void for_each_value(int n, Val val, F f) {
  int i = threadIdx.x;
  for (; i + 3 * kThreads < n; i += 4 * kThreads) {
    float v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = val(i + u * kThreads);
#pragma unroll
    for (int u = 0; u < 4; ++u) f(v[u], i + u * kThreads);
  }
  for (; i < n; i += kThreads) f(val(i), i);
}

__device__ __forceinline__ unsigned long long fixed_mass(float z, float inv_t, float zmax) {
  return __float2ull_rn(exp2f((z * inv_t - zmax) * kLog2e) * 4294967296.0f);
}

// The thresholds of the row's filters and the Gumbel draw over a set of elements (val(i), id(i)), i < n.
// With `joint`, the set is this block's slice of the row and the radix histograms are joined over the row's
// blocks at barriers; otherwise the set is complete here (one block per row, or the candidate list).
// Returns this set's winner (score, id).
template <typename Val, typename Id>
__device__ void select_and_draw(Shared& sh, RowScratch* rs, bool joint, int blocks, int c, unsigned int& generation,
                                int n, Val val, Id id, const SamplingParams& p, int vocab, float inv_t, float zmax,
                                int64_t vocab_offset, float& win, int& win_id) {
  const int jb = joint ? blocks : 1;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // Top-k threshold on keys of z (the order of z/T equals the order of z for T > 0).
  uint32_t tau = 0;  // keep key >= tau
  if (p.top_k > 0 && p.top_k < vocab) {
    uint32_t prefix = 0, mask = 0;
    unsigned long long remaining = static_cast<unsigned long long>(p.top_k);
    for (int shift = 24; shift >= 0; shift -= 8) {
      zero_whist(sh);
      for_each_value(n, val, [&](float v, int) {
        const uint32_t key = detail::order_key(v);
        if ((key & mask) == prefix) count_add(&sh.whist[warp][(key >> shift) & 255u]);
      });
      join_histogram(sh, rs, jb, c, generation);
      select_bin(sh, 0, remaining);
      prefix |= sh.sel_bin << shift;
      mask |= 255u << shift;
      remaining -= sh.sel_rest;
      __syncthreads();
    }
    tau = prefix;
  }
  // Top-p threshold on the mass of the top-k survivors, in 2^-32 fixed point.
  if (p.top_p < 1.0f) {
    uint32_t prefix = 0, mask = 0;
    unsigned long long above = 0, target = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
      zero_whist(sh);
      for_each_value(n, val, [&](float v, int) {
        const uint32_t key = detail::order_key(v);
        if (key >= tau && (key & mask) == prefix && !isnan(v)) {
          atomicAdd(&sh.whist[warp][(key >> shift) & 255u], fixed_mass(v, inv_t, zmax));
        }
      });
      join_histogram(sh, rs, jb, c, generation);
      if (shift == 24) {
        unsigned long long total = 0;
        for (int b = lane; b < kBins; b += 32) total += sh.hist[b];
        for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
        target = static_cast<unsigned long long>(ceil(static_cast<double>(p.top_p) * static_cast<double>(total)));
      }
      select_bin(sh, above, target);
      prefix |= sh.sel_bin << shift;
      mask |= 255u << shift;
      above = sh.sel_rest;
      __syncthreads();
    }
    tau = max(tau, prefix);
  }
  const float zmin = p.min_p > 0.0f ? zmax + logf(p.min_p) : -INFINITY;
  // Gumbel-max over the kept set.
  win = -INFINITY;
  win_id = 0x7fffffff;
  for_each_value(n, val, [&](float v, int i) {
    const float zi = v * inv_t;
    if (detail::order_key(v) < tau || !(zi >= zmin)) return;
    const int gid = id(i);
    const detail::Philox4 r =
        detail::philox4x32_10(detail::Philox4{static_cast<uint32_t>(vocab_offset + gid), static_cast<uint32_t>(p.step),
                                              static_cast<uint32_t>(p.step >> 32), 0x53414d50u},
                              p.seed);
    const float u = detail::uniform_open01(r.x);
    const float score = zi - logf(-logf(u));
    if (pair_better(score, gid, win, win_id)) win = score, win_id = gid;
  });
  block_argmax(win, win_id, sh.sv, sh.si);
}

// The k-th largest key of this block's slice alone (all of it when it has fewer than k values): every value
// of the row's top k is at or above the threshold of its own block, ties included.
template <typename Val>
__device__ uint32_t local_topk_threshold(Shared& sh, int n, Val val, int k) {
  if (n <= k) return 0;
  const int warp = threadIdx.x >> 5;
  uint32_t prefix = 0, mask = 0;
  unsigned long long remaining = static_cast<unsigned long long>(k);
  for (int shift = 24; shift >= 0; shift -= 8) {
    zero_whist(sh);
    for_each_value(n, val, [&](float v, int) {
      const uint32_t key = detail::order_key(v);
      if ((key & mask) == prefix) count_add(&sh.whist[warp][(key >> shift) & 255u]);
    });
    __syncthreads();
    for (int b = threadIdx.x; b < kBins; b += kThreads) {
      unsigned long long t = 0;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) t += sh.whist[w][b];
      sh.hist[b] = t;
    }
    __syncthreads();
    select_bin(sh, 0, remaining);
    prefix |= sh.sel_bin << shift;
    mask |= 255u << shift;
    remaining -= sh.sel_rest;
    __syncthreads();
  }
  return prefix;
}

// The slice's first m values into shared memory: 16-byte loads, four in flight per thread, when the source
// is aligned after a few leading values.
__device__ __forceinline__ void fill_cache(float* cache, const float* __restrict__ src, int m) {
  const int head = min(m, static_cast<int>(((16 - (reinterpret_cast<uintptr_t>(src) & 15)) & 15) / 4));
  if ((reinterpret_cast<uintptr_t>(src) & 3) != 0) {  // not even float-aligned: plain loads
    for (int i = threadIdx.x; i < m; i += kThreads) cache[i] = __ldcs(src + i);
    return;
  }
  for (int i = threadIdx.x; i < head; i += kThreads) cache[i] = __ldcs(src + i);
  const int quads = (m - head) / 4;
  const float4* s4 = reinterpret_cast<const float4*>(src + head);
  float* c = cache + head;
  int j = threadIdx.x;
  for (; j + 3 * kThreads < quads; j += 4 * kThreads) {
    float4 q[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) q[u] = __ldcs(s4 + j + u * kThreads);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      float* d = c + 4 * (j + u * kThreads);
      d[0] = q[u].x, d[1] = q[u].y, d[2] = q[u].z, d[3] = q[u].w;
    }
  }
  for (; j < quads; j += kThreads) {
    const float4 q = __ldcs(s4 + j);
    float* d = c + 4 * j;
    d[0] = q.x, d[1] = q.y, d[2] = q.z, d[3] = q.w;
  }
  for (int i = head + 4 * quads + threadIdx.x; i < m; i += kThreads) cache[i] = __ldcs(src + i);
}

__global__ void __launch_bounds__(kThreads, 1)
    sample_kernel(const float* __restrict__ logits, int64_t ld, int vocab, int64_t vocab_offset,
                  const SamplingParams* __restrict__ params, int32_t* __restrict__ out_ids, float* out_scores,
                  RowScratch* scratch, int blocks, int chunk, int cached) {
  __shared__ Shared sh;
  __shared__ int cand_count;
  extern __shared__ float cache[];
  const int c = blockIdx.x;
  const int64_t row = blockIdx.y;
  RowScratch* rs = blocks > 1 ? scratch + row : nullptr;
  unsigned int generation = 0;
  const float* z = logits + row * ld;
  const int begin = c * chunk;
  const int end = min(vocab, begin + chunk);
  const int n = max(0, end - begin);
  const SamplingParams p = params[row];
  // Tiny temperatures are greedy rather than scaled (sampling.h): that bounds 1/T by 1/kMinTemperature, so
  // z = v/T stays finite, and keeps z the same expression on every shard, which the cross-shard join needs
  // (a z taken relative to the row max would be relative to each shard's own max).
  const bool greedy = is_greedy(p);
  const float inv_t = greedy ? 1.0f : 1.0f / p.temperature;

  // The slice once from global memory (the first `cached` values kept in shared memory).
  fill_cache(cache, z + begin, min(n, cached));
  __syncthreads();
  // NaN counts as -inf everywhere (never drawn, as on the CPU): thresholds, masses, the draw and its fallback then
  // see one value for it, so a row with nothing finite gives its lowest id, whatever the filters or the sharding.
  auto value = [&](int i) {
    const float v = i < cached ? cache[i] : __ldcs(z + begin + i);
    return isnan(v) ? -INFINITY : v;
  };
  auto slice_id = [&](int i) { return begin + i; };

  // Max (and argmax for greedy) of the slice.
  float best = -INFINITY;
  int best_id = 0x7fffffff;
  for_each_value(n, value, [&](float v, int i) {
    if (pair_better(v, begin + i, best, best_id)) best = v, best_id = begin + i;
  });
  block_argmax(best, best_id, sh.sv, sh.si);

  // Candidate path of a row handled by one block (batches of at least the SM count, or no workspace;
  // top-k ≤ 256): the k-th largest value of the cached part is at most the row's, so the values at or above
  // it hold every value of the row's top k and all its ties. One more pass collects them, and every filter
  // and the draw run on that list: two passes over the uncached part of the row instead of ten. The list
  // gives the same thresholds, kept set and winner as the row.
  if (blocks == 1 && !greedy && p.top_k > 0 && p.top_k <= kFastMaxK && p.top_k < vocab) {
    __shared__ float solo_val[kSoloCap];
    __shared__ int solo_id[kSoloCap];
    const uint32_t tau_c = local_topk_threshold(sh, min(n, cached), value, p.top_k);
    if (threadIdx.x == 0) cand_count = 0;
    __syncthreads();
    for_each_value(n, value, [&](float v, int i) {
      if (detail::order_key(v) >= tau_c) {
        const int slot = atomicAdd(&cand_count, 1);
        if (slot < kSoloCap) solo_val[slot] = v, solo_id[slot] = begin + i;
      }
    });
    __syncthreads();
    const int total = cand_count;
    if (total <= kSoloCap) {
      float win;
      int win_id;
      select_and_draw(
          sh, nullptr, false, 1, 0, generation, total, [&](int i) { return solo_val[i]; },
          [&](int i) { return solo_id[i]; }, p, vocab, inv_t, best * inv_t, vocab_offset, win, win_id);
      if (threadIdx.x == 0) {
        out_ids[row] = static_cast<int32_t>(vocab_offset + (win_id == 0x7fffffff ? best_id : win_id));
        if (out_scores) out_scores[row] = win;
      }
      return;
    }
    // More than kSoloCap values tie at the threshold: the general path below.
  }

  // Candidate path (several blocks, top-k <= 256): each block sends the values at or above its own k-th
  // largest (k + ties, at most kCandCap) with its maximum; after one barrier block 0 runs every filter on
  // those candidates alone. They hold every value of the row's top k and every value at or above the
  // row's k-th largest, so thresholds, kept set and winner are those of the whole row.
  bool joint_rest = blocks > 1;  // whether the general path below still has to join the blocks' maxima
  if (blocks > 1 && !greedy && p.top_k > 0 && p.top_k <= kFastMaxK && p.top_k < vocab) {
    const uint32_t tau_c = local_topk_threshold(sh, n, value, p.top_k);
    if (threadIdx.x == 0) cand_count = 0;
    __syncthreads();
    for_each_value(n, value, [&](float v, int i) {
      if (detail::order_key(v) >= tau_c) {
        const int slot = atomicAdd(&cand_count, 1);
        if (slot < kCandCap) rs->cand_val[c][slot] = v, rs->cand_id[c][slot] = begin + i;
      }
    });
    __syncthreads();
    if (threadIdx.x == 0) rs->count[c] = cand_count, rs->best[c] = best, rs->best_id[c] = best_id;
    row_barrier(rs, blocks, ++generation);
    join_pairs(rs->best, rs->best_id, blocks, best, best_id);
    int counts[kMaxBlocksPerRow];
    bool overflow = false;
    int total = 0;
#pragma unroll
    for (int j = 0; j < kMaxBlocksPerRow; ++j) {
      counts[j] = j < blocks ? __ldcg(&rs->count[j]) : 0;
      overflow |= counts[j] > kCandCap;
      total += counts[j];
    }
    joint_rest = false;  // the maxima are joined
    if (!overflow) {
      if (c == 0) {
        // Candidates in block order (the order within a block does not matter: every step below is
        // order-independent), into the slice's shared memory, which this block no longer needs.
        float* cv = cache;
        int* ci = reinterpret_cast<int*>(cache + kMaxBlocksPerRow * kCandCap);
        int offset = 0;
        for (int j = 0; j < blocks; ++j) {
          for (int i = threadIdx.x; i < counts[j]; i += kThreads) {
            cv[offset + i] = __ldcg(&rs->cand_val[j][i]);
            ci[offset + i] = __ldcg(&rs->cand_id[j][i]);
          }
          offset += counts[j];
        }
        __syncthreads();
        float win;
        int win_id;
        select_and_draw(
            sh, rs, false, blocks, c, generation, total, [&](int i) { return cv[i]; }, [&](int i) { return ci[i]; }, p,
            vocab, inv_t, best * inv_t, vocab_offset, win, win_id);
        if (threadIdx.x == 0) {
          out_ids[row] = static_cast<int32_t>(vocab_offset + (win_id == 0x7fffffff ? best_id : win_id));
          if (out_scores) out_scores[row] = win;
        }
      }
      if (threadIdx.x == 0) {
        const unsigned int prev = atomicAdd(&rs->counter, 1u);
        if (prev == (generation + 1) * static_cast<unsigned int>(blocks) - 1) atomicExch(&rs->counter, 0u);
      }
      return;
    }
    // Too many ties for the candidate lists: the general path, its maxima already joined.
  }

  if (joint_rest) {
    if (threadIdx.x == 0) rs->best[c] = best, rs->best_id[c] = best_id;
    row_barrier(rs, blocks, ++generation);
    join_pairs(rs->best, rs->best_id, blocks, best, best_id);
  }
  if (greedy) {
    if (c == 0 && threadIdx.x == 0) {
      out_ids[row] = static_cast<int32_t>(vocab_offset + (best_id == 0x7fffffff ? 0 : best_id));
      if (out_scores) out_scores[row] = best;
    }
  } else {
    float win;
    int win_id;
    select_and_draw(sh, rs, blocks > 1, blocks, c, generation, n, value, slice_id, p, vocab, inv_t, best * inv_t,
                    vocab_offset, win, win_id);
    if (blocks > 1) {
      if (threadIdx.x == 0) rs->win[c] = win, rs->win_id[c] = win_id;
      row_barrier(rs, blocks, ++generation);
      join_pairs(rs->win, rs->win_id, blocks, win, win_id);
    }
    if (c == 0 && threadIdx.x == 0) {
      out_ids[row] = static_cast<int32_t>(vocab_offset + (win_id == 0x7fffffff ? best_id : win_id));
      if (out_scores) out_scores[row] = win;
    }
  }
  // Leave the counter at 0 for the next call: the last block out resets it (every block has passed its
  // last barrier by then, so nobody still waits on it).
  if (blocks > 1 && threadIdx.x == 0) {
    const unsigned int prev = atomicAdd(&rs->counter, 1u);
    if (prev == (generation + 1) * static_cast<unsigned int>(blocks) - 1) atomicExch(&rs->counter, 0u);
  }
}

struct Launch {
  int blocks = 1;
  int chunk = 0;
  int cached = 0;
  int smem = 0;
};

int current_sm_count() {
  int dev = 0, sms = 0;
  KIMIRT_CUDA_CHECK(cudaGetDevice(&dev));
  KIMIRT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

// Blocks per row: as many as keep every block of the launch resident at once (the row barrier waits for
// all of them), at most 16; one block per row when the batch alone fills the GPU or there is no workspace.
Launch plan_launch(int64_t rows, int64_t vocab, bool have_workspace) {
  Launch l;
  const int sms = current_sm_count();
  if (have_workspace && rows < sms) {
    l.blocks = static_cast<int>(std::clamp<int64_t>(sms / rows, 1, kMaxBlocksPerRow));
    l.blocks = static_cast<int>(std::min<int64_t>(l.blocks, (vocab + 1023) / 1024));
  }
  l.chunk = static_cast<int>((vocab + l.blocks - 1) / l.blocks);
  l.cached = std::min(l.chunk, kCacheFloats);
  l.smem = l.cached * 4;
  // Block 0 of a split row gathers the candidate lists (values and ids) into the same shared memory.
  if (l.blocks > 1) l.smem = std::max(l.smem, 2 * kMaxBlocksPerRow * kCandCap * 4);
  return l;
}

// join_candidates: one thread per row.
__global__ void join_candidates_kernel(const float* __restrict__ scores, const int32_t* __restrict__ ids, int ranks,
                                       int64_t stride, int64_t rows, float* __restrict__ out_scores,
                                       int32_t* __restrict__ out_ids) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  float best = scores[row];
  int32_t best_id = ids[row];
  for (int r = 1; r < ranks; ++r) {
    const float s = scores[r * stride + row];
    const int32_t id = ids[r * stride + row];
    if (pair_better(s, id, best, best_id)) best = s, best_id = id;
  }
  out_scores[row] = best;
  out_ids[row] = best_id;
}

}  // namespace

void validate(const SamplingParams& p) {
  KIMIRT_CUDA_REQUIRE(std::isfinite(p.temperature) && p.temperature >= 0.0f, "sampling: temperature ", p.temperature,
                      " must be finite and >= 0");
  KIMIRT_CUDA_REQUIRE(p.top_k >= 0, "sampling: top_k ", p.top_k, " must be >= 0");
  KIMIRT_CUDA_REQUIRE(p.top_p > 0.0f && p.top_p <= 1.0f, "sampling: top_p ", p.top_p, " must be in (0, 1]");
  KIMIRT_CUDA_REQUIRE(p.min_p >= 0.0f && p.min_p <= 1.0f, "sampling: min_p ", p.min_p, " must be in [0, 1]");
}

bool uses_filters(const SamplingParams& p, int64_t vocab) {
  if (is_greedy(p)) return false;  // greedy rows ignore the filters
  return (p.top_k > 0 && p.top_k < vocab) || p.top_p < 1.0f || p.min_p > 0.0f;
}

bool any_uses_filters(std::span<const SamplingParams> params, int64_t vocab) {
  for (const SamplingParams& p : params) {
    if (uses_filters(p, vocab)) return true;
  }
  return false;
}

uint64_t sampling_workspace_bytes(int64_t rows) {
  // Only batches smaller than the SM count split rows over blocks (plan_launch).
  const int64_t split_rows = std::min<int64_t>(std::max<int64_t>(rows, 0), current_sm_count());
  return static_cast<uint64_t>(split_rows) * sizeof(RowScratch);
}

void init_sampling_workspace(void* workspace, uint64_t bytes, cudaStream_t stream) {
  if (workspace && bytes) KIMIRT_CUDA_CHECK(cudaMemsetAsync(workspace, 0, bytes, stream));
}

void sample(cudaStream_t stream, const float* logits, int64_t ld, int64_t rows, int64_t vocab, int64_t vocab_offset,
            const SamplingParams* params, int32_t* out_ids, float* out_scores, void* workspace,
            uint64_t workspace_bytes) {
  // The kernel walks a row with int indices that run a few thousand past the end: vocab up to 2^30 (a 4 GiB
  // row) keeps them far from overflow.
  KIMIRT_CUDA_REQUIRE(rows >= 0 && rows <= 65535 && vocab > 0 && vocab <= (1ll << 30) && ld >= vocab, "sample: rows ",
                      rows, " (at most 65535), vocab ", vocab, " (1 to 2^30), row stride ", ld);
  // Ids leave as int32 (and the noise counter takes the id as 32 bits): every offset id must fit.
  KIMIRT_CUDA_REQUIRE(vocab_offset >= 0 && vocab_offset <= (1ll << 31) - vocab, "sample: vocab_offset ", vocab_offset,
                      " with vocab ", vocab, " puts ids outside [0, 2^31)");
  if (rows == 0) return;
  KIMIRT_CUDA_REQUIRE(logits && params && out_ids, "sample: null pointer");
  KIMIRT_CUDA_REQUIRE(!workspace || workspace_bytes >= sampling_workspace_bytes(rows), "sample: workspace of ",
                      workspace_bytes, " bytes for ", rows, " rows (needs ", sampling_workspace_bytes(rows), ")");
  const Launch l = plan_launch(rows, vocab, workspace != nullptr);
  KIMIRT_CUDA_REQUIRE(l.blocks == 1 || rows <= current_sm_count(), "sample: internal launch plan");
  ensure_dynamic_smem(reinterpret_cast<const void*>(&sample_kernel), kCacheFloats * 4);
  const dim3 grid(static_cast<unsigned>(l.blocks), static_cast<unsigned>(rows));
  // A split row's blocks wait for each other: launched cooperatively, a grid that cannot be resident at once
  // (fewer SMs than the device reports: an MPS limit, a green context) fails here instead of hanging.
  LaunchConfig config(grid, kThreads, l.smem, stream);
  config.cooperative(l.blocks > 1);
  KIMIRT_CUDA_CHECK(cudaLaunchKernelEx(config.get(), sample_kernel, logits, ld, static_cast<int>(vocab), vocab_offset,
                                       params, out_ids, out_scores, static_cast<RowScratch*>(workspace), l.blocks,
                                       l.chunk, l.cached));
}

void join_candidates(cudaStream_t stream, const float* scores, const int32_t* ids, int ranks, int64_t stride,
                     int64_t rows, float* out_scores, int32_t* out_ids) {
  KIMIRT_CUDA_REQUIRE(ranks > 0 && rows >= 0 && stride >= rows, "join_candidates: ranks ", ranks, ", rows ", rows,
                      ", stride ", stride);
  if (rows == 0) return;
  KIMIRT_CUDA_REQUIRE(scores && ids && out_scores && out_ids, "join_candidates: null pointer");
  KIMIRT_CUDA_REQUIRE((rows + 127) / 128 < (1ll << 31), "join_candidates: ", rows, " rows are too many");
  join_candidates_kernel<<<static_cast<unsigned>((rows + 127) / 128), 128, 0, stream>>>(scores, ids, ranks, stride,
                                                                                        rows, out_scores, out_ids);
  KIMIRT_CUDA_CHECK_LAUNCH();
}

}  // namespace kimirt::cuda
