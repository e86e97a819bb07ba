// Linear layers: picks, per call shape, the BF16 skinny kernels (gemv.h) or cuBLASLt (gemm_lt.h) from a
// table of measured crossover points, and for FP8 block-scale weights our kernel (fp8_block_gemm.h) or
// cuBLASLt's. `kimirt-bench --only gemm` measures the paths at the model's shapes and writes the table
// (text: one "n k max_skinny_m [config]" line per BF16 shape, config the fastest skinny kernel at M = 1 and
// 2, e.g. "rows2x1" or "mma"; "fp8 n k m ours|cublaslt" lines, the faster FP8 path per shape and measured M);
// load it with GemmTable::load, or copy its rows into the builtin rows of gemm_dispatch.cpp.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "kimirt/cuda/gemm_lt.h"
#include "kimirt/cuda/gemm_types.h"
#include "kimirt/cuda/gemv.h"

namespace kimirt::cuda {

// Which FP8 block-scale GEMM runs a shape: fp8_block_gemm (ours) or GemmLt::linear_fp8 (cuBLASLt).
enum class Fp8Path { kOurs, kCublasLt };
const char* fp8_path_name(Fp8Path p);  // "ours" / "cublaslt"

class GemmTable {
 public:
  // The compiled-in table (see gemm_dispatch.cpp for where its numbers come from).
  static GemmTable builtin();
  // Parses "n k max_skinny_m [config]" and "fp8 n k m ours|cublaslt" lines ('#' starts a comment; "* * m"
  // sets the default; "fp8 n k ours|cublaslt", from tables written before the FP8 rows had an M, was
  // measured at M = 4096 and is read as such). Throws kimirt::Error naming the file and line.
  static GemmTable load(const std::string& path);

  // Largest M for which the skinny kernel beats cuBLASLt on an [n, k] weight (0: never).
  int max_skinny_m(int64_t n, int64_t k) const;
  // The skinny kernel measured fastest on an [n, k] weight at M ≤ 2 (none: skinny_gemm's own choice).
  std::optional<SkinnyConfig> config(int64_t n, int64_t k) const;
  void set(int64_t n, int64_t k, int max_m, std::optional<SkinnyConfig> config = std::nullopt) {
    rows_[{n, k}] = Row{max_m, config};
  }
  // The FP8 block-scale path for an [n, k] weight at M rows: the row of that shape measured at the M nearest
  // to it by ratio (a tie takes the larger); shapes not listed take ours. Rows are measured at a few M (the
  // GEMM bench: 64, 256, 1024, 4096), since tile shapes that win a prefill can lose a decode batch.
  Fp8Path fp8_path(int64_t n, int64_t k, int64_t m) const;
  void set_fp8(int64_t n, int64_t k, int64_t m, Fp8Path path) { fp8_rows_[{n, k}][m] = path; }
  void set_default(int max_m) { default_max_m_ = max_m; }
  std::string to_text() const;

 private:
  struct Row {
    int max_m = 0;
    std::optional<SkinnyConfig> config;
  };
  std::map<std::pair<int64_t, int64_t>, Row> rows_;
  std::map<std::pair<int64_t, int64_t>, std::map<int64_t, Fp8Path>> fp8_rows_;  // [n, k] -> measured M -> path
  int default_max_m_ = 0;
};

// "rows2x1" (rows kernel, 2 rows per warp, K in 1 split) or "mma"; parse throws kimirt::Error naming the text.
std::string skinny_config_name(const SkinnyConfig& c);
SkinnyConfig parse_skinny_config(const std::string& text);

class Linear {
 public:
  // `skinny_workspace` holds the split-K partial sums of the skinny kernel (a few MiB; see
  // skinny_gemm_workspace_bytes); it must not be used by another stream concurrently.
  Linear(GemmLt& lt, void* skinny_workspace, uint64_t skinny_workspace_bytes, int sm_count,
         GemmTable table = GemmTable::builtin());

  // y[m, n] = x[m, k] · w[n, k]ᵀ (+ y when beta = 1), strides in elements.
  void operator()(cudaStream_t stream, const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w, int64_t ldw,
                  void* y, OutType y_type, int64_t ldy, int64_t m, int64_t n, int64_t k, float beta = 0.0f);
  // Contiguous operands.
  void operator()(cudaStream_t stream, const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, OutType y_type,
                  int64_t m, int64_t n, int64_t k, float beta = 0.0f) {
    (*this)(stream, x, k, w, k, y, y_type, n, m, n, k, beta);
  }

  // y[m, n] = rms_norm(x) · w[n, k]ᵀ with contiguous operands (x [m, k] normed per row with norm_weight [k]
  // and eps, as rms_norm does). Where the shape takes the skinny kernel the norm is fused into it
  // (SkinnyGemmArgs::x_norm: one launch, x_normed untouched); otherwise rms_norm writes x_normed [m, k]
  // (which may be x itself) and the product reads it.
  void rms_normed(cudaStream_t stream, const __nv_bfloat16* x, const __nv_bfloat16* norm_weight, float eps,
                  __nv_bfloat16* x_normed, const __nv_bfloat16* w, void* y, OutType y_type, int64_t m, int64_t n,
                  int64_t k);
  // y[m, n] = x[m, k] · w[n, k]ᵀ (contiguous operands, beta 0) on at most `sms` SMs, to run beside a kernel
  // that takes the others: the rows kernel's persistent grid (SkinnyConfig::max_blocks), one block alone on
  // each of its SMs, K never split. One token only (m = 1: a decode step at batch 1). The dispatch table is
  // not consulted, since only this kernel can keep to a set of SMs; for the MLA gate's shape (12288x7168) it
  // is also the table's choice (rows2x1), while narrower shapes are faster with K split over warps
  // (kimirt-bench --only gemm). Returns false, launching nothing, for m > 1, k <= 2048 (the MMA kernel's
  // shapes) or misaligned operands: run the product as usual then.
  bool on_sms(cudaStream_t stream, const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, OutType y_type, int64_t m,
              int64_t n, int64_t k, int sms);
  // Strided batches of y_b = x_b · w_bᵀ (w_b [n, k]); pointers advance by the strides (elements). gate
  // (optional; BF16 y, each token's outputs contiguous: stride_y = n): y = bf16(y · σ(gate)), gate laid out
  // as y, fused into the skinny kernel's store, or sigmoid_gate_mul after cuBLASLt.
  void batched(cudaStream_t stream, const __nv_bfloat16* x, int64_t ldx, int64_t stride_x, const __nv_bfloat16* w,
               int64_t ldw, int64_t stride_w, void* y, OutType y_type, int64_t ldy, int64_t stride_y, int64_t m,
               int64_t n, int64_t k, int64_t batch, const __nv_bfloat16* gate = nullptr);

  // y[m, n] (BF16, ldy) = dequant(xq) · dequant(wq)ᵀ, operands and scales as for GemmLt::linear_fp8, by the
  // path the table names for [n, k] at the M nearest to m; ours also runs what cuBLASLt cannot take (n % 16 != 0, or m
  // % 4 != 0 without d_scratch of fp8_d_scratch_bytes). Both need ldy % 8 == 0; ours also n % 8 == 0, k % 128 == 0
  // (whole scale blocks: every K3 shape) and 16-byte aligned operands, and refuses the rest naming the value. No
  // layer calls this yet (the model's FP8 weights are not on the GPU path).
  void fp8(cudaStream_t stream, const uint8_t* xq, const float* x_scales, const uint8_t* wq, const float* w_scales,
           __nv_bfloat16* y, int64_t ldy, int64_t m, int64_t n, int64_t k, void* d_scratch, uint64_t d_scratch_bytes);

  // Which path a call of this shape takes (alignment permitting).
  bool uses_skinny(int64_t m, int64_t n, int64_t k) const;
  GemmLt& lt() { return lt_; }
  const GemmTable& table() const { return table_; }
  int sm_count() const { return sm_count_; }

 private:
  GemmLt& lt_;
  void* skinny_workspace_;
  uint64_t skinny_workspace_bytes_;
  int sm_count_;
  GemmTable table_;
};

}  // namespace kimirt::cuda
