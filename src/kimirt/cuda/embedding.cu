// Embedding row gather: one block per token, 16-byte copies.
#include "kimirt/cuda/check.h"
#include "kimirt/cuda/device_utils.cuh"
#include "kimirt/cuda/embedding.h"

namespace kimirt::cuda {
namespace {

using detail::bf16;

__global__ void embedding_kernel(const bf16* __restrict__ table, int64_t vocab, int64_t hidden,
                                 const int32_t* __restrict__ ids, bf16* __restrict__ out, int64_t ld_out,
                                 int32_t* bad_ids) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  const bool ok = id >= 0 && id < vocab;
  if (!ok && threadIdx.x == 0 && bad_ids) atomicAdd(bad_ids, 1);
  const bf16* src = table + static_cast<int64_t>(ok ? id : 0) * hidden;
  bf16* dst = out + t * ld_out;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int64_t v = threadIdx.x; v < hidden / 8; v += blockDim.x) {
    detail::store16(dst + v * 8, ok ? detail::ldcs16(src + v * 8) : zero);
  }
}

}  // namespace

void embedding_gather(cudaStream_t stream, const __nv_bfloat16* table, int64_t vocab, int64_t hidden,
                      const int32_t* ids, int64_t tokens, __nv_bfloat16* out, int64_t ld_out, int32_t* bad_ids) {
  KIMIRT_CUDA_REQUIRE(tokens >= 0 && tokens < (1ll << 31), "embedding_gather: token count ", tokens);
  if (tokens == 0) return;
  KIMIRT_CUDA_REQUIRE(vocab > 0 && hidden > 0 && hidden % 8 == 0, "embedding_gather: hidden ", hidden,
                      " must be a positive multiple of 8 (vocab ", vocab, ")");
  KIMIRT_CUDA_REQUIRE(ld_out >= hidden && ld_out % 8 == 0, "embedding_gather: output row stride ", ld_out,
                      " must be >= hidden and a multiple of 8");
  KIMIRT_CUDA_REQUIRE(table && ids && out && detail::aligned16(table) && detail::aligned16(out),
                      "embedding_gather: table and out must be non-null and 16-byte aligned");
  const int threads = hidden / 8 >= 256 ? 256 : 128;
  embedding_kernel<<<static_cast<unsigned>(tokens), threads, 0, stream>>>(table, vocab, hidden, ids, out, ld_out,
                                                                          bad_ids);
  KIMIRT_CUDA_CHECK_LAUNCH();
}

}  // namespace kimirt::cuda
