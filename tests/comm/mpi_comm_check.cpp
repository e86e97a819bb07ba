// Run by ctest under `mpirun -np 3`: every collective of MpiComm across real processes. Exits non-zero
// (naming the collective) on any wrong result, on every rank that sees it.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <vector>

#include "kimirt/comm/mpi_comm.h"
#include "kimirt/tensor/float_convert.h"

namespace {

int failures = 0;

template <typename T>
void expect_eq(const char* what, int rank, const std::vector<T>& got, const std::vector<T>& want) {
  if (got != want) {
    std::fprintf(stderr, "rank %d: %s gave a wrong result\n", rank, what);
    ++failures;
  }
}

}  // namespace

int main() {
  try {
    auto comm = kimirt::MpiComm::world();
    const int r = comm->rank();
    const int n = comm->size();
    using kimirt::DType;

    std::vector<float> v = {static_cast<float>(r), 1.0f};
    comm->all_reduce_sum(v.data(), v.size(), DType::kF32);
    expect_eq("all_reduce_sum", r, v, {static_cast<float>(n * (n - 1) / 2), static_cast<float>(n)});

    std::vector<int32_t> mine = {r, -r}, all(static_cast<size_t>(2 * n));
    comm->all_gather(mine.data(), all.data(), 2, DType::kI32);
    std::vector<int32_t> want_all;
    for (int i = 0; i < n; ++i) want_all.insert(want_all.end(), {i, -i});
    expect_eq("all_gather", r, all, want_all);

    // Block b of rank q holds 10·q + b, so rank r's sum, Σ_q (10·q + r), needs every rank's own block r.
    std::vector<double> blocks(static_cast<size_t>(n)), got(1);
    for (int b = 0; b < n; ++b) blocks[static_cast<size_t>(b)] = 10.0 * r + b;
    comm->reduce_scatter_sum(blocks.data(), got.data(), 1, DType::kF64);
    expect_eq("reduce_scatter_sum", r, got, {10.0 * n * (n - 1) / 2 + static_cast<double>(n) * r});

    // Rank r sends (r + 1) copies of r to every rank.
    const size_t k = static_cast<size_t>(r + 1);
    std::vector<int64_t> send(k * static_cast<size_t>(n), r), recv;
    std::vector<size_t> send_counts(static_cast<size_t>(n), k), recv_counts;
    std::vector<int64_t> want_recv;
    for (int i = 0; i < n; ++i) {
      recv_counts.push_back(static_cast<size_t>(i + 1));
      want_recv.insert(want_recv.end(), static_cast<size_t>(i + 1), i);
    }
    recv.resize(want_recv.size());
    comm->all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, DType::kI64);
    expect_eq("all_to_all_v", r, recv, want_recv);

    std::vector<int64_t> b = {r == n - 1 ? 42 : 0};
    comm->broadcast(b.data(), 1, DType::kI64, n - 1);
    expect_eq("broadcast", r, b, {42});

    // 16-bit floats: moved as words, summed in fp32 (every value and sum here is exact in both formats).
    for (const DType half : {DType::kBF16, DType::kF16}) {
      const auto to16 = [&](float x) { return half == DType::kBF16 ? kimirt::f32_to_bf16(x) : kimirt::f32_to_f16(x); };
      const char* name = half == DType::kBF16 ? "bf16" : "f16";
      std::vector<uint16_t> h = {to16(1.5f + static_cast<float>(r)), to16(-0.25f)};
      comm->all_reduce_sum(h.data(), h.size(), half);
      const float total = 1.5f * static_cast<float>(n) + static_cast<float>(n * (n - 1) / 2);
      expect_eq(name, r, h, {to16(total), to16(-0.25f * static_cast<float>(n))});
      std::vector<uint16_t> hb(static_cast<size_t>(n)), hr(1);
      for (int i = 0; i < n; ++i) hb[static_cast<size_t>(i)] = to16(static_cast<float>(10 * r + i));
      comm->reduce_scatter_sum(hb.data(), hr.data(), 1, half);
      expect_eq(name, r, hr, {to16(static_cast<float>(10 * n * (n - 1) / 2 + n * r))});
      std::vector<uint16_t> hg(static_cast<size_t>(n)), want_hg;
      const uint16_t own = to16(static_cast<float>(r));
      comm->all_gather(&own, hg.data(), 1, half);
      for (int i = 0; i < n; ++i) want_hg.push_back(to16(static_cast<float>(i)));
      expect_eq(name, r, hg, want_hg);
    }

    // In place, as NCCL allows: the all-gather's send is this rank's block of recv, the reduce-scatter's recv
    // this rank's block of send.
    std::vector<int32_t> gather_in_place(static_cast<size_t>(2 * n), -1);
    gather_in_place[static_cast<size_t>(2 * r)] = r;
    gather_in_place[static_cast<size_t>(2 * r + 1)] = -r;
    comm->all_gather(gather_in_place.data() + 2 * r, gather_in_place.data(), 2, DType::kI32);
    expect_eq("all_gather in place", r, gather_in_place, want_all);
    // Blocks of 64k values (OpenMPI 4.1 on one host gave right results without MPI_IN_PLACE or the copy too:
    // the standard forbids the aliasing all the same).
    constexpr size_t kBlock = size_t{1} << 16;
    std::vector<double> big(kBlock * static_cast<size_t>(n));
    for (size_t i = 0; i < big.size(); ++i) big[i] = 10.0 * r + static_cast<double>(i);
    comm->reduce_scatter_sum(big.data(), big.data() + kBlock * static_cast<size_t>(r), kBlock, DType::kF64);
    std::vector<double> want_big(kBlock);
    for (size_t i = 0; i < kBlock; ++i) {
      want_big[i] = 10.0 * n * (n - 1) / 2 + static_cast<double>(n) * static_cast<double>(kBlock * r + i);
    }
    expect_eq("reduce_scatter_sum in place", r,
              std::vector<double>(big.begin() + static_cast<std::ptrdiff_t>(kBlock * r),
                                  big.begin() + static_cast<std::ptrdiff_t>(kBlock * (r + 1))),
              want_big);

    auto sub = comm->split(r % 2, r);
    std::vector<float> s = {1.0f};
    sub->all_reduce_sum(s.data(), 1, DType::kF32);
    expect_eq("split + all_reduce_sum", r, s, {static_cast<float>((n + (r % 2 == 0 ? 1 : 0)) / 2)});
    comm->barrier();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return failures == 0 ? 0 : 1;
}
