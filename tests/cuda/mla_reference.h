// fp64 reference of absorbed MLA decode attention over a paged latent cache, for the GPU tests: per sequence
// b and head h, softmax_j(q_bh · c_j / √192) · c_j[:512] over the rows j < lens[b] that
// table[b·ld_table + j / page] points to. q [batch, heads, 576], cache [pages·page, 576] (the bf16 values
// as floats), result [batch, heads, 512].
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace kimirt::cuda::test {

inline std::vector<float> mla_decode_reference(const std::vector<float>& q, const std::vector<float>& cache,
                                               const std::vector<int32_t>& table, int64_t ld_table,
                                               const std::vector<int32_t>& lens, int heads, int page,
                                               double scale = 0.0) {  // 0: 192^-1/2
  const int batch = static_cast<int>(lens.size());
  std::vector<float> ref(static_cast<size_t>(batch) * heads * 512);
  for (int b = 0; b < batch; ++b) {
    auto row = [&](int j) { return (int64_t{table[b * ld_table + j / page]} * page + j % page) * 576; };
    for (int h = 0; h < heads; ++h) {
      const float* qh = &q[(static_cast<size_t>(b) * heads + h) * 576];
      std::vector<double> s(lens[b]);
      double mx = -1e300;
      for (int j = 0; j < lens[b]; ++j) {
        double acc = 0;
        for (int d = 0; d < 576; ++d) acc += double(qh[d]) * cache[row(j) + d];
        s[j] = acc * (scale > 0.0 ? scale : 1.0 / std::sqrt(192.0));
        mx = std::max(mx, s[j]);
      }
      double den = 0;
      for (auto& v : s) den += (v = std::exp(v - mx));
      std::vector<double> o(512, 0.0);
      for (int j = 0; j < lens[b]; ++j) {
        for (int d = 0; d < 512; ++d) o[d] += s[j] * cache[row(j) + d];
      }
      for (int d = 0; d < 512; ++d) ref[(static_cast<size_t>(b) * heads + h) * 512 + d] = float(o[d] / den);
    }
  }
  return ref;
}

}  // namespace kimirt::cuda::test
