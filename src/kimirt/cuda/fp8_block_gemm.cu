// FP8 block-scale GEMM on Hopper tensor cores, persistent and warp-specialized (the scheme DeepGEMM
// published for DeepSeek's 128×128-block FP8; our own code).
//
// Why a kernel of our own: cuBLASLt offers one algorithm for block scales (VEC128 x BLK128x128), measured at
// 1.25-1.69x its BF16 GEMM at M = 4096 on the H200 (docs/PERF.md), short of the 1.6x an FP8 path should give.
//
// Block = 3 warpgroups, one output tile of 128 x 128 at a time, tiles taken in a grouped order (8 row
// blocks side by side, so that a wave of blocks shares both operands' tiles through L2):
//   producer (warpgroup 2, one thread): per 128-wide K block, one tensor copy each of the activation tile
//     (128 x 128 E4M3 = 16 KB), the weight tile (16 KB), the tile's 128 activation scales and 4 K blocks'
//     weight scales (16 bytes, the smallest copy), into a ring of kStages stages that runs ahead across
//     tiles (the next tile's first stages land during this tile's epilogue);
//   consumers (warpgroups 0 and 1, 64 rows each): per K block, 4 wgmma m64n128k32 into an fp32 partial,
//     then acc += partial · (x scale of the row · weight scale of the block) on the CUDA cores
//     ("promotion": the scales change every 128 values of K, and the tensor cores' FP8 accumulator keeps
//     too few bits to sum the whole K; a version that rescaled the accumulator instead missed the per-output
//     bound, docs/PERF.md). Two partials alternate, so block kb + 1's wgmmas are queued while block kb is
//     promoted; the other warpgroup's wgmmas fill the rest.
//   epilogue: each consumer writes its 64 x 128 BF16 rows into shared memory in the 128-byte swizzle
//     (conflict-free) and one thread stores them with two tensor copies, which clip rows past M and
//     columns past N (in whole 16-byte chunks: n must be a multiple of 8); the copies finish while the next
//     tile's main loop runs.
#include <cuda.h>

#include <algorithm>
#include <string>
#include <utility>

#include "kimirt/cuda/async_pipeline.cuh"
#include "kimirt/cuda/check.h"
#include "kimirt/cuda/device_utils.cuh"
#include "kimirt/cuda/fp8_block_gemm.h"
#include "kimirt/cuda/gemm_lt.h"
#include "kimirt/cuda/kernel_attr.h"
#include "kimirt/cuda/tensor_map.h"
#include "kimirt/cuda/wgmma.cuh"

namespace kimirt::cuda {
namespace {

namespace fp8g {
constexpr int kBM = 128, kBN = 128, kBK = 128;  // kBK: one scale block of K, one swizzled row of E4M3
constexpr int kStages = 5;
constexpr int kGroupM = 8;
constexpr int kThreads = 384;
constexpr int kConsumerWarps = 8;
constexpr int kOperandBytes = kBM * kBK;  // an activation or weight tile (kBM == kBN)
constexpr int kScaleBytes = kBM * 4;
constexpr int kWScaleBytes = 16;           // 4 consecutive K blocks' weight scales (the smallest tensor copy)
constexpr int kWScaleSlot = 128;           // tensor copies land on 128-byte boundaries
constexpr int kOutBoxBytes = 64 * 64 * 2;  // one store box: 64 rows x 64 BF16 (a 128-byte swizzled row each)
constexpr uint32_t kStageTx = 2 * kOperandBytes + kScaleBytes + kWScaleBytes;
// Shared memory, from a 1024-byte boundary: [stage][activations], [stage][weights], per consumer two output
// boxes, [stage][activation scales], [stage][weight scales], the full and empty barriers.
constexpr int kSmemA = 0;
constexpr int kSmemB = kSmemA + kStages * kOperandBytes;
constexpr int kSmemOut = kSmemB + kStages * kOperandBytes;
constexpr int kSmemScale = kSmemOut + 4 * kOutBoxBytes;
constexpr int kSmemWScale = kSmemScale + kStages * kScaleBytes;
constexpr int kSmemBars = kSmemWScale + kStages * kWScaleSlot;
constexpr int kSmemBytes = kSmemBars + 2 * kStages * 8 + 1024;  // + the alignment slack
static_assert(kSmemBytes <= 227 * 1024, "FP8 GEMM shared memory");
}  // namespace fp8g

// Unit index -> (row block, column unit): groups of kGroupM row blocks, row block fastest, so that the
// blocks running at once share a few weight tiles and a few activation tiles.
__device__ __forceinline__ void unit_coords(int unit, int num_m, int num_units_n, int& mb, int& nu) {
  const int per_group = fp8g::kGroupM * num_units_n;
  const int group = unit / per_group;
  const int first_m = group * fp8g::kGroupM;
  const int rows = min(fp8g::kGroupM, num_m - first_m);
  const int in = unit - group * per_group;
  mb = first_m + in % rows;
  nu = in / rows;
}

__device__ __forceinline__ void st_shared_b32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

// A K block whose wgmmas are in flight: its stage, and its two rows' combined scales.
struct Pending {
  uint32_t stage;
  float s0, s1;
};

// A consumer warpgroup's side of the stage ring: waits for a stage, issues its wgmmas into a partial,
// then (once they completed) releases the stage and promotes the partial into the accumulator.
template <int kCluster>
struct Ring {
  uint32_t base;
  const float* xs;  // this thread's row r of the stage-0 activation scales (row r + 8 follows at +8)
  const float* ws;
  uint32_t a_wg;  // this warpgroup's 64 rows of the stage-0 activation tile
  int lane;
  uint32_t rank;
  uint32_t s = 0, phase = 0;

  __device__ __forceinline__ Pending issue(float (&p)[64], int kb) {
    using namespace fp8g;
    detail::mbar_wait(base + kSmemBars + 8 * s, phase);
    const uint64_t da = detail::wgmma_desc_sw128(a_wg + s * kOperandBytes, 0, 1024);
    const uint64_t db = detail::wgmma_desc_sw128(base + kSmemB + s * kOperandBytes, 0, 1024);
    detail::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) detail::wgmma_m64n128k32_e4m3_ss(p, da + 2 * kk, db + 2 * kk, kk > 0);
    detail::wgmma_commit();
    const float sb = ws[s * (kWScaleSlot / 4) + (kb & 3)];
    const Pending pd{s, xs[s * kBM] * sb, xs[s * kBM + 8] * sb};
    if (++s == kStages) s = 0, phase ^= 1;
    return pd;
  }

  // After the wgmma wait that covers p's group.
  __device__ __forceinline__ void retire(float (&acc)[64], float (&p)[64], const Pending& pd) {
    using namespace fp8g;
    detail::fence_regs(p);
    const uint32_t empty = base + kSmemBars + 8 * kStages + 8 * pd.stage;
    __syncwarp();  // every lane's reads of the stage's scales precede the release that lane 0 (and 1) make
    if (lane == 0) detail::mbar_arrive(empty);  // the stage (its scales included) is read
    if constexpr (kCluster > 1) {
      if (lane == 1) detail::mbar_arrive_remote(detail::cluster_map(empty, rank ^ 1));
    }
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      acc[4 * j] = fmaf(p[4 * j], pd.s0, acc[4 * j]);
      acc[4 * j + 1] = fmaf(p[4 * j + 1], pd.s0, acc[4 * j + 1]);
      acc[4 * j + 2] = fmaf(p[4 * j + 2], pd.s1, acc[4 * j + 2]);
      acc[4 * j + 3] = fmaf(p[4 * j + 3], pd.s1, acc[4 * j + 3]);
    }
  }
};

// kCluster = 2: the blocks of a cluster take the two column blocks of a unit (same row block), and each
// copies half of the shared activation tile into both (TMA multicast), so L2 serves 3/4 of the bytes. A
// stage is then refilled only when the consumers of both blocks have released it: every consumer warp
// arrives on the empty barrier of each block.
template <int kCluster, int kInFlight>
__global__ void __launch_bounds__(fp8g::kThreads, 1)
    fp8_block_gemm_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map,
                          const __grid_constant__ CUtensorMap xs_map, const __grid_constant__ CUtensorMap ws_map,
                          const __grid_constant__ CUtensorMap y_map, int num_m, int num_n, int k_blocks) {
  using namespace fp8g;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = detail::smem_aligned_1024(smem_raw);
  uint32_t base = detail::smem_addr(smem);
  asm volatile("" : "+r"(base));  // kept, not rederived in the loops (from the cluster CTA id, a slow read)
  const uint32_t full0 = base + kSmemBars, empty0 = full0 + 8 * kStages;
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  const uint32_t rank = kCluster > 1 ? detail::cluster_ctarank() : 0;
  const int num_units_n = num_n / kCluster;
  const int units = num_m * num_units_n;
  const int first_unit = blockIdx.x / kCluster, unit_stride = gridDim.x / kCluster;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      detail::mbar_init(full0 + 8 * s, 1);
      detail::mbar_init(empty0 + 8 * s, kConsumerWarps * kCluster);
    }
    detail::mbar_init_fence();
  }
  if constexpr (kCluster > 1) {
    detail::cluster_arrive_relaxed();  // the peer's barriers are initialized before any copy or arrival
    detail::cluster_wait();
  } else {
    __syncthreads();
  }

  if (wg == 2) {
    // 384 threads get 168 registers each at launch; the producer keeps 40 and the consumers take 232.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (t == 0) {
      int s = 0;
      uint32_t phase = 0;
      for (int unit = first_unit; unit < units; unit += unit_stride) {
        int mb, nu;
        unit_coords(unit, num_m, num_units_n, mb, nu);
        const int nb = nu * kCluster + static_cast<int>(rank);
        for (int kb = 0; kb < k_blocks; ++kb) {
          detail::mbar_wait(empty0 + 8 * s, phase ^ 1);  // the first round passes: the "previous" phase
          const uint32_t full = full0 + 8 * s;
          detail::mbar_expect_tx(full, kStageTx);
          if constexpr (kCluster > 1) {
            constexpr int kPart = kBM / kCluster;
            detail::tma_load_2d_multicast(base + kSmemA + s * kOperandBytes + rank * kPart * kBK, &x_map, kb * kBK,
                                          mb * kBM + static_cast<int>(rank) * kPart, full, (1u << kCluster) - 1);
          } else {
            detail::tma_load_2d(base + kSmemA + s * kOperandBytes, &x_map, kb * kBK, mb * kBM, full);
          }
          detail::tma_load_2d(base + kSmemB + s * kOperandBytes, &w_map, kb * kBK, nb * kBN, full);
          detail::tma_load_2d(base + kSmemScale + s * kScaleBytes, &xs_map, mb * kBM, kb, full);
          detail::tma_load_2d(base + kSmemWScale + s * kWScaleSlot, &ws_map, kb & ~3, nb, full);
          if (++s == kStages) s = 0, phase ^= 1;
        }
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int warp = t / 32, lane = t % 32;
    // The m64n128 accumulator layout: this thread holds rows r and r + 8 of its warpgroup's 64 (values 4j,
    // 4j+1 and 4j+2, 4j+3), columns 8j + 2·(lane % 4) + {0, 1}.
    const int r = warp * 16 + lane / 4;
    const uint32_t out = base + kSmemOut + wg * 2 * kOutBoxBytes;
    Ring<kCluster> ring{base,
                        reinterpret_cast<const float*>(smem + kSmemScale) + wg * 64 + r,
                        reinterpret_cast<const float*>(smem + kSmemWScale),
                        base + kSmemA + wg * 64 * kBK,
                        lane,
                        rank};
    float acc[64], p0[64], p1[64];
    // The finished tile of `unit` to y: into this warpgroup's two output boxes, then two tensor stores.
    const auto store = [&](int unit) {
      int mb, nu;
      unit_coords(unit, num_m, num_units_n, mb, nu);
      const int nb = nu * kCluster + static_cast<int>(rank);
      if (t == 0) detail::bulk_wait_group_read<0>();  // the previous tile's stores have read the boxes
      detail::named_barrier_sync(1 + wg, 128);
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        // Column block j: box j / 8, 16-byte chunk j % 8 of the row, swizzled by the row (r and r + 8 alike).
        const uint32_t at = out + (j / 8) * kOutBoxBytes + (((j % 8) ^ (r % 8)) * 16) + (lane % 4) * 4;
        st_shared_b32(at + r * 128, detail::pack_bf16x2(acc[4 * j], acc[4 * j + 1]));
        st_shared_b32(at + (r + 8) * 128, detail::pack_bf16x2(acc[4 * j + 2], acc[4 * j + 3]));
        acc[4 * j] = acc[4 * j + 1] = acc[4 * j + 2] = acc[4 * j + 3] = 0.0f;
      }
      detail::fence_proxy_async();
      detail::named_barrier_sync(1 + wg, 128);
      if (t == 0) {
        detail::tma_store_2d(&y_map, out, nb * kBN, mb * kBM + wg * 64);
        detail::tma_store_2d(&y_map, out + kOutBoxBytes, nb * kBN + 64, mb * kBM + wg * 64);
        detail::bulk_commit_group();
      }
    };
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    for (int unit = first_unit; unit < units; unit += unit_stride) {
      if constexpr (kInFlight == 1) {
        for (int kb = 0; kb < k_blocks; ++kb) {
          const Pending a = ring.issue(p0, kb);
          detail::wgmma_wait<0>();
          ring.retire(acc, p0, a);
        }
      } else {
        // Two K blocks in flight: block kb + 1's wgmmas are issued before block kb is promoted, so the tensor
        // cores have this warpgroup's next work queued while it scales and adds. (Carrying this across tiles,
        // so that the next tile's first block also covers the store, made ptxas serialize every wgmma: it
        // reports the store's reads of the accumulator inside a wgmma stage.)
        Pending a = ring.issue(p0, 0), b;
        for (int kb = 0;; kb += 2) {
          if (kb + 1 == k_blocks) {
            detail::wgmma_wait<0>();
            ring.retire(acc, p0, a);
            break;
          }
          b = ring.issue(p1, kb + 1);
          detail::wgmma_wait<1>();
          ring.retire(acc, p0, a);
          if (kb + 2 == k_blocks) {
            detail::wgmma_wait<0>();
            ring.retire(acc, p1, b);
            break;
          }
          a = ring.issue(p0, kb + 2);
          detail::wgmma_wait<1>();
          ring.retire(acc, p1, b);
        }
      }
      store(unit);
    }
    if (t == 0) detail::bulk_wait_group<0>();  // the boxes stay valid until the last stores have read them
  }
  if constexpr (kCluster > 1) {
    // No block leaves while its peer may still arrive on its barriers. The warps reconverge first (the
    // producer's and the storing threads' branches above): the .aligned barrier wants whole warps.
    __syncwarp();
    detail::cluster_arrive();
    detail::cluster_wait();
  }
}

// The config's cluster size (0: fp8_block_gemm_cluster's choice), checked against the shape: pairs split the
// column blocks, so their number must be even. `caller` starts the error message, `context` ends it.
int resolved_cluster(const Fp8BlockGemmConfig& config, int64_t m, int64_t n, const char* caller,
                     const std::string& context) {
  const int cluster = config.cluster == 0 ? fp8_block_gemm_cluster(m, n) : config.cluster;
  const int64_t num_n = (n + fp8g::kBN - 1) / fp8g::kBN;
  KIMIRT_CUDA_REQUIRE(cluster == 1 || (cluster == 2 && num_n % 2 == 0), caller, ": cluster ", cluster,
                      " must be 1, or 2 with an even number of 128-column blocks (", num_n, ") at n ", n, context);
  return cluster;
}

}  // namespace

// Pairs share the activation tile's L2 reads, but every stage then waits for the slower block of the
// pair; on the H200 that cost more than it saved at every K3 shape measured (docs/PERF.md, 2026-11-30).
int fp8_block_gemm_cluster(int64_t /*m*/, int64_t /*n*/) { return 1; }

int fp8_block_gemm_blocks(int64_t m, int64_t n, int max_blocks, Fp8BlockGemmConfig config) {
  using namespace fp8g;
  const int cluster = resolved_cluster(config, m, n, "fp8_block_gemm_blocks", "");
  const int64_t units = (m + kBM - 1) / kBM * ((n + kBN - 1) / kBN / cluster);
  // Single blocks: max_blocks is the SM count (or fewer) and a block fits on any SM, so all run at once.
  if (cluster == 1) return static_cast<int>(std::min<int64_t>(units, max_blocks));
  const auto kernel = reinterpret_cast<const void*>(fp8_block_gemm_kernel<2, 2>);
  ensure_dynamic_smem(kernel, kSmemBytes);
  return 2 * static_cast<int>(
                 std::min<int64_t>({units, max_blocks / 2, max_active_clusters(kernel, 2, kThreads, kSmemBytes)}));
}

void fp8_block_gemm(cudaStream_t stream, const uint8_t* xq, const float* x_scales, const uint8_t* wq,
                    const float* w_scales, __nv_bfloat16* y, int64_t ldy, int64_t m, int64_t n, int64_t k,
                    int max_blocks, Fp8BlockGemmConfig config) {
  using namespace fp8g;
  const auto what = [&] { return cat(" in the FP8 block GEMM m=", m, " n=", n, " k=", k, " ldy=", ldy); };
  // Coordinates are ints in the kernel (tensor copies take 32-bit coordinates).
  constexpr int64_t kMaxDim = int64_t{1} << 30;
  KIMIRT_CUDA_REQUIRE(m >= 0 && m <= kMaxDim, "fp8_block_gemm: m ", m, " outside 0..2^30", what());
  // The tensor stores of y write whole 16-byte chunks of a row: past an n that is not a multiple of 8 they
  // wrote into the next columns (measured on the H200).
  KIMIRT_CUDA_REQUIRE(n > 0 && n <= kMaxDim && n % 8 == 0, "fp8_block_gemm: n ", n,
                      " must be a positive multiple of 8 up to 2^30", what());
  KIMIRT_CUDA_REQUIRE(k > 0 && k <= kMaxDim && k % 128 == 0, "fp8_block_gemm: k ", k,
                      " must be a positive multiple of 128 (one scale per 128 inputs) up to 2^30", what());
  KIMIRT_CUDA_REQUIRE(ldy >= n && ldy % 8 == 0, "fp8_block_gemm: ldy ", ldy, " must be >= n and a multiple of 8",
                      what());
  const int num_m = static_cast<int>((m + kBM - 1) / kBM), num_n = static_cast<int>((n + kBN - 1) / kBN);
  KIMIRT_CUDA_REQUIRE(static_cast<int64_t>(num_m) * num_n < (int64_t{1} << 31), "fp8_block_gemm: ", num_m, " x ", num_n,
                      " tiles are too many", what());
  const int in_flight = config.in_flight == 0 ? 2 : config.in_flight;
  KIMIRT_CUDA_REQUIRE(in_flight == 1 || in_flight == 2, "fp8_block_gemm: in_flight ", config.in_flight,
                      " must be 1 or 2", what());
  const int cluster = resolved_cluster(config, m, n, "fp8_block_gemm", what());
  KIMIRT_CUDA_REQUIRE(max_blocks >= cluster, "fp8_block_gemm: max_blocks ", max_blocks,
                      " must be at least the cluster ", cluster, what());
  if (m == 0) return;
  const std::pair<const char*, const void*> operands[] = {
      {"xq", xq}, {"x_scales", x_scales}, {"wq", wq}, {"w_scales", w_scales}, {"y", y}};
  for (const auto& [name, ptr] : operands) {
    KIMIRT_CUDA_REQUIRE(ptr, "fp8_block_gemm: ", name, " is null", what());
    KIMIRT_CUDA_REQUIRE(detail::aligned16(ptr), "fp8_block_gemm: ", name, " must be 16-byte aligned", what());
  }

  const int64_t m_pad = fp8_pad_m(m);
  const uint64_t ku = static_cast<uint64_t>(k), ws_cols = static_cast<uint64_t>(fp8_w_scale_cols(k));
  const uint64_t x_dims[2] = {ku, static_cast<uint64_t>(m_pad)}, x_strides[1] = {ku};
  const uint64_t w_dims[2] = {ku, static_cast<uint64_t>(n)}, w_strides[1] = {ku};
  const uint64_t xs_dims[2] = {static_cast<uint64_t>(m_pad), ku / 128}, xs_strides[1] = {m_pad * 4ull};
  const uint64_t ws_dims[2] = {ws_cols, static_cast<uint64_t>(num_n)}, ws_strides[1] = {ws_cols * 4};
  const uint64_t y_dims[2] = {static_cast<uint64_t>(n), static_cast<uint64_t>(m)}, y_strides[1] = {ldy * 2ull};
  const uint32_t x_box[2] = {kBK, static_cast<uint32_t>(kBM / cluster)}, w_box[2] = {kBK, kBN};
  const uint32_t xs_box[2] = {kBM, 1}, ws_box[2] = {4, 1}, y_box[2] = {64, 64};
  const CUtensorMap x_map = make_tensor_map(CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, xq, x_dims, x_strides, x_box,
                                            CU_TENSOR_MAP_SWIZZLE_128B, cat("xq", what()));
  const CUtensorMap w_map = make_tensor_map(CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, wq, w_dims, w_strides, w_box,
                                            CU_TENSOR_MAP_SWIZZLE_128B, cat("wq", what()));
  const CUtensorMap xs_map = make_tensor_map(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, x_scales, xs_dims, xs_strides, xs_box,
                                             CU_TENSOR_MAP_SWIZZLE_NONE, cat("x_scales", what()));
  const CUtensorMap ws_map = make_tensor_map(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, w_scales, ws_dims, ws_strides, ws_box,
                                             CU_TENSOR_MAP_SWIZZLE_NONE, cat("w_scales", what()));
  const CUtensorMap y_map = make_tensor_map(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, y, y_dims, y_strides, y_box,
                                            CU_TENSOR_MAP_SWIZZLE_128B, cat("y", what()));
  const int k_blocks = static_cast<int>(k / 128);
  const bool two = in_flight == 2;
  const int grid = fp8_block_gemm_blocks(m, n, max_blocks, config);
  KIMIRT_CUDA_REQUIRE(grid > 0, "fp8_block_gemm: no cluster of ", cluster, " blocks fits on the device", what());
  const auto kernel = cluster == 1 ? (two ? fp8_block_gemm_kernel<1, 2> : fp8_block_gemm_kernel<1, 1>)
                                   : (two ? fp8_block_gemm_kernel<2, 2> : fp8_block_gemm_kernel<2, 1>);
  ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), kSmemBytes);
  LaunchConfig launch(dim3(static_cast<unsigned>(grid)), kThreads, kSmemBytes, stream);
  launch.cluster(cluster);
  KIMIRT_CUDA_CHECK(
      cudaLaunchKernelEx(launch.get(), kernel, x_map, w_map, xs_map, ws_map, y_map, num_m, num_n, k_blocks));
}

}  // namespace kimirt::cuda
