// GEMM path selection.
#include "kimirt/cuda/gemm_dispatch.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "kimirt/base/error.h"
#include "kimirt/cuda/gemv.h"

namespace kimirt::cuda {
namespace {

// PROVISIONAL, NOT YET MEASURED: no GPU run has produced a table yet. The rule below comes from a
// bandwidth model (the skinny kernel reads W once at any M ≤ 16; cuBLASLt's small-M tiles waste most of
// each MMA and add a split-K reduction), so the default sends M ≤ 8 to the skinny kernel. Replace these
// rows with the output of `kimirt-bench --only gemm --gemm-table FILE` from an H200 run.
constexpr int kBuiltinDefaultMaxM = 8;
struct BuiltinRow {
  int64_t n, k;
  int max_m;
};
constexpr BuiltinRow kBuiltinRows[] = {
    {0, 0, 0},  // placeholder row, ignored
};

}  // namespace

GemmTable GemmTable::builtin() {
  GemmTable t;
  t.default_max_m_ = kBuiltinDefaultMaxM;
  for (const BuiltinRow& r : kBuiltinRows) {
    if (r.n > 0) t.rows_[{r.n, r.k}] = r.max_m;
  }
  return t;
}

GemmTable GemmTable::load(const std::string& path) {
  std::ifstream in(path);
  KIMIRT_CHECK(in.good(), "GEMM table {}: cannot open", path);
  GemmTable t;
  t.default_max_m_ = kBuiltinDefaultMaxM;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    const auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream s(line);
    std::string n_text, k_text;
    int max_m = 0;
    if (!(s >> n_text)) continue;  // blank or comment
    KIMIRT_CHECK(static_cast<bool>(s >> k_text >> max_m), "GEMM table {}:{}: expected \"n k max_skinny_m\"", path,
                 line_no);
    std::string rest;
    KIMIRT_CHECK(!(s >> rest), "GEMM table {}:{}: unexpected \"{}\" after three fields", path, line_no, rest);
    KIMIRT_CHECK(max_m >= 0 && max_m <= kSkinnyMaxM, "GEMM table {}:{}: max_skinny_m {} is not in [0, {}]", path,
                 line_no, max_m, kSkinnyMaxM);
    if (n_text == "*" && k_text == "*") {
      t.default_max_m_ = max_m;
      continue;
    }
    int64_t n = 0, k = 0;
    try {
      size_t pn = 0, pk = 0;
      n = std::stoll(n_text, &pn);
      k = std::stoll(k_text, &pk);
      KIMIRT_CHECK(pn == n_text.size() && pk == k_text.size() && n > 0 && k > 0, "bad");
    } catch (const std::exception&) {
      fail("GEMM table {}:{}: n \"{}\" and k \"{}\" must be positive integers", path, line_no, n_text, k_text);
    }
    t.rows_[{n, k}] = max_m;
  }
  return t;
}

int GemmTable::max_skinny_m(int64_t n, int64_t k) const {
  const auto it = rows_.find({n, k});
  return it == rows_.end() ? default_max_m_ : it->second;
}

std::string GemmTable::to_text() const {
  std::string out = "# n k max_skinny_m   (kimirt GEMM dispatch table)\n";
  out += fmt::format("* * {}\n", default_max_m_);
  for (const auto& [nk, m] : rows_) out += fmt::format("{} {} {}\n", nk.first, nk.second, m);
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
      skinny_gemm(stream, a, skinny_workspace_, skinny_workspace_bytes_, sm_count_);
      return;
    }
  }
  lt_.linear_bf16(stream, x, ldx, w, ldw, y, y_type, ldy, m, n, k, beta);
}

void Linear::batched(cudaStream_t stream, const __nv_bfloat16* x, int64_t ldx, int64_t stride_x, const __nv_bfloat16* w,
                     int64_t ldw, int64_t stride_w, void* y, OutType y_type, int64_t ldy, int64_t stride_y, int64_t m,
                     int64_t n, int64_t k, int64_t batch) {
  if (m == 0) return;
  if (uses_skinny(m, n, k)) {
    SkinnyGemmArgs a{x, ldx, w, ldw, y, y_type, ldy, m, n, k, 0.0f};
    a.batch = batch, a.stride_x = stride_x, a.stride_w = stride_w, a.stride_y = stride_y;
    if (skinny_gemm_supported(a)) {
      skinny_gemm(stream, a, skinny_workspace_, skinny_workspace_bytes_, sm_count_);
      return;
    }
  }
  lt_.batched_bf16(stream, x, ldx, stride_x, w, ldw, stride_w, true, y, y_type, ldy, stride_y, m, n, k, batch);
}

}  // namespace kimirt::cuda
