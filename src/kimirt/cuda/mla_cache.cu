// MLA cache kernels: one warp per cached row (576 values = 72 vectors of 8).
#include "kimirt/cuda/check.h"
#include "kimirt/cuda/device_utils.cuh"
#include "kimirt/cuda/mla_cache.h"
#include "kimirt/cuda/mla_decode.h"

namespace kimirt::cuda {
namespace {

using detail::bf16;

constexpr int kVecs = kMlaRow / 8;           // 72
constexpr int kLatentVecs = kMlaLatent / 8;  // 64: lanes 0..31 take vectors lane and lane + 32

__global__ void kv_norm_append_kernel(const bf16* __restrict__ kv_a, int64_t ld_kv_a, const bf16* __restrict__ w,
                                      float eps, const int32_t* __restrict__ slots, int64_t tokens, bf16* cache,
                                      bf16* latent_out, int64_t ld_latent) {
  const int64_t t = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (t >= tokens) return;
  const bf16* src = kv_a + t * ld_kv_a;
  float v[2][8];
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    detail::unpack8(detail::load16(src + (lane + 32 * i) * 8), v[i]);
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += v[i][j] * v[i][j];
  }
  ss = detail::warp_sum(ss);
  const float rs = 1.0f / sqrtf(ss / static_cast<float>(kMlaLatent) + eps);
  const int32_t slot = slots[t];
  bf16* crow = slot >= 0 ? cache + static_cast<int64_t>(slot) * kMlaRow : nullptr;
  bf16* lrow = latent_out ? latent_out + t * ld_latent : nullptr;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int vi = lane + 32 * i;
    const uint4 packed = detail::normalize8(v[i], rs, detail::load16(w + vi * 8));
    if (crow) detail::store16(crow + vi * 8, packed);
    if (lrow) detail::store16(lrow + vi * 8, packed);
  }
  if (lane < kVecs - kLatentVecs) {  // k_pe: copied unchanged
    const int vi = kLatentVecs + lane;
    const uint4 raw = detail::load16(src + vi * 8);
    if (crow) detail::store16(crow + vi * 8, raw);
    if (lrow) detail::store16(lrow + vi * 8, raw);
  }
}

__global__ void gather_latent_kernel(const bf16* __restrict__ cache, int page_size,
                                     const int32_t* __restrict__ block_table, int64_t ld_block_table,
                                     const int32_t* __restrict__ cu_out, const int32_t* __restrict__ first_rows,
                                     bf16* __restrict__ out) {
  const int b = blockIdx.y;
  const int row = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  const int begin = cu_out[b];
  if (row >= cu_out[b + 1] - begin) return;
  const int pos = (first_rows ? first_rows[b] : 0) + row;  // the row's position in its sequence
  const int64_t page = block_table[static_cast<int64_t>(b) * ld_block_table + pos / page_size];
  const bf16* src = cache + (page * page_size + pos % page_size) * kMlaRow;
  bf16* dst = out + static_cast<int64_t>(begin + row) * kMlaRow;
  for (int v = lane; v < kVecs; v += 32) detail::store16(dst + v * 8, detail::load16(src + v * 8));
}

__global__ void gate_mul_kernel(bf16* x, int64_t ldx, const bf16* __restrict__ gate, int64_t ld_gate, int64_t rows,
                                int64_t width) {
  const int64_t per_row = width / 8;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * per_row) return;
  const int64_t r = idx / per_row, c = (idx % per_row) * 8;
  float xv[8], gv[8];
  detail::unpack8(detail::load16(x + r * ldx + c), xv);
  detail::unpack8(detail::load16(gate + r * ld_gate + c), gv);
#pragma unroll
  for (int j = 0; j < 8; ++j) xv[j] *= detail::sigmoid(gv[j]);
  detail::store16(x + r * ldx + c, detail::pack8(xv));
}

// Blocks of 32×32 through shared memory: reads along n of kv_b rows, writes along k of w_uk_t rows.
__global__ void transpose_uk_kernel(const bf16* __restrict__ kv_b, bf16* __restrict__ w_uk_t) {
  __shared__ bf16 tile[32][33];
  const int h = blockIdx.z;
  const int n0 = blockIdx.x * 32, k0 = blockIdx.y * 32;
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    tile[i][threadIdx.x] = kv_b[(static_cast<int64_t>(h) * 256 + k0 + i) * kMlaLatent + n0 + threadIdx.x];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    w_uk_t[(static_cast<int64_t>(h) * kMlaLatent + n0 + i) * 128 + k0 + threadIdx.x] = tile[threadIdx.x][i];
  }
}

// One warp: per round 32 sequences, two inclusive warp scans (their cached rows, giving where each starts in the
// concatenation; then the rows the pass takes from each), the running totals carried by lane 31.
__global__ void context_chunk_offsets_kernel(const int32_t* __restrict__ cu_q, const int32_t* __restrict__ cu_k,
                                             int batch, int64_t first, int64_t keys, int32_t* __restrict__ cu_pass,
                                             int32_t* __restrict__ first_rows) {
  const int lane = threadIdx.x;
  int64_t ctx_total = 0, pass_total = 0;
  if (lane == 0) cu_pass[0] = 0;
  const auto scan = [&](int64_t v) {
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int64_t u = __shfl_up_sync(0xffffffffu, v, d);
      if (lane >= d) v += u;
    }
    return v;
  };
  for (int base = 0; base < batch; base += 32) {
    const int b = base + lane;
    const int64_t ctx =
        b < batch ? max(int64_t{0}, static_cast<int64_t>(cu_k[b + 1] - cu_k[b]) - (cu_q[b + 1] - cu_q[b])) : 0;
    const int64_t ctx_incl = scan(ctx);
    const int64_t off = ctx_total + ctx_incl - ctx;  // the sequence's first cached row in the concatenation
    const int64_t lo = max(off, first), hi = min(off + ctx, first + keys);
    const int64_t len = max(int64_t{0}, hi - lo);
    const int64_t len_incl = scan(len);
    if (b < batch) {
      cu_pass[b + 1] = static_cast<int32_t>(pass_total + len_incl);
      first_rows[b] = static_cast<int32_t>(len > 0 ? lo - off : 0);
    }
    ctx_total += __shfl_sync(0xffffffffu, ctx_incl, 31);
    pass_total += __shfl_sync(0xffffffffu, len_incl, 31);
  }
}

}  // namespace

void mla_transpose_uk(cudaStream_t stream, const __nv_bfloat16* kv_b, int64_t heads, __nv_bfloat16* w_uk_t) {
  KIMIRT_CUDA_REQUIRE(heads > 0 && heads <= 65535 && kv_b && w_uk_t, "mla_transpose_uk: heads ", heads,
                      " or a null pointer");
  transpose_uk_kernel<<<dim3(kMlaLatent / 32, 128 / 32, static_cast<unsigned>(heads)), dim3(32, 8), 0, stream>>>(
      kv_b, w_uk_t);
  KIMIRT_CUDA_CHECK_LAUNCH();
}

void mla_kv_norm_append(cudaStream_t stream, const __nv_bfloat16* kv_a, int64_t ld_kv_a, const __nv_bfloat16* w,
                        float eps, const int32_t* slots, int64_t tokens, __nv_bfloat16* cache,
                        __nv_bfloat16* latent_out, int64_t ld_latent) {
  KIMIRT_CUDA_REQUIRE(tokens >= 0, "mla_kv_norm_append: token count ", tokens);
  check_norm_eps("mla_kv_norm_append", "eps", eps);
  if (tokens == 0) return;
  KIMIRT_CUDA_REQUIRE(kv_a && w && slots && cache, "mla_kv_norm_append: null pointer");
  KIMIRT_CUDA_REQUIRE(ld_kv_a >= kMlaRow && ld_kv_a % 8 == 0, "mla_kv_norm_append: kv_a row stride ", ld_kv_a,
                      " must be >= 576 and a multiple of 8");
  KIMIRT_CUDA_REQUIRE(!latent_out || (ld_latent >= kMlaRow && ld_latent % 8 == 0 && detail::aligned16(latent_out)),
                      "mla_kv_norm_append: latent_out row stride ", ld_latent, " must be >= 576, a multiple of 8");
  KIMIRT_CUDA_REQUIRE(detail::aligned16(kv_a) && detail::aligned16(w) && detail::aligned16(cache),
                      "mla_kv_norm_append: kv_a, w and cache must be 16-byte aligned");
  const int threads = 256;
  const int64_t blocks = (tokens * 32 + threads - 1) / threads;  // a warp per token
  KIMIRT_CUDA_REQUIRE(blocks < (1ll << 31), "mla_kv_norm_append: ", tokens, " tokens are too many");
  kv_norm_append_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(kv_a, ld_kv_a, w, eps, slots, tokens,
                                                                               cache, latent_out, ld_latent);
  KIMIRT_CUDA_CHECK_LAUNCH();
}

void mla_gather_latent(cudaStream_t stream, const __nv_bfloat16* cache, int page_size, const int32_t* block_table,
                       int64_t ld_block_table, const int32_t* cu_out, int batch, int max_len, __nv_bfloat16* out,
                       const int32_t* first_rows) {
  KIMIRT_CUDA_REQUIRE(batch >= 0 && batch <= 65535 && max_len >= 0, "mla_gather_latent: batch ", batch, ", max_len ",
                      max_len);
  if (batch == 0 || max_len == 0) return;
  KIMIRT_CUDA_REQUIRE(
      page_size > 0 && cache && block_table && cu_out && out && detail::aligned16(cache) && detail::aligned16(out),
      "mla_gather_latent: page_size ", page_size, " or a null/unaligned pointer");
  // Each sequence's table row holds ld_block_table pages: a row stride of 0 would give every sequence the first
  // one's pages. (max_len only sizes the grid: the rows gathered come from cu_out, on the device.)
  KIMIRT_CUDA_REQUIRE(ld_block_table > 0, "mla_gather_latent: ld_block_table ", ld_block_table,
                      " (pages per sequence's table row) must be positive");
  const int rows_per_block = 8;
  const dim3 grid(static_cast<unsigned>((int64_t{max_len} + rows_per_block - 1) / rows_per_block),
                  static_cast<unsigned>(batch));
  gather_latent_kernel<<<grid, rows_per_block * 32, 0, stream>>>(cache, page_size, block_table, ld_block_table, cu_out,
                                                                 first_rows, out);
  KIMIRT_CUDA_CHECK_LAUNCH();
}

void mla_context_chunk_offsets(cudaStream_t stream, const int32_t* cu_q, const int32_t* cu_k, int batch, int64_t first,
                               int64_t keys, int32_t* cu_pass, int32_t* first_rows) {
  KIMIRT_CUDA_REQUIRE(
      batch >= 0 && first >= 0 && keys > 0 && keys < (int64_t{1} << 31) && cu_q && cu_k && cu_pass && first_rows,
      "mla_context_chunk_offsets: batch ", batch, ", first ", first, ", keys ", keys,
      " (below 2^31) or a null pointer");
  context_chunk_offsets_kernel<<<1, 32, 0, stream>>>(cu_q, cu_k, batch, first, keys, cu_pass, first_rows);
  KIMIRT_CUDA_CHECK_LAUNCH();
}

void sigmoid_gate_mul(cudaStream_t stream, __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* gate, int64_t ld_gate,
                      int64_t rows, int64_t width) {
  KIMIRT_CUDA_REQUIRE(
      rows >= 0 && width > 0 && width % 8 == 0 && ldx >= width && ldx % 8 == 0 && ld_gate >= width && ld_gate % 8 == 0,
      "sigmoid_gate_mul: width ", width, " and strides (", ldx, ", ", ld_gate, ") must be multiples of 8");
  if (rows == 0) return;
  KIMIRT_CUDA_REQUIRE(x && gate && detail::aligned16(x) && detail::aligned16(gate),
                      "sigmoid_gate_mul: x and gate must be non-null and 16-byte aligned");
  const int64_t total = rows * (width / 8);
  const int threads = 256;
  KIMIRT_CUDA_REQUIRE((total + threads - 1) / threads < (1ll << 31), "sigmoid_gate_mul: ", rows, " x ", width,
                      " is too large");
  gate_mul_kernel<<<static_cast<unsigned>((total + threads - 1) / threads), threads, 0, stream>>>(x, ldx, gate, ld_gate,
                                                                                                  rows, width);
  KIMIRT_CUDA_CHECK_LAUNCH();
}

}  // namespace kimirt::cuda
