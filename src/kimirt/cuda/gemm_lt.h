// cuBLASLt GEMMs in the layout of the checkpoints: row-major activations x [M, K], weights W [N, K] as
// stored (nn.Linear), y = x · Wᵀ [M, N]; fp32 accumulation.
//
//   linear_bf16  BF16 x, BF16 W, BF16 or fp32 y (fp32 y is the router's logits GEMM: bf16 products are exact
//                in fp32, so only the summation order differs from an fp32 GEMM).
//   batched_bf16 strided batches, W optionally not transposed (y = x · W): the per-head MLA absorption.
//   linear_fp8   E4M3 x with 1×128 scales (VEC128_32F) and E4M3 W with 128×128 block scales
//                (BLK128x128_32F), BF16 y. Layouts of the scale tensors are those cuBLASLt documents:
//                  x scales: [ceil(K/128)][m_pad], m_pad = round_up(M, 4), token index fastest;
//                  W scales: [ceil(N/128)][round_up(ceil(K/128), 4)], K-block index fastest.
//                quantize_fp8.h writes both.
//
// The algorithm (and the descriptors) are cached per shape, strides and pointer alignment, up to
// GemmLtOptions::max_plans plans. By default the first call of a shape autotunes (or takes the choice tuned
// for another m of its power-of-two bucket): it times the heuristic's candidates on its own operands and keeps the
// fastest (gemm_lt.cpp says when it does not); warm every shape up before capturing a graph. One GemmLt per
// stream: the workspace is shared by every call made through this object.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "kimirt/cuda/gemm_types.h"

namespace kimirt::cuda {

struct LtCache;  // gemm_lt.cpp

struct GemmLtOptions {
  bool autotune = true;
  int max_candidates = 16;  // heuristic results considered per shape
  // Only calls that touch at least this many bytes are timed: smaller operands stay in the 50 MB L2 across
  // the timing runs, which then favour algorithms that are slower when the weights stream from HBM (as
  // they do in a decode step); those keep the heuristic's first choice.
  uint64_t min_tune_bytes = uint64_t{32} << 20;
  // Plans kept (one per exact shape, strides and alignment: a server meets every batch size and chunk length
  // in time). When full, the plans are dropped and rebuilt on use, which costs a heuristic query, not a tuning
  // run: the tuned choices are kept per bucket.
  uint64_t max_plans = 4096;
};

class GemmLt {
 public:
  // `workspace` (device, from the arena) may be null when workspace_bytes is 0.
  GemmLt(void* workspace, uint64_t workspace_bytes, GemmLtOptions options = {});
  ~GemmLt();
  GemmLt(const GemmLt&) = delete;
  GemmLt& operator=(const GemmLt&) = delete;

  // y[M, N] (row stride ldy) = x[M, K] (ldx) · w[N, K]ᵀ (ldw) + beta · y. beta is 0 or 1 (1 accumulates
  // into y, e.g. a residual). All strides in elements.
  void linear_bf16(cudaStream_t stream, const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w, int64_t ldw,
                   void* y, OutType y_type, int64_t ldy, int64_t m, int64_t n, int64_t k, float beta = 0.0f);

  // For b in [0, batch): y_b = x_b · op(w_b) with op(w) = wᵀ (w_b is [N, K]) when transpose_w, else w
  // (w_b is [K, N]). Pointers advance by the stride_* (elements) per batch entry.
  void batched_bf16(cudaStream_t stream, const __nv_bfloat16* x, int64_t ldx, int64_t stride_x, const __nv_bfloat16* w,
                    int64_t ldw, int64_t stride_w, bool transpose_w, void* y, OutType y_type, int64_t ldy,
                    int64_t stride_y, int64_t m, int64_t n, int64_t k, int64_t batch);

  // y[M, N] (BF16, ldy) = dequant(xq) · dequant(wq)ᵀ. xq [m_pad, K] E4M3 contiguous (row stride K), with
  // rows M..m_pad-1 present (zeros); wq [N, K] E4M3 contiguous. `d_scratch` receives the m_pad rows when
  // M % 4 != 0 (bytes: fp8_d_scratch_bytes), then the first M rows are copied to y.
  void linear_fp8(cudaStream_t stream, const uint8_t* xq, const float* x_scales, const uint8_t* wq,
                  const float* w_scales, __nv_bfloat16* y, int64_t ldy, int64_t m, int64_t n, int64_t k,
                  void* d_scratch, uint64_t d_scratch_bytes);

  uint64_t cached_plans() const;
  // One line per cached plan: the call, the algorithm chosen among how many candidates, its time when
  // autotuned, and the workspace it needs against the one given.
  std::string plans_text() const;

 private:
  void run_bf16(cudaStream_t stream, const void* x, int64_t ldx, int64_t stride_x, const void* w, int64_t ldw,
                int64_t stride_w, bool transpose_w, void* y, OutType y_type, int64_t ldy, int64_t stride_y, int64_t m,
                int64_t n, int64_t k, int64_t batch, float beta);

  // The handle, workspace and plans are the device's that was current at construction: calls check it still is.
  void check_device(const char* call) const;

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  uint64_t workspace_bytes_ = 0;
  GemmLtOptions options_;
  std::unique_ptr<LtCache> cache_;
  int device_ = 0;
};

inline int64_t fp8_pad_m(int64_t m) { return (m + 3) / 4 * 4; }
inline int64_t fp8_k_blocks(int64_t k) { return (k + 127) / 128; }
inline int64_t fp8_w_scale_cols(int64_t k) { return (fp8_k_blocks(k) + 3) / 4 * 4; }
// Elements of the activation scale tensor / the weight scale tensor.
inline int64_t fp8_x_scale_count(int64_t m, int64_t k) { return fp8_k_blocks(k) * fp8_pad_m(m); }
inline int64_t fp8_w_scale_count(int64_t n, int64_t k) { return (n + 127) / 128 * fp8_w_scale_cols(k); }
inline uint64_t fp8_d_scratch_bytes(int64_t m, int64_t n) {
  return m % 4 == 0 ? 0 : static_cast<uint64_t>(fp8_pad_m(m) * n) * 2;
}

}  // namespace kimirt::cuda
