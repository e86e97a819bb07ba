// Run by ctest under `mpirun -np 3`: every collective of MpiComm across real processes. Exits non-zero
// (naming the collective) on any wrong result, on every rank that sees it.
#include <cstdio>
#include <exception>
#include <vector>

#include "kimirt/comm/mpi_comm.h"

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
