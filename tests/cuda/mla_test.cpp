// MLA attention kernels and cache ops against fp64 loops over the same bf16 inputs. Bound: bf16 P in the
// P·V product plus bf16 output → ≤ 1e-2 (typically ~3e-3).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <tuple>

#include "kimirt/base/error.h"
#include "kimirt/cuda/mla_cache.h"
#include "kimirt/cuda/mla_decode.h"
#include "kimirt/cuda/mla_prefill.h"
#include "mla_reference.h"
#include "test_util.h"

namespace kimirt::cuda {
namespace {

using test::download;
using test::upload;

std::vector<float> dl_bf16(const DeviceBuffer& b, size_t n) { return test::from_bf16(download<uint16_t>(b.data(), n)); }
double sigm(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Sequences of tq[b] queries that are the last tq[b] of tk[b] key positions, random q, expanded keys and
// latent, optionally a gate; every kernel against an fp64 loop over the same bf16 inputs. A sequence without
// queries holds NaN keys and values: rows no other sequence may let into its sums. separate_kv: k_nope and v
// in buffers of their own ([tokens, heads, 128], head stride 128) instead of interleaved per head (256).
// scale: the softmax scale (0: 192^-½); max_q_slack: max_q passed that much above the largest Tq_b (a bound).
// causal = false: every query sees all tk[b] keys (then tk[b] may be below tq[b], or 0: rows of zeros).
// Bounds: 1e-2 relative over each sequence's rows, 3e-2 for any one (query, head) row, so that an error
// confined to a few rows (a dropped key, one query tile) is not averaged away by the others; each row's lse
// (log2 domain) within 2e-2 + 1e-3·|lse|, -inf where the row sees no key.
void check_prefill(const std::vector<int32_t>& tq, const std::vector<int32_t>& tk, int heads, bool with_gate,
                   uint32_t seed, bool separate_kv = false, float scale = 0.0f, int max_q_slack = 0,
                   bool causal = true) {
  std::vector<int32_t> cu_q = {0}, cu_k = {0};
  for (size_t b = 0; b < tq.size(); ++b) cu_q.push_back(cu_q.back() + tq[b]), cu_k.push_back(cu_k.back() + tk[b]);
  const int64_t nq = cu_q.back(), nk = cu_k.back();
  // to_bf16 rounds its argument in place: the reference sees the kernels' inputs.
  std::vector<float> q = test::random_vec(nq * heads * 192, seed, -2, 2),
                     kv = test::random_vec(nk * heads * 256, seed + 1, -2, 2),
                     lat = test::random_vec(nk * 576, seed + 2, -2, 2),
                     gate = test::random_vec(nq * heads * 128, seed + 3, -3, 3);
  std::vector<uint16_t> kv16 = test::to_bf16(kv);
  for (size_t b = 0; b < tq.size(); ++b)
    if (tq[b] == 0) std::fill(kv16.begin() + cu_k[b] * heads * 256, kv16.begin() + cu_k[b + 1] * heads * 256, 0x7FC0);
  std::vector<uint16_t> kn16(nk * heads * 128), v16(nk * heads * 128);
  for (int64_t i = 0; i < nk * heads; ++i) {
    std::copy_n(kv16.begin() + i * 256, 128, kn16.begin() + i * 128);
    std::copy_n(kv16.begin() + i * 256 + 128, 128, v16.begin() + i * 128);
  }
  DeviceBuffer dq = upload(test::to_bf16(q)), dkv = upload(kv16), dkn = upload(kn16), dv = upload(v16),
               dlat = upload(test::to_bf16(lat)), dg = upload(test::to_bf16(gate)), dcq = upload(cu_q),
               dck = upload(cu_k);
  std::vector<float> ref(nq * heads * 128, 0.0f), ref_lse(nq * heads, -INFINITY);
  const double sm_scale = scale > 0.0f ? scale : 1.0 / std::sqrt(192.0);
  for (size_t b = 0; b < tq.size(); ++b)
    for (int i = 0; i < tq[b]; ++i)
      for (int h = 0; h < heads; ++h) {
        const int64_t qi = cu_q[b] + i;
        const int pos = causal ? tk[b] - tq[b] + i : tk[b] - 1;  // the last key the query sees
        if (pos < 0) continue;
        std::vector<double> s(pos + 1);
        double mx = -1e300;
        for (int j = 0; j <= pos; ++j) {
          const int64_t kj = cu_k[b] + j;
          double acc = 0;
          for (int d = 0; d < 128; ++d) acc += double(q[(qi * heads + h) * 192 + d]) * kv[(kj * heads + h) * 256 + d];
          for (int d = 0; d < 64; ++d) acc += double(q[(qi * heads + h) * 192 + 128 + d]) * lat[kj * 576 + 512 + d];
          s[j] = acc * sm_scale;
          mx = std::max(mx, s[j]);
        }
        double den = 0;
        for (auto& v : s) den += (v = std::exp(v - mx));
        ref_lse[qi * heads + h] = float((mx + std::log(den)) / std::log(2.0));
        for (int d = 0; d < 128; ++d) {
          double o = 0;
          for (int j = 0; j <= pos; ++j) o += s[j] * kv[((cu_k[b] + j) * heads + h) * 256 + 128 + d];
          const double g = with_gate ? sigm(gate[qi * heads * 128 + h * 128 + d]) : 1.0;
          ref[(qi * heads + h) * 128 + d] = float(o / den * g);
        }
      }
  for (MlaPrefillKernel kernel : {MlaPrefillKernel::kMma, MlaPrefillKernel::kWgmma}) {
    DeviceBuffer out = test::poisoned(nq * heads * 128 * 2), lse = test::poisoned(nq * heads * 4);
    MlaPrefillArgs a;
    a.q = dq.as<__nv_bfloat16>(), a.ld_q = heads * 192;
    if (separate_kv) {
      a.k_nope = dkn.as<__nv_bfloat16>(), a.ld_k_nope = heads * 128, a.hs_k_nope = 128;
      a.v = dv.as<__nv_bfloat16>(), a.ld_v = heads * 128, a.hs_v = 128;
    } else {
      a.k_nope = dkv.as<__nv_bfloat16>(), a.ld_k_nope = heads * 256, a.hs_k_nope = 256;
      a.v = dkv.as<__nv_bfloat16>() + 128, a.ld_v = heads * 256, a.hs_v = 256;
    }
    a.k_pe = dlat.as<__nv_bfloat16>() + 512, a.ld_k_pe = 576;
    if (with_gate) a.gate = dg.as<__nv_bfloat16>(), a.ld_gate = heads * 128;
    a.out = out.as<__nv_bfloat16>(), a.ld_out = heads * 128;
    a.cu_q = dcq.as<int32_t>(), a.cu_k = dck.as<int32_t>(), a.total_q = nq, a.total_k = nk;
    a.batch = static_cast<int>(tq.size()), a.heads = heads;
    a.max_q = *std::max_element(tq.begin(), tq.end()) + max_q_slack, a.scale = scale;
    a.causal = causal, a.lse = lse.as<float>(), a.ld_lse = heads;
    mla_prefill(nullptr, a, kernel);
    const std::vector<float> got = dl_bf16(out, nq * heads * 128);
    const std::vector<float> got_lse = download<float>(lse.data(), nq * heads);
    const auto rows = [&](int64_t first, int64_t count) {
      return test::rel_err(test::part(got, first * 128, count * 128), test::part(ref, first * 128, count * 128));
    };
    for (size_t b = 0; b < tq.size(); ++b) {
      const std::string what = cat(mla_prefill_kernel_name(kernel), " heads ", heads, " gate ", with_gate,
                                   " separate k/v ", separate_kv, " sequence ", b);
      if (tq[b] == 0) continue;
      int lse_misses = 0;
      for (int64_t r = int64_t{cu_q[b]} * heads; r < int64_t{cu_q[b + 1]} * heads; ++r) {
        const float want = ref_lse[r], have = got_lse[r];
        const bool ok = std::isinf(want) ? have == want : std::fabs(have - want) <= 2e-2 + 1e-3 * std::fabs(want);
        if (!ok && lse_misses++ < 3) ADD_FAILURE() << what << " lse of row " << r << ": " << have << ", want " << want;
      }
      if (!causal && tk[b] == 0) {
        for (int64_t r = int64_t{cu_q[b]} * heads * 128; r < int64_t{cu_q[b + 1]} * heads * 128; ++r)
          ASSERT_EQ(got[r], 0.0f) << what << ": a row without keys is 0";
        continue;
      }
      EXPECT_LE(rows(int64_t{cu_q[b]} * heads, int64_t{tq[b]} * heads), 1e-2) << what;
      double worst = 0.0;
      int64_t worst_row = 0;
      for (int64_t r = int64_t{cu_q[b]} * heads; r < int64_t{cu_q[b + 1]} * heads; ++r) {
        const double e = rows(r, 1);
        if (e > worst) worst = e, worst_row = r;
      }
      EXPECT_LE(worst, 3e-2) << what << " query " << worst_row / heads - cu_q[b] << " head " << worst_row % heads;
    }
  }
}

// Sequence 0: 70 new queries over 70 keys; sequence 1: 33 queries after 100 cached keys; sequence 2: 1.
TEST(MlaPrefill, VarlenChunkedCausalWithGate) {
  KIMIRT_REQUIRE_GPU();
  for (int heads : {96, 12, 5}) check_prefill({70, 33, 1}, {70, 133, 9}, heads, true, 1);
}

// Several 128-query tiles per sequence, the last one partial (300 = 2·128 + 44), a chunk of 200 queries after
// 320 cached keys, one of 150 after 37 (the causal diagonal crosses key tiles off their boundaries), a
// sequence of exactly 129 (one query past a tile) whose last key tile reaches into a sequence of NaN rows.
TEST(MlaPrefill, LongChunksAcrossQueryTiles) {
  KIMIRT_REQUIRE_GPU();
  const std::vector<int32_t> tq = {300, 200, 150, 129, 0}, tk = {300, 520, 187, 129, 64};
  check_prefill(tq, tk, 12, true, 11);
  check_prefill(tq, tk, 16, false, 21, true, 0.05f, 100);
}

// A chunked-context prefill pass: every query sees all of its sequence's keys, fewer keys than queries, no
// key at all (zeros, lse -inf), several key tiles; a last sequence of NaN rows next to them.
TEST(MlaPrefill, NonCausalPassesWithLse) {
  KIMIRT_REQUIRE_GPU();
  const std::vector<int32_t> tq = {40, 130, 7, 5, 0}, tk = {200, 70, 0, 64, 64};
  check_prefill(tq, tk, 12, false, 41, false, 0.0f, 0, false);
  check_prefill(tq, tk, 5, true, 51, true, 0.0f, 3, false);
}

// The merge of three passes against the attention over their keys at once: sequence 0's 150 keys split after
// 50 and 90, sequence 1's 40 keys all in the middle pass (its running lse -inf before, its last pass empty),
// sequence 2 without keys in any.
TEST(MlaPrefill, MergedPassesEqualOnePass) {
  KIMIRT_REQUIRE_GPU();
  const int heads = 8;
  const std::vector<int32_t> tq = {33, 20, 4};
  const std::vector<std::vector<int32_t>> tk = {{50, 0, 0}, {40, 40, 0}, {60, 0, 0}};  // per pass
  std::vector<int32_t> cu_q = {0};
  for (int32_t n : tq) cu_q.push_back(cu_q.back() + n);
  const int64_t nq = cu_q.back();
  std::vector<float> q = test::random_vec(nq * heads * 192, 61, -2, 2),
                     g = test::random_vec(nq * heads * 128, 62, -3, 3);
  DeviceBuffer dq = upload(test::to_bf16(q)), dg = upload(test::to_bf16(g)), dcq = upload(cu_q);
  // Keys of sequence b, all passes: rows 0-49 of sequence 0 in pass 0, 50-89 in pass 1, 90-149 in pass 2.
  std::vector<int32_t> all_k = {150, 40, 0}, cu_all = {0};
  for (int32_t n : all_k) cu_all.push_back(cu_all.back() + n);
  std::vector<float> kv = test::random_vec(cu_all.back() * heads * 256, 63, -2, 2),
                     lat = test::random_vec(cu_all.back() * 576, 64, -2, 2);
  std::vector<uint16_t> kv16 = test::to_bf16(kv), lat16 = test::to_bf16(lat);
  const auto args = [&](const DeviceBuffer& dkv, const DeviceBuffer& dlat, const DeviceBuffer& dck, int64_t nk) {
    MlaPrefillArgs a;
    a.q = dq.as<__nv_bfloat16>(), a.ld_q = heads * 192;
    a.k_nope = dkv.as<__nv_bfloat16>(), a.ld_k_nope = heads * 256, a.hs_k_nope = 256;
    a.v = dkv.as<__nv_bfloat16>() + 128, a.ld_v = heads * 256, a.hs_v = 256;
    a.k_pe = dlat.as<__nv_bfloat16>() + 512, a.ld_k_pe = 576;
    a.cu_q = dcq.as<int32_t>(), a.cu_k = dck.as<int32_t>(), a.total_q = nq, a.total_k = std::max<int64_t>(nk, 1);
    a.batch = 3, a.heads = heads, a.max_q = 33, a.causal = false;
    return a;
  };
  // One pass over everything, with the gate.
  DeviceBuffer dkv = upload(kv16), dlat = upload(lat16), dck = upload(cu_all), whole = test::poisoned(nq * heads * 256);
  MlaPrefillArgs a = args(dkv, dlat, dck, cu_all.back());
  a.gate = dg.as<__nv_bfloat16>(), a.ld_gate = heads * 128, a.out = whole.as<__nv_bfloat16>(), a.ld_out = heads * 128;
  mla_prefill(nullptr, a);
  // Two passes: each its own key rows (copied out of the whole set), merged.
  DeviceBuffer part = test::poisoned(nq * heads * 256), part_lse = test::poisoned(nq * heads * 4),
               acc = test::poisoned(nq * heads * 512), acc_lse = test::poisoned(nq * heads * 4),
               merged = test::poisoned(nq * heads * 256);
  std::vector<DeviceBuffer> keep;
  std::vector<int32_t> done(3, 0);  // keys of each sequence taken by earlier passes
  for (int pass = 0; pass < 3; ++pass) {
    std::vector<uint16_t> pkv, plat;
    std::vector<int32_t> cu_p = {0};
    for (int b = 0; b < 3; ++b) {
      const int64_t first = cu_all[b] + done[b];
      done[b] += tk[pass][b];
      pkv.insert(pkv.end(), kv16.begin() + first * heads * 256, kv16.begin() + (first + tk[pass][b]) * heads * 256);
      plat.insert(plat.end(), lat16.begin() + first * 576, lat16.begin() + (first + tk[pass][b]) * 576);
      cu_p.push_back(cu_p.back() + tk[pass][b]);
    }
    keep.push_back(upload(pkv)), keep.push_back(upload(plat)), keep.push_back(upload(cu_p));
    MlaPrefillArgs p = args(keep[keep.size() - 3], keep[keep.size() - 2], keep.back(), cu_p.back());
    p.out = part.as<__nv_bfloat16>(), p.ld_out = heads * 128, p.lse = part_lse.as<float>(), p.ld_lse = heads;
    mla_prefill(nullptr, p);
    MlaPrefillMergeArgs m;
    m.tokens = nq, m.heads = heads;
    m.part = part.as<__nv_bfloat16>(), m.ld_part = heads * 128, m.part_lse = part_lse.as<float>(),
    m.ld_part_lse = heads;
    m.acc = acc.as<float>(), m.acc_lse = acc_lse.as<float>();
    m.gate = dg.as<__nv_bfloat16>(), m.ld_gate = heads * 128, m.out = merged.as<__nv_bfloat16>(),
    m.ld_out = heads * 128;
    mla_prefill_merge(nullptr, m,
                      pass == 0   ? MlaMergeMode::kFirst
                      : pass == 2 ? MlaMergeMode::kLast
                                  : MlaMergeMode::kAccumulate);
  }
  const std::vector<float> want = dl_bf16(whole, nq * heads * 128), got = dl_bf16(merged, nq * heads * 128);
  const auto seq = [&](const std::vector<float>& v, int b) {
    return test::part(v, int64_t{cu_q[b]} * heads * 128, int64_t{cu_q[b + 1] - cu_q[b]} * heads * 128);
  };
  for (int b = 0; b < 2; ++b) EXPECT_LE(test::rel_err(seq(got, b), seq(want, b)), 1e-2) << "sequence " << b;
  for (float v : seq(got, 2)) ASSERT_EQ(v, 0.0f) << "sequence 2 sees no key";
  // Both against an fp64 loop over the same bf16 inputs (to_bf16 rounded q, g, kv and lat in place): the one
  // pass is a GPU kernel too, so agreeing with it alone would not show that either is right.
  std::vector<float> ref(nq * heads * 128, 0.0f);
  for (int b = 0; b < 3; ++b)
    for (int i = 0; i < tq[b]; ++i)
      for (int h = 0; h < heads; ++h) {
        const int64_t qi = cu_q[b] + i;
        if (all_k[b] == 0) continue;
        std::vector<double> sc(all_k[b]);
        double mx = -1e300;
        for (int j = 0; j < all_k[b]; ++j) {
          const int64_t kj = cu_all[b] + j;
          double acc = 0;
          for (int d = 0; d < 128; ++d) acc += double(q[(qi * heads + h) * 192 + d]) * kv[(kj * heads + h) * 256 + d];
          for (int d = 0; d < 64; ++d) acc += double(q[(qi * heads + h) * 192 + 128 + d]) * lat[kj * 576 + 512 + d];
          sc[j] = acc / std::sqrt(192.0);
          mx = std::max(mx, sc[j]);
        }
        double den = 0;
        for (double& v : sc) den += (v = std::exp(v - mx));
        for (int d = 0; d < 128; ++d) {
          double o = 0;
          for (int j = 0; j < all_k[b]; ++j) o += sc[j] * kv[((cu_all[b] + j) * heads + h) * 256 + 128 + d];
          ref[(qi * heads + h) * 128 + d] = float(o / den * sigm(g[(qi * heads + h) * 128 + d]));
        }
      }
  for (int b = 0; b < 2; ++b) {
    EXPECT_LE(test::rel_err(seq(got, b), seq(ref, b)), 1e-2) << "merged passes against fp64, sequence " << b;
    EXPECT_LE(test::rel_err(seq(want, b), seq(ref, b)), 1e-2) << "one pass against fp64, sequence " << b;
  }
  EXPECT_THROW(mla_prefill_merge(nullptr, MlaPrefillMergeArgs{1, 8}, MlaMergeMode::kLast), kimirt::Error);
}

// What the tensor copies need that the mma.sync kernel did not: the host-side row totals, and column
// coordinates that fit 32 bits; then a valid call runs to completion.
TEST(MlaPrefill, RejectsMissingTotalsAndOutOfRangeStrides) {
  KIMIRT_REQUIRE_GPU();
  DeviceBuffer buf(1 << 20), out(4 * 128 * 2), cu = upload(std::vector<int32_t>{0, 4});
  KIMIRT_CUDA_CHECK(cudaMemset(buf.data(), 0, buf.size()));
  MlaPrefillArgs a;
  a.q = a.k_nope = a.k_pe = a.v = buf.as<__nv_bfloat16>();
  a.out = out.as<__nv_bfloat16>();
  a.ld_q = 192, a.ld_k_nope = 256, a.hs_k_nope = 256, a.ld_k_pe = 576, a.ld_v = 256, a.hs_v = 256, a.ld_out = 128;
  a.cu_q = a.cu_k = cu.as<int32_t>(), a.batch = 1, a.heads = 1, a.max_q = 4;
  EXPECT_THROW(mla_prefill(nullptr, a), kimirt::Error);  // totals missing
  a.total_q = 4, a.total_k = 4;
  MlaPrefillArgs bad = a;
  bad.heads = 2, bad.ld_q = 384, bad.ld_out = 256, bad.hs_k_nope = int64_t{1} << 31;
  EXPECT_THROW(mla_prefill(nullptr, bad), kimirt::Error);  // the second head's columns past 2^31
  bad = a;
  bad.hs_v = -8;
  EXPECT_THROW(mla_prefill(nullptr, bad), kimirt::Error);
  bad = a;
  bad.gate = buf.as<__nv_bfloat16>(), bad.ld_gate = 64;  // a row of gates shorter than heads x 128
  EXPECT_THROW(mla_prefill(nullptr, bad), kimirt::Error);
  bad = a;
  bad.scale = -0.1f;  // not replaced by the default, refused
  EXPECT_THROW(mla_prefill(nullptr, bad), kimirt::Error);
  // Row strides too short for the columns the copies read: a key row of 120 no-rope values, 56 rope values,
  // and two heads whose second head's values (hs_v 256: columns 256-383) pass a row of 256.
  for (const auto& [ld_k_nope, ld_k_pe, ld_v] : {std::tuple{120, 576, 256}, {256, 56, 256}, {512, 576, 256}}) {
    bad = a;
    bad.heads = 2, bad.ld_q = 384, bad.ld_out = 256;
    bad.ld_k_nope = ld_k_nope, bad.ld_k_pe = ld_k_pe, bad.ld_v = ld_v;
    if (ld_k_nope == 120 || ld_k_pe == 56) bad.heads = 1, bad.ld_q = 192, bad.ld_out = 128;
    try {
      mla_prefill(nullptr, bad);
      ADD_FAILURE() << "accepted ld_k_nope " << ld_k_nope << ", ld_k_pe " << ld_k_pe << ", ld_v " << ld_v;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("must hold the last head's columns"), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(mla_prefill(nullptr, a));
  KIMIRT_CUDA_CHECK(cudaDeviceSynchronize());
}

// A decode call over a test cache: q [batch, heads, 576] and out [batch, heads, 512] packed, the block table
// [batch, ld_table].
MlaDecodeArgs decode_args(const DeviceBuffer& q, const DeviceBuffer& cache, int page, const DeviceBuffer& table,
                          int ld_table, const DeviceBuffer& lens, const DeviceBuffer& out, int batch, int heads) {
  MlaDecodeArgs a;
  a.q = q.as<__nv_bfloat16>(), a.ld_q = heads * 576;
  a.cache = cache.as<__nv_bfloat16>(), a.page_size = page;
  a.block_table = table.as<int32_t>(), a.ld_block_table = ld_table, a.seq_lens = lens.as<int32_t>();
  a.out = out.as<__nv_bfloat16>(), a.ld_out = heads * 512, a.batch = batch, a.heads = heads;
  return a;
}

constexpr MlaDecodeKernel kKernels[] = {MlaDecodeKernel::kMma16, MlaDecodeKernel::kWgmma64, MlaDecodeKernel::kSeesaw};

// Every kernel, unsplit and split, at head counts that fill their head groups exactly (128, 64, 16), leave
// them partly empty (96 = 2 x 48 or 6 x 16, 24 = 2 x 12, 7), over pages scattered in reverse order, of 64
// rows and of 32 (a page per tile). The rows past each sequence's end inside its last page hold NaN: a
// kernel that copies a whole box or tile must not let them into the sums (P = 0 there, but 0 · NaN is NaN).
TEST(MlaDecode, PagedAbsorbedSplitAndUnsplit) {
  KIMIRT_REQUIRE_GPU();
  for (const auto& [page, heads] :
       {std::pair{64, 128}, {64, 96}, {64, 64}, {64, 24}, {64, 16}, {64, 7}, {32, 96}, {32, 24}, {32, 7}}) {
    const std::vector<int32_t> lens = {1, 77, 700, 64};
    const int batch = lens.size();
    const int max_pages = 768 / page;
    const int num_pages = batch * max_pages;
    std::vector<int32_t> table(batch * max_pages);
    for (int i = 0; i < batch * max_pages; ++i) table[i] = num_pages - 1 - i;
    std::vector<float> cache = test::random_vec(size_t(num_pages) * page * 576, 5, -2, 2);
    std::vector<float> q = test::random_vec(batch * heads * 576, 6, -0.5f, 0.5f);
    std::vector<uint16_t> cache_bf16 = test::to_bf16(cache);
    for (int b = 0; b < batch; ++b) {
      for (int j = lens[b]; j % page != 0; ++j) {
        const int64_t row = int64_t(table[b * max_pages + j / page]) * page + j % page;
        std::fill_n(cache_bf16.begin() + row * 576, 576, uint16_t{0x7FC0});  // NaN
      }
    }
    DeviceBuffer dc = upload(cache_bf16), dq = upload(test::to_bf16(q)), dt = upload(table), dl = upload(lens);
    const std::vector<float> ref = test::mla_decode_reference(q, cache, table, max_pages, lens, heads, page);
    for (MlaDecodeKernel kernel : kKernels) {
      for (int sms : {1, 132, 1000}) {  // 1 SM: no split; more: split-KV with the merge kernel
        const MlaDecodePlan plan = plan_mla_decode(batch, heads, 700, sms, kernel);
        ASSERT_EQ(plan.kernel, kernel);
        DeviceBuffer ws(plan.workspace_bytes + 16);
        DeviceBuffer out = test::poisoned(batch * heads * 512 * 2);
        mla_decode(nullptr, decode_args(dq, dc, page, dt, max_pages, dl, out, batch, heads), plan, ws.data());
        // Per sequence: one error over all of them would let the 1-row sequence (a raw cache row, most of the
        // norm) hide a sequence's dropped rows.
        const std::vector<float> got = dl_bf16(out, batch * heads * 512);
        for (int b = 0; b < batch; ++b) {
          const auto seq = [&](const std::vector<float>& v) {
            return test::part(v, int64_t{b} * heads * 512, heads * 512);
          };
          EXPECT_LE(test::rel_err(seq(got), seq(ref)), 1e-2)
              << mla_decode_kernel_name(kernel) << " heads " << heads << " page " << page << " splits " << plan.splits
              << " x " << plan.head_groups << " head groups, sequence " << b << " (" << lens[b] << " rows)";
        }
      }
    }
  }
}

// A softmax scale other than the default (MlaDecodeArgs::scale), on every kernel, split and unsplit: 0.3, about
// four times 192^-1/2, a much sharper softmax than the default's.
TEST(MlaDecode, GivenScale) {
  KIMIRT_REQUIRE_GPU();
  const int page = 64;
  const std::vector<int32_t> lens = {300, 77};
  const int batch = lens.size(), max_pages = 5;
  std::vector<int32_t> table(batch * max_pages);
  for (int i = 0; i < batch * max_pages; ++i) table[i] = i;
  std::vector<float> cache = test::random_vec(size_t(batch) * max_pages * page * 576, 15, -2, 2);
  DeviceBuffer dc = upload(test::to_bf16(cache)), dt = upload(table), dl = upload(lens);
  for (const int heads : {16, 96}) {
    std::vector<float> q = test::random_vec(batch * heads * 576, 16, -0.5f, 0.5f);
    DeviceBuffer dq = upload(test::to_bf16(q));
    const std::vector<float> ref = test::mla_decode_reference(q, cache, table, max_pages, lens, heads, page, 0.3);
    for (MlaDecodeKernel kernel : kKernels) {
      for (int sms : {1, 132}) {
        const MlaDecodePlan plan = plan_mla_decode(batch, heads, 300, sms, kernel);
        DeviceBuffer ws(plan.workspace_bytes + 16), out = test::poisoned(batch * heads * 512 * 2);
        MlaDecodeArgs a = decode_args(dq, dc, page, dt, max_pages, dl, out, batch, heads);
        a.scale = 0.3f;
        mla_decode(nullptr, a, plan, ws.data());
        const std::vector<float> got = dl_bf16(out, batch * heads * 512);
        for (int b = 0; b < batch; ++b) {
          const auto seq = [&](const std::vector<float>& v) {
            return test::part(v, int64_t{b} * heads * 512, heads * 512);
          };
          EXPECT_LE(test::rel_err(seq(got), seq(ref)), 1e-2) << mla_decode_kernel_name(kernel) << " heads " << heads
                                                             << " splits " << plan.splits << ", sequence " << b;
        }
      }
    }
  }
}

// A long context split over many blocks (chunks that are not multiples of the wgmma kernel's 48-row tile,
// 64-row pages scattered) at the head counts of K3 (96) and of K3 under TP 8 (12), every kernel, against the fp64
// reference.
TEST(MlaDecode, LongContextManySplits) {
  KIMIRT_REQUIRE_GPU();
  const int page = 64, len = 9000, pages = (len + page - 1) / page;
  std::vector<int32_t> table(pages);
  for (int i = 0; i < pages; ++i) table[i] = (i * 37) % pages;  // a permutation (37 is prime to 141)
  const std::vector<float> noise = test::random_vec(size_t(pages) * page * 576, 15, -2, 2);
  DeviceBuffer dt = upload(table), dl = upload(std::vector<int32_t>{len});
  // Needles: rows equal to 5 q_h of one head h each, so that each holds several % of its head's attention (a
  // random row holds about 1/9000): a row dropped or read twice at a tile, chunk, split or page edge, or at
  // either end, moves the output far past the bound, where among flat scores it would not.
  std::vector<int> needles = {0, 1, len - 2, len - 1};
  for (int edge : {32, 48, 64, 96, 128, 256, 512, 1024, 2048, 4096, 4500, 6144, 8192})
    needles.insert(needles.end(), {edge - 1, edge});
  for (int p = 97; p < len; p += 211) needles.push_back(p);
  for (int heads : {96, 12}) {
    std::vector<float> q = test::random_vec(heads * 576, 16 + heads, -0.3f, 0.3f);
    DeviceBuffer dq = upload(test::to_bf16(q));
    std::vector<float> cache = noise;
    for (size_t i = 0; i < needles.size(); ++i) {
      const int pos = needles[i], h = static_cast<int>(i % heads);
      float* row = &cache[(size_t(table[pos / page]) * page + pos % page) * 576];
      for (int d = 0; d < 576; ++d) row[d] = 5.0f * q[h * 576 + d];
    }
    DeviceBuffer dc = upload(test::to_bf16(cache));
    const std::vector<float> ref = test::mla_decode_reference(q, cache, table, pages, {len}, heads, page);
    for (MlaDecodeKernel kernel : kKernels) {
      const MlaDecodePlan plan = plan_mla_decode(1, heads, len, 132, kernel);
      EXPECT_GT(plan.splits, 20) << mla_decode_kernel_name(kernel) << " heads " << heads;
      DeviceBuffer ws(plan.workspace_bytes + 16), out = test::poisoned(heads * 512 * 2);
      MlaDecodeArgs a = decode_args(dq, dc, page, dt, pages, dl, out, 1, heads);
      a.num_pages = pages;  // the other tests leave it unknown (0)
      mla_decode(nullptr, a, plan, ws.data());
      EXPECT_LE(test::rel_err(dl_bf16(out, heads * 512), ref), 1e-2)
          << mla_decode_kernel_name(kernel) << " heads " << heads << " splits " << plan.splits;
    }
  }
}

// One block over a whole sequence of 32-row pages scattered at random (one SM: no split): 2500 rows are 79
// pages, so the producers' page-id windows (32 pages per load, two loaded ahead) are reloaded on the way.
TEST(MlaDecode, OneBlockOverManyPages) {
  KIMIRT_REQUIRE_GPU();
  const int page = 32, len = 2500, pages = (len + page - 1) / page, heads = 12;
  std::vector<int32_t> table(pages);
  for (int i = 0; i < pages; ++i) table[i] = (i * 29 + 5) % pages;  // a permutation (29 is prime to 79)
  std::vector<float> cache = test::random_vec(size_t(pages) * page * 576, 25, -2, 2);
  std::vector<float> q = test::random_vec(heads * 576, 26, -0.3f, 0.3f);
  DeviceBuffer dc = upload(test::to_bf16(cache)), dt = upload(table), dl = upload(std::vector<int32_t>{len}),
               dq = upload(test::to_bf16(q));
  const std::vector<float> ref = test::mla_decode_reference(q, cache, table, pages, {len}, heads, page);
  for (MlaDecodeKernel kernel : kKernels) {
    const MlaDecodePlan plan = plan_mla_decode(1, heads, len, 1, kernel);
    ASSERT_EQ(plan.splits, 1) << mla_decode_kernel_name(kernel);
    DeviceBuffer ws(plan.workspace_bytes + 16), out = test::poisoned(heads * 512 * 2);
    MlaDecodeArgs a = decode_args(dq, dc, page, dt, pages, dl, out, 1, heads);
    a.num_pages = pages;
    mla_decode(nullptr, a, plan, ws.data());
    EXPECT_LE(test::rel_err(dl_bf16(out, heads * 512), ref), 1e-2) << mla_decode_kernel_name(kernel);
  }
}

// The rope part of q from a buffer of its own (MlaDecodeArgs::q_pe), laid out as q_b writes it ([heads,
// 192]: q_nope then q_pe): every kernel, split and unsplit, gives the bits of the same call on a q that holds
// its own q_pe, while q's own values 512..575 and q_b's q_nope are NaN (so that reading either shows).
TEST(MlaDecode, RopePartFromItsOwnBuffer) {
  KIMIRT_REQUIRE_GPU();
  const int page = 64;
  const std::vector<int32_t> lens = {1, 300, 64};
  const int batch = lens.size(), max_pages = 5, num_pages = batch * max_pages;
  std::vector<int32_t> table(batch * max_pages);
  std::iota(table.rbegin(), table.rend(), 0);
  std::vector<float> cache = test::random_vec(size_t(num_pages) * page * 576, 35, -2, 2);
  DeviceBuffer dc = upload(test::to_bf16(cache)), dt = upload(table), dl = upload(lens);
  const uint16_t kNaN = 0x7FC0;
  for (int heads : {96, 12, 7}) {
    std::vector<float> q_f = test::random_vec(batch * heads * 576, 36 + heads, -0.5f, 0.5f);
    const std::vector<uint16_t> q = test::to_bf16(q_f);
    std::vector<uint16_t> q_lat = q, q_b(size_t(batch) * heads * 192, kNaN);
    for (int r = 0; r < batch * heads; ++r) {
      std::fill_n(q_lat.begin() + r * 576 + 512, 64, kNaN);
      std::copy_n(q.begin() + r * 576 + 512, 64, q_b.begin() + r * 192 + 128);
    }
    DeviceBuffer dq = upload(q), dq_lat = upload(q_lat), dq_b = upload(q_b);
    for (MlaDecodeKernel kernel : kKernels) {
      for (int sms : {1, 132}) {
        const MlaDecodePlan plan = plan_mla_decode(batch, heads, 320, sms, kernel);
        DeviceBuffer ws(plan.workspace_bytes + 16);
        DeviceBuffer whole = test::poisoned(batch * heads * 512 * 2), apart = test::poisoned(batch * heads * 512 * 2);
        MlaDecodeArgs a = decode_args(dq, dc, page, dt, max_pages, dl, whole, batch, heads);
        mla_decode(nullptr, a, plan, ws.data());
        a.q = dq_lat.as<__nv_bfloat16>();
        a.q_pe = dq_b.as<__nv_bfloat16>() + 128, a.ld_q_pe_head = 192, a.ld_q_pe = heads * 192;
        a.out = apart.as<__nv_bfloat16>();
        mla_decode(nullptr, a, plan, ws.data());
        const auto want = download<uint16_t>(whole.data(), batch * heads * 512);
        EXPECT_EQ(download<uint16_t>(apart.data(), batch * heads * 512), want)
            << mla_decode_kernel_name(kernel) << " heads " << heads << " splits " << plan.splits;
        EXPECT_TRUE(std::none_of(want.begin(), want.end(), [](uint16_t v) { return (v & 0x7F80) == 0x7F80; }))
            << "the reference call itself is finite";
      }
    }
  }
}

// The plan: the memory-bound kernel for few heads per GPU or little work, the wgmma kernel for many heads over
// many rows (mla_decode.h: groups of 16 heads x batch x length against kMlaAutoMma16Rows); one wave of blocks on
// the SMs (a few blocks over the SM count would double the time).
TEST(MlaDecode, PlanPicksKernelAndOneWave) {
  KIMIRT_REQUIRE_GPU();
  constexpr auto kMma16 = MlaDecodeKernel::kMma16;
  constexpr auto kSeesaw = MlaDecodeKernel::kSeesaw;
  for (const auto& [batch, heads, ctx, kernel] : {std::tuple{1, 12, 32768, kMma16},
                                                  {1, 16, 131072, kMma16},
                                                  {8, 12, 32768, kMma16},
                                                  {1, 96, 32768, kSeesaw},
                                                  {8, 96, 32768, kSeesaw},
                                                  {3, 24, 5000, kMma16},
                                                  {1, 96, 4096, kMma16},
                                                  {1, 32, 32768, kMma16},
                                                  {1, 33, 32768, kSeesaw},
                                                  {8, 32, 4096, kMma16},
                                                  {8, 32, 4097, kSeesaw},
                                                  {64, 24, 4096, kSeesaw}}) {
    const MlaDecodePlan p = plan_mla_decode(batch, heads, ctx, 132);
    EXPECT_EQ(p.kernel, kernel) << batch << " x " << heads << " heads, ctx " << ctx;
    EXPECT_LE(int64_t{batch} * p.head_groups * p.splits, 132) << batch << " x " << heads << " heads, ctx " << ctx;
    EXPECT_GE(int64_t{batch} * p.head_groups * p.splits, 92) << batch << " x " << heads << " heads, ctx " << ctx;
    EXPECT_GE(int64_t{p.splits} * p.chunk, ctx);
    EXPECT_EQ(p.chunk % kMlaChunkAlign, 0);
    EXPECT_EQ(p.chunk % 32, 0) << "kMma16 and kSeesaw take whole 32-row tiles";
  }
}

TEST(MlaCache, NormAppendGatherAndGate) {
  KIMIRT_REQUIRE_GPU();
  const int page = 64, tokens = 5, pages = 4;
  std::vector<float> kv = test::random_vec(tokens * 600, 1, -3, 3), w = test::random_vec(512, 2, 0.5, 1.5);
  DeviceBuffer dkv = upload(test::to_bf16(kv)), dw = upload(test::to_bf16(w));
  const std::vector<int32_t> slots = {3 * page + 0, 3 * page + 1, 0 * page + 63, -1, 2 * page + 5};
  DeviceBuffer ds = upload(slots);
  // The cache starts with known rows, so that the rows the append must leave alone (slot -1 writes nothing) and
  // the gathered rows it did not write can be checked too.
  std::vector<float> init = test::random_vec(pages * page * 576, 9, -1, 1);
  const std::vector<uint16_t> init16 = test::to_bf16(init);
  DeviceBuffer cache = upload(init16), lat = test::poisoned(tokens * 576 * 2);
  mla_kv_norm_append(nullptr, dkv.as<__nv_bfloat16>(), 600, dw.as<__nv_bfloat16>(), 1e-6f, ds.as<int32_t>(), tokens,
                     cache.as<__nv_bfloat16>(), lat.as<__nv_bfloat16>(), 576);
  const auto got = dl_bf16(lat, tokens * 576);
  std::vector<float> ref(tokens * 576);
  for (int t = 0; t < tokens; ++t) {
    double ss = 0;
    for (int d = 0; d < 512; ++d) ss += double(kv[t * 600 + d]) * kv[t * 600 + d];
    const double rs = 1.0 / std::sqrt(ss / 512 + 1e-6);
    for (int d = 0; d < 512; ++d) ref[t * 576 + d] = float(kv[t * 600 + d] * rs * w[d]);
    for (int d = 512; d < 576; ++d) ref[t * 576 + d] = kv[t * 600 + d];
  }
  EXPECT_LE(test::rel_err(got, ref), 6e-3);
  const auto cache_h = dl_bf16(cache, pages * page * 576);
  std::vector<bool> written(pages * page, false);
  for (int t = 0; t < tokens; ++t) {
    if (slots[t] < 0) continue;
    written[slots[t]] = true;
    for (int d = 0; d < 576; ++d) ASSERT_EQ(cache_h[int64_t(slots[t]) * 576 + d], got[t * 576 + d]) << t;
  }
  const auto cache16 = download<uint16_t>(cache.data(), pages * page * 576);
  for (int row = 0; row < pages * page; ++row) {
    if (written[row]) continue;
    for (int d = 0; d < 576; ++d)
      ASSERT_EQ(cache16[row * 576 + d], init16[row * 576 + d]) << "cache row " << row << " written, no slot names it";
  }
  // Gather: sequence 0 = slots 3*64+0, 3*64+1 (table {3}), sequence 1 = page 2 rows 0..5.
  const std::vector<int32_t> table = {3, 0, 2, 0}, cu = {0, 2, 8};
  DeviceBuffer dt = upload(table), dcu = upload(cu), out = test::poisoned(8 * 576 * 2);
  mla_gather_latent(nullptr, cache.as<__nv_bfloat16>(), page, dt.as<int32_t>(), 2, dcu.as<int32_t>(), 2, 6,
                    out.as<__nv_bfloat16>());
  // A table row stride of 0 (every sequence the first one's pages): refused.
  EXPECT_THROW(mla_gather_latent(nullptr, cache.as<__nv_bfloat16>(), page, dt.as<int32_t>(), 0, dcu.as<int32_t>(), 2, 6,
                                 out.as<__nv_bfloat16>()),
               Error);
  const auto g = dl_bf16(out, 8 * 576);
  for (int d = 0; d < 576; ++d) {
    ASSERT_EQ(g[0 * 576 + d], got[0 * 576 + d]);
    ASSERT_EQ(g[1 * 576 + d], got[1 * 576 + d]);
    for (int r = 0; r < 5; ++r) ASSERT_EQ(g[(2 + r) * 576 + d], init[(2 * page + r) * 576 + d]) << "page 2 row " << r;
    ASSERT_EQ(g[7 * 576 + d], got[4 * 576 + d]);  // page 2 row 5
  }
  // Gate.
  std::vector<float> x = test::random_vec(3 * 256, 7), gt = test::random_vec(3 * 256, 8, -4, 4);
  DeviceBuffer dx = upload(test::to_bf16(x)), dg = upload(test::to_bf16(gt));
  sigmoid_gate_mul(nullptr, dx.as<__nv_bfloat16>(), 256, dg.as<__nv_bfloat16>(), 256, 3, 256);
  std::vector<float> r(3 * 256);
  for (size_t i = 0; i < r.size(); ++i) r[i] = float(x[i] * sigm(gt[i]));
  EXPECT_LE(test::rel_err(dl_bf16(dx, 3 * 256), r), 4e-3);
}

// Chunked-context passes: 70 sequences (more than one warp's round of the scan) with random cached and new
// lengths, their cached rows laid end to end and taken `keys` at a time; then a gather from the per-sequence
// first rows through a block table whose pages are not in order.
TEST(MlaCache, ContextPassOffsetsAndGather) {
  KIMIRT_REQUIRE_GPU();
  const int batch = 70, page = 16, pages_per_seq = 8;
  std::vector<int32_t> cu_q = {0}, cu_k = {0}, ctx(batch);
  uint32_t state = 12345;
  const auto next = [&](int n) { return static_cast<int>((state = state * 1664525u + 1013904223u) >> 8) % n; };
  for (int b = 0; b < batch; ++b) {
    ctx[b] = b % 5 == 0 ? 0 : next(pages_per_seq * page - 8);
    const int tq = 1 + next(8);
    cu_q.push_back(cu_q.back() + tq), cu_k.push_back(cu_k.back() + ctx[b] + tq);
  }
  std::vector<int32_t> table(batch * pages_per_seq);
  for (int i = 0; i < batch * pages_per_seq; ++i) table[i] = (i * 37 + 11) % (batch * pages_per_seq);  // 37 ⟂ 560
  const int64_t context = std::accumulate(ctx.begin(), ctx.end(), int64_t{0});
  std::vector<float> rows = test::random_vec(int64_t{batch} * pages_per_seq * page * 576, 81, -2, 2);
  DeviceBuffer cache = upload(test::to_bf16(rows)), dt = upload(table), dcq = upload(cu_q), dck = upload(cu_k),
               dcp = test::poisoned((batch + 1) * 4), dfr = test::poisoned(batch * 4);
  const int64_t keys = 333;
  int64_t seen = 0;
  // Where sequence b's cached rows start in the concatenation, and which of them the passes have taken.
  std::vector<int64_t> start = {0};
  for (int b = 0; b < batch; ++b) start.push_back(start.back() + ctx[b]);
  std::vector<std::vector<char>> taken(batch);
  for (int b = 0; b < batch; ++b) taken[b].assign(ctx[b], 0);
  for (int64_t first = 0; first < context; first += keys) {
    SCOPED_TRACE("pass from row " + std::to_string(first));
    mla_context_chunk_offsets(nullptr, dcq.as<int32_t>(), dck.as<int32_t>(), batch, first, keys, dcp.as<int32_t>(),
                              dfr.as<int32_t>());
    const auto cu_pass = download<int32_t>(dcp.data(), batch + 1), first_rows = download<int32_t>(dfr.data(), batch);
    // Host: sequence b's cached rows are [off_b, off_b + ctx_b) of the concatenation.
    std::vector<int32_t> want_cu = {0}, want_first;
    int64_t off = 0;
    for (int b = 0; b < batch; ++b) {
      const int64_t lo = std::max(off, first), hi = std::min(off + ctx[b], first + keys);
      want_cu.push_back(want_cu.back() + static_cast<int32_t>(std::max<int64_t>(0, hi - lo)));
      want_first.push_back(hi > lo ? static_cast<int32_t>(lo - off) : 0);
      off += ctx[b];
    }
    ASSERT_EQ(cu_pass, want_cu);
    ASSERT_EQ(first_rows, want_first);
    seen += cu_pass[batch];
    const int n = cu_pass[batch];
    DeviceBuffer out = test::poisoned(int64_t{n} * 576 * 2);
    mla_gather_latent(nullptr, cache.as<__nv_bfloat16>(), page, dt.as<int32_t>(), pages_per_seq, dcp.as<int32_t>(),
                      batch, static_cast<int>(keys), out.as<__nv_bfloat16>(), dfr.as<int32_t>());
    const auto got = dl_bf16(out, int64_t{n} * 576);
    for (int b = 0; b < batch; ++b)
      for (int i = 0; i < cu_pass[b + 1] - cu_pass[b]; ++i) {
        const int pos = first_rows[b] + i;
        // Pass row cu_pass[b] + i is row first + cu_pass[b] + i of the concatenation, taken by no other pass.
        ASSERT_TRUE(pos >= 0 && pos < ctx[b]) << "sequence " << b << " row " << pos << " of " << ctx[b];
        ASSERT_EQ(start[b] + pos, first + cu_pass[b] + i) << "sequence " << b << " row " << pos;
        ASSERT_FALSE(taken[b][pos]) << "sequence " << b << " row " << pos << " taken twice";
        taken[b][pos] = 1;
        const int64_t slot = int64_t{table[b * pages_per_seq + pos / page]} * page + pos % page;
        for (int d = 0; d < 576; ++d)
          ASSERT_EQ(got[(int64_t{cu_pass[b]} + i) * 576 + d], rows[slot * 576 + d])
              << "sequence " << b << " row " << pos;
      }
  }
  EXPECT_EQ(seen, context) << "the passes take every cached row once";
  for (int b = 0; b < batch; ++b)
    EXPECT_EQ(std::count(taken[b].begin(), taken[b].end(), 1), ctx[b]) << "rows of sequence " << b;
}

TEST(MlaDecode, BadArgumentsAreErrors) {
  KIMIRT_REQUIRE_GPU();
  DeviceBuffer buf(1 << 20);
  MlaDecodeArgs a;
  a.q = buf.as<__nv_bfloat16>(), a.ld_q = 576, a.cache = a.q, a.page_size = 48, a.block_table = buf.as<int32_t>(),
  a.ld_block_table = 1, a.seq_lens = buf.as<int32_t>(), a.out = buf.as<__nv_bfloat16>(), a.ld_out = 512, a.batch = 1,
  a.heads = 1;
  EXPECT_THROW(mla_decode(nullptr, a, plan_mla_decode(1, 1, 10, 132), nullptr), Error);  // page 48
  a.page_size = 64;
  EXPECT_THROW(mla_decode(nullptr, a, MlaDecodePlan{}, nullptr), Error);  // not a plan (kernel kAuto)
  MlaDecodePlan too_many = plan_mla_decode(1, 32, 10, 132, MlaDecodeKernel::kMma16);
  too_many.heads_per_group = 32, too_many.head_groups = 1;  // more heads than the kernel's block takes
  a.heads = 32, a.ld_q = 32 * 576, a.ld_out = 32 * 512;
  EXPECT_THROW(mla_decode(nullptr, a, too_many, nullptr), Error);
  // q_pe apart: 16-byte aligned, strides multiples of 8 that keep the heads' 64 values apart.
  a.heads = 1, a.ld_q = 576, a.ld_out = 512;
  // Misaligned; a head stride below 64 (a multiple of 8) or not a multiple of 8; a batch stride that lets two
  // sequences' heads overlap, or a negative one.
  struct BadPe {
    int offset, ld_head, ld_batch, batch, heads;
  };
  for (const BadPe& c : {BadPe{4, 192, 192, 1, 1}, BadPe{0, 56, 192, 1, 1}, BadPe{0, 68, 192, 1, 1},
                         BadPe{0, 64, 120, 2, 2}, BadPe{0, 64, -8, 1, 1}}) {
    a.q_pe = buf.as<__nv_bfloat16>() + c.offset, a.ld_q_pe_head = c.ld_head, a.ld_q_pe = c.ld_batch;
    a.batch = c.batch, a.heads = c.heads, a.ld_q = c.heads * 576, a.ld_out = c.heads * 512;
    try {
      mla_decode(nullptr, a, plan_mla_decode(c.batch, c.heads, 10, 132), nullptr);
      ADD_FAILURE() << "q_pe at +" << c.offset << ", strides " << c.ld_head << " / " << c.ld_batch << " (batch "
                    << c.batch << ", " << c.heads << " heads) was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("q_pe"), std::string::npos) << e.what();
    }
  }
  a.q_pe = nullptr, a.batch = 1;
  // kSeesaw and kMma16 copy whole 32-row tiles, which must not straddle a page: chunks are multiples of 32.
  for (MlaDecodeKernel k : {MlaDecodeKernel::kSeesaw, MlaDecodeKernel::kMma16}) {
    MlaDecodePlan half_tiles = plan_mla_decode(1, 16, 10, 132, k);
    half_tiles.chunk = 48;
    a.heads = 16, a.ld_q = 16 * 576, a.ld_out = 16 * 512;
    try {
      mla_decode(nullptr, a, half_tiles, nullptr);
      ADD_FAILURE() << mla_decode_kernel_name(k) << ": a chunk of 48 rows was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("chunk (48) must be a multiple of 32"), std::string::npos) << e.what();
    }
  }
  // A negative or NaN softmax scale is an error naming it (0 alone means 192^-1/2).
  a.heads = 1, a.ld_q = 576, a.ld_out = 512;
  for (const float scale : {-0.1f, NAN, INFINITY}) {
    a.scale = scale;
    try {
      mla_decode(nullptr, a, plan_mla_decode(1, 1, 10, 132), nullptr);
      ADD_FAILURE() << "scale " << scale << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("scale"), std::string::npos) << e.what();
    }
  }
  // The planner refuses a length whose chunks would pass 2^31 - 1 keys (mla_decode would refuse its plan).
  for (const int heads : {12, 96}) {
    try {
      const MlaDecodePlan p = plan_mla_decode(1, heads, INT32_MAX, 132);
      ADD_FAILURE() << heads << " heads: planned " << p.splits << " x " << p.chunk;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("is too long"), std::string::npos) << e.what();
    }
  }
  const MlaDecodePlan longest = plan_mla_decode(1, 12, (1 << 30), 132);
  EXPECT_LE(int64_t{longest.splits} * longest.chunk, int64_t{INT32_MAX});
}

}  // namespace
}  // namespace kimirt::cuda
