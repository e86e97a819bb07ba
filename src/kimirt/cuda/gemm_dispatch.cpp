// GEMM path selection.
#include "kimirt/cuda/gemm_dispatch.h"

#include <fmt/format.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <tuple>
#include <vector>

#include "kimirt/base/error.h"
#include "kimirt/cuda/fp8_block_gemm.h"
#include "kimirt/cuda/gemv.h"
#include "kimirt/cuda/mla_cache.h"  // sigmoid_gate_mul, the gate after cuBLASLt
#include "kimirt/cuda/rms_norm.h"   // Linear::rms_normed off the skinny path

namespace kimirt::cuda {
namespace {

// Measured on the H200 (1 GPU) by kimirt-bench --only gemm (docs/PERF.md, 2026-11-29): per K3 decode
// weight, the largest batch for which the fastest skinny kernel beats autotuned cuBLASLt, and that kernel
// at M <= 2 (MMA kernel above). Shapes not listed take the default and skinny_gemm's own choice.
constexpr int kBuiltinDefaultMaxM = 8;
struct BuiltinRow {
  int64_t n, k;
  int max_m;
  const char* config;
};
constexpr BuiltinRow kBuiltinRows[] = {
    {576, 7168, 16, "rows1x4"},    // mla.kv_a_proj_with_mqa
    {896, 7168, 8, "rows1x2"},     // router (fp32 logits)
    {1536, 7168, 1, "rows1x2"},    // mla.q_a_proj
    {3584, 7168, 2, "rows2x1"},    // latent MoE down (hidden -> latent)
    {7168, 3584, 1, "rows2x2"},    // latent MoE up
    {7168, 6144, 1, "rows1x1"},    // shared experts down
    {7168, 12288, 1, "rows1x2"},   // mla.o_proj
    {12288, 7168, 2, "rows2x1"},   // mla.g_proj, shared experts gate_up
    {18432, 1536, 8, "mma"},       // mla.q_b_proj
    {163840, 7168, 1, "rows2x1"},  // lm_head (fp32 logits)
};

// FP8 block-scale weights, our kernel against cuBLASLt's in the same runs (docs/PERF.md). At M = 4096
// (2026-11-30, three runs): ours 0.94-0.98x on 7168x7168 and 0.96-0.98x on 12288x7168, 1.08-1.11x on
// 18432x1536, 0.96-1.03x on 7168x12288 (a tie, ours kept). At M = 64 / 256 / 1024 (2026-11-30, machines K and
// L): 7168x7168 0.77-0.86 / 0.95-0.96 / 0.83-0.84x, 18432x1536 0.96-0.98 / 1.04-1.05 / 1.02-1.04x, 12288x7168
// 0.77-0.80 / 0.86-0.95 / 0.99-1.00x (a tie: cuBLASLt's, as at the neighbouring M), 7168x12288 0.68-0.78 /
// 0.92-1.08 / 0.95-0.96x (at 256 a tie: cuBLASLt's). Our 128 x 128 tiles leave SMs idle or a last wave short
// at small M (56 tiles at M = 64 on 7168 columns), where cuBLASLt picks other shapes.
struct BuiltinFp8Row {
  int64_t n, k, m;
  Fp8Path path;
};
constexpr BuiltinFp8Row kBuiltinFp8Rows[] = {
    // latent-sized square weights
    {7168, 7168, 64, Fp8Path::kCublasLt},
    {7168, 7168, 256, Fp8Path::kCublasLt},
    {7168, 7168, 1024, Fp8Path::kCublasLt},
    {7168, 7168, 4096, Fp8Path::kCublasLt},
    // mla.g_proj, shared experts gate_up
    {12288, 7168, 64, Fp8Path::kCublasLt},
    {12288, 7168, 256, Fp8Path::kCublasLt},
    {12288, 7168, 1024, Fp8Path::kCublasLt},  // a tie (1.00x, then 0.99x): as at 256 and 4096
    {12288, 7168, 4096, Fp8Path::kCublasLt},
    // mla.q_b_proj
    {18432, 1536, 64, Fp8Path::kCublasLt},
    {18432, 1536, 256, Fp8Path::kOurs},
    {18432, 1536, 1024, Fp8Path::kOurs},
    {18432, 1536, 4096, Fp8Path::kOurs},
    // mla.o_proj
    {7168, 12288, 64, Fp8Path::kCublasLt},
    {7168, 12288, 256, Fp8Path::kCublasLt},
    {7168, 12288, 1024, Fp8Path::kCublasLt},
    {7168, 12288, 4096, Fp8Path::kOurs},
};

Fp8Path parse_fp8_path(const std::string& text) {
  if (text == "ours") return Fp8Path::kOurs;
  if (text == "cublaslt") return Fp8Path::kCublasLt;
  fail("FP8 GEMM path \"{}\": expected \"ours\" or \"cublaslt\"", text);
}

// A table integer: decimal digits only (no sign, no spaces, at most 12 of them), as the GEMM bench writes
// them; nullopt for anything else, so that every field of a line is read by the same rule.
std::optional<int64_t> table_integer(const std::string& text) {
  if (text.empty() || text.size() > 12 || text.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  return std::stoll(text);
}

}  // namespace

const char* fp8_path_name(Fp8Path p) { return p == Fp8Path::kOurs ? "ours" : "cublaslt"; }

std::string skinny_config_name(const SkinnyConfig& c) {
  if (c.kernel == SkinnyConfig::Kernel::kMma) return "mma";
  if (c.kernel == SkinnyConfig::Kernel::kAuto) return "auto";
  return fmt::format("rows{}x{}", c.rows_per_warp, c.splits);
}

SkinnyConfig parse_skinny_config(const std::string& text) {
  SkinnyConfig c;
  if (text == "mma") {
    c.kernel = SkinnyConfig::Kernel::kMma;
    return c;
  }
  if (text == "auto") return c;
  // Exactly "rows" digit "x" digit: sscanf's %d would take signs, leading zeros and overflowing numbers.
  const bool shape = text.size() == 7 && text.compare(0, 4, "rows") == 0 && text[5] == 'x';
  const int rows = shape ? text[4] - '0' : 0, splits = shape ? text[6] - '0' : 0;
  const bool ok = shape && (rows == 1 || rows == 2) && (splits == 1 || splits == 2 || splits == 4 || splits == 8);
  KIMIRT_CHECK(ok, "skinny GEMM config \"{}\": expected \"mma\", \"auto\" or rows{{1,2}}x{{1,2,4,8}}", text);
  c.kernel = SkinnyConfig::Kernel::kRows;
  c.rows_per_warp = rows;
  c.splits = splits;
  return c;
}

GemmTable GemmTable::builtin() {
  GemmTable t;
  t.default_max_m_ = kBuiltinDefaultMaxM;
  for (const BuiltinRow& r : kBuiltinRows) t.set(r.n, r.k, r.max_m, parse_skinny_config(r.config));
  for (const BuiltinFp8Row& r : kBuiltinFp8Rows) t.set_fp8(r.n, r.k, r.m, r.path);
  return t;
}

GemmTable GemmTable::load(const std::string& path) {
  std::ifstream in(path);
  KIMIRT_CHECK(in.good(), "GEMM table {}: cannot open", path);
  GemmTable t;
  t.default_max_m_ = kBuiltinDefaultMaxM;
  std::string line;
  int line_no = 0;
  std::map<std::tuple<int64_t, int64_t, int64_t>, int> fp8_lines;  // (n, k, m) -> its line
  std::map<std::pair<int64_t, int64_t>, int> row_lines;            // (n, k) -> its line; (0, 0): "* *"
  const auto refuse_repeated_row = [&](int64_t n, int64_t k) {
    const auto [seen, fresh] = row_lines.try_emplace({n, k}, line_no);
    KIMIRT_CHECK(fresh, "GEMM table {}:{}: a second row for {} (line {})", path, line_no,
                 n ? fmt::format("{} {}", n, k) : std::string("* *"), seen->second);
  };
  while (std::getline(in, line)) {
    ++line_no;
    const auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream s(line);
    std::string n_text, k_text, max_m_text;
    if (!(s >> n_text)) continue;  // blank or comment
    const auto positive = [&](const std::string& n_s, const std::string& k_s) {
      const std::optional<int64_t> n = table_integer(n_s), k = table_integer(k_s);
      KIMIRT_CHECK(n && k && *n > 0 && *k > 0, "GEMM table {}:{}: n \"{}\" and k \"{}\" must be positive integers",
                   path, line_no, n_s, k_s);
      return std::pair{*n, *k};
    };
    if (n_text == "fp8") {
      // "fp8 n k m path", or "fp8 n k path" from a table written before the rows had an M (measured at 4096).
      std::vector<std::string> f;
      for (std::string w; s >> w;) f.push_back(w);
      KIMIRT_CHECK(f.size() >= 3, "GEMM table {}:{}: expected \"fp8 n k m ours|cublaslt\", got {} field(s) after fp8",
                   path, line_no, f.size());
      KIMIRT_CHECK(f.size() <= 4, "GEMM table {}:{}: unexpected \"{}\" after the path of \"fp8 n k m ours|cublaslt\"",
                   path, line_no, f[4]);
      const auto [n, k] = positive(f[0], f[1]);
      int64_t m = 4096;
      if (f.size() == 4) {
        m = table_integer(f[2]).value_or(0);
        KIMIRT_CHECK(m > 0, "GEMM table {}:{}: m \"{}\" must be a positive integer", path, line_no, f[2]);
      }
      const auto [seen, fresh] = fp8_lines.try_emplace({n, k, m}, line_no);
      KIMIRT_CHECK(fresh, "GEMM table {}:{}: a second row for fp8 {} {} at M = {} (line {})", path, line_no, n, k, m,
                   seen->second);
      t.set_fp8(n, k, m,
                with_context(fmt::format("GEMM table {}:{}", path, line_no), [&] { return parse_fp8_path(f.back()); }));
      continue;
    }
    KIMIRT_CHECK(static_cast<bool>(s >> k_text >> max_m_text),
                 "GEMM table {}:{}: expected \"n k max_skinny_m [config]\"", path, line_no);
    const std::optional<int64_t> max_m = table_integer(max_m_text);
    std::optional<SkinnyConfig> config;
    std::string config_text, rest;
    if (s >> config_text) {
      config = with_context(fmt::format("GEMM table {}:{}", path, line_no),
                            [&] { return parse_skinny_config(config_text); });
    }
    KIMIRT_CHECK(!(s >> rest), "GEMM table {}:{}: unexpected \"{}\" after four fields", path, line_no, rest);
    KIMIRT_CHECK(max_m && *max_m <= kSkinnyMaxM, "GEMM table {}:{}: max_skinny_m \"{}\" is not an integer in [0, {}]",
                 path, line_no, max_m_text, kSkinnyMaxM);
    if (n_text == "*" && k_text == "*") {
      KIMIRT_CHECK(!config, "GEMM table {}:{}: the default row takes no kernel config", path, line_no);
      refuse_repeated_row(0, 0);
      t.default_max_m_ = static_cast<int>(*max_m);
      continue;
    }
    const auto [n, k] = positive(n_text, k_text);
    refuse_repeated_row(n, k);
    t.set(n, k, static_cast<int>(*max_m), config);
  }
  KIMIRT_CHECK(!in.bad(), "GEMM table {}: a read error after line {}", path, line_no);
  return t;
}

int GemmTable::max_skinny_m(int64_t n, int64_t k) const {
  const auto it = rows_.find({n, k});
  return it == rows_.end() ? default_max_m_ : it->second.max_m;
}

std::optional<SkinnyConfig> GemmTable::config(int64_t n, int64_t k) const {
  const auto it = rows_.find({n, k});
  return it == rows_.end() ? std::nullopt : it->second.config;
}

Fp8Path GemmTable::fp8_path(int64_t n, int64_t k, int64_t m) const {
  const auto it = fp8_rows_.find({n, k});
  if (it == fp8_rows_.end()) return Fp8Path::kOurs;
  const std::map<int64_t, Fp8Path>& by_m = it->second;
  const auto above = by_m.lower_bound(m);  // the first measured M >= m
  if (above == by_m.begin()) return above->second;
  const auto below = std::prev(above);
  if (above == by_m.end()) return below->second;
  // Nearer by ratio: m / below against above / m, without dividing.
  return static_cast<double>(m) * m >= static_cast<double>(below->first) * above->first ? above->second : below->second;
}

std::string GemmTable::to_text() const {
  std::string out = "# n k max_skinny_m [config at M <= 2] | fp8 n k m ours|cublaslt   (kimirt GEMM dispatch table)\n";
  out += fmt::format("* * {}\n", default_max_m_);
  for (const auto& [nk, row] : rows_) {
    out += fmt::format("{} {} {}", nk.first, nk.second, row.max_m);
    if (row.config) out += fmt::format(" {}", skinny_config_name(*row.config));
    out += '\n';
  }
  for (const auto& [nk, by_m] : fp8_rows_) {
    for (const auto& [m, p] : by_m) out += fmt::format("fp8 {} {} {} {}\n", nk.first, nk.second, m, fp8_path_name(p));
  }
  return out;
}

Linear::Linear(GemmLt& lt, void* skinny_workspace, uint64_t skinny_workspace_bytes, int sm_count, GemmTable table)
    : lt_(lt),
      skinny_workspace_(skinny_workspace),
      skinny_workspace_bytes_(skinny_workspace ? skinny_workspace_bytes : 0),
      sm_count_(sm_count),
      table_(std::move(table)) {}

bool Linear::uses_skinny(int64_t m, int64_t n, int64_t k) const {
  return m >= 1 && m <= table_.max_skinny_m(n, k) && k % 32 == 0;
}

void Linear::operator()(cudaStream_t stream, const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w, int64_t ldw,
                        void* y, OutType y_type, int64_t ldy, int64_t m, int64_t n, int64_t k, float beta) {
  if (m == 0) return;
  if (uses_skinny(m, n, k)) {
    const SkinnyGemmArgs a{x, ldx, w, ldw, y, y_type, ldy, m, n, k, beta};
    if (skinny_gemm_supported(a)) {
      SkinnyConfig config;  // automatic
      if (m <= 2) config = table_.config(n, k).value_or(config);
      skinny_gemm(stream, a, skinny_workspace_, skinny_workspace_bytes_, sm_count_, config);
      return;
    }
  }
  lt_.linear_bf16(stream, x, ldx, w, ldw, y, y_type, ldy, m, n, k, beta);
}

bool Linear::on_sms(cudaStream_t stream, const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, OutType y_type,
                    int64_t m, int64_t n, int64_t k, int sms) {
  KIMIRT_CHECK(sms > 0, "Linear::on_sms: sms {} must be positive", sms);
  const SkinnyGemmArgs a{x, k, w, k, y, y_type, n, m, n, k, 0.0f};
  if (m != 1 || !skinny_gemm_supported(a) || skinny_gemm_config(a, sm_count_).kernel != SkinnyConfig::Kernel::kRows) {
    return false;
  }
  SkinnyConfig c;
  c.kernel = SkinnyConfig::Kernel::kRows;
  c.rows_per_warp = 2;
  c.splits = 1;
  c.max_blocks = sms;
  skinny_gemm(stream, a, nullptr, 0, sm_count_, c);
  return true;
}

void Linear::rms_normed(cudaStream_t stream, const __nv_bfloat16* x, const __nv_bfloat16* norm_weight, float eps,
                        __nv_bfloat16* x_normed, const __nv_bfloat16* w, void* y, OutType y_type, int64_t m, int64_t n,
                        int64_t k) {
  if (m == 0) return;
  if (uses_skinny(m, n, k)) {
    SkinnyGemmArgs a{x, k, w, k, y, y_type, n, m, n, k, 0.0f};
    a.x_norm = norm_weight, a.x_norm_eps = eps;
    if (skinny_gemm_supported(a)) {
      // Only the mma kernel takes x_norm: a table's rows-kernel choice is not used here.
      SkinnyConfig config;
      const std::optional<SkinnyConfig> listed = m <= 2 ? table_.config(n, k) : std::nullopt;
      if (listed && listed->kernel == SkinnyConfig::Kernel::kMma) config = *listed;
      skinny_gemm(stream, a, skinny_workspace_, skinny_workspace_bytes_, sm_count_, config);
      return;
    }
  }
  rms_norm(stream, x, k, norm_weight, x_normed, k, m, k, eps);
  (*this)(stream, x_normed, w, y, y_type, m, n, k);
}

void Linear::fp8(cudaStream_t stream, const uint8_t* xq, const float* x_scales, const uint8_t* wq,
                 const float* w_scales, __nv_bfloat16* y, int64_t ldy, int64_t m, int64_t n, int64_t k, void* d_scratch,
                 uint64_t d_scratch_bytes) {
  // Ours also takes what cuBLASLt refuses (n % 16 != 0, m % 4 != 0 without scratch). Nothing goes the other
  // way: cuBLASLt refuses ldy % 8 != 0 as ours does (its heuristic answers NOT_SUPPORTED on the H200).
  const uint64_t scratch_needed = fp8_d_scratch_bytes(m, n);
  const bool scratch_ok = scratch_needed == 0 || (d_scratch && d_scratch_bytes >= scratch_needed);
  const bool ours = table_.fp8_path(n, k, m) == Fp8Path::kOurs || n % 16 != 0 || !scratch_ok;
  if (ours) {
    fp8_block_gemm(stream, xq, x_scales, wq, w_scales, y, ldy, m, n, k, sm_count_);
  } else {
    lt_.linear_fp8(stream, xq, x_scales, wq, w_scales, y, ldy, m, n, k, d_scratch, d_scratch_bytes);
  }
}

void Linear::batched(cudaStream_t stream, const __nv_bfloat16* x, int64_t ldx, int64_t stride_x, const __nv_bfloat16* w,
                     int64_t ldw, int64_t stride_w, void* y, OutType y_type, int64_t ldy, int64_t stride_y, int64_t m,
                     int64_t n, int64_t k, int64_t batch, const __nv_bfloat16* gate) {
  if (m == 0) return;
  // The gate's preconditions are those of both paths (sigmoid_gate_mul's after cuBLASLt included), checked
  // before anything runs: which path a shape takes depends on the GEMM table.
  KIMIRT_CHECK(!gate || (y_type == OutType::kBF16 && (batch == 1 || stride_y == n) && ldy >= batch * n &&
                         ldy % 8 == 0 && (batch * n) % 8 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(gate) % 16 == 0),
               "Linear::batched: a gate needs bf16 y with each token's {} outputs contiguous (stride_y {} = n {} when "
               "batched), ldy {} >= batch * n and a multiple of 8, and y and gate 16-byte aligned",
               batch * n, stride_y, n, ldy);
  if (uses_skinny(m, n, k)) {
    SkinnyGemmArgs a{x, ldx, w, ldw, y, y_type, ldy, m, n, k, 0.0f};
    a.batch = batch, a.stride_x = stride_x, a.stride_w = stride_w, a.stride_y = stride_y, a.gate = gate;
    if (skinny_gemm_supported(a)) {
      skinny_gemm(stream, a, skinny_workspace_, skinny_workspace_bytes_, sm_count_);
      return;
    }
  }
  lt_.batched_bf16(stream, x, ldx, stride_x, w, ldw, stride_w, true, y, y_type, ldy, stride_y, m, n, k, batch);
  if (gate) {
    sigmoid_gate_mul(stream, static_cast<__nv_bfloat16*>(y), ldy, gate, ldy, m, batch * n);
  }
}

}  // namespace kimirt::cuda
