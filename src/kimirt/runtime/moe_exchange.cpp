#include "kimirt/runtime/moe_exchange.h"

#include <algorithm>
#include <numeric>

#include "kimirt/base/error.h"

namespace kimirt::runtime {
namespace {

static_assert(sizeof(size_t) == sizeof(uint64_t), "pair counts travel as U64");

// An expert id rides in its row as one more float: exact for ids below 2^24.
constexpr int64_t kMaxExperts = int64_t{1} << 24;

}  // namespace

TokenShare token_share(int64_t tokens, int ranks, int rank) {
  KIMIRT_ASSERT(ranks >= 1 && rank >= 0 && rank < ranks && tokens >= 0);
  const int64_t base = tokens / ranks, extra = tokens % ranks;
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

MoeExchange::MoeExchange(Comm& comm, int64_t num_experts)
    : comm_(comm), experts_per_rank_(0), ones_(static_cast<size_t>(comm.size()), 1) {
  KIMIRT_CHECK(num_experts > 0 && num_experts % comm.size() == 0 && num_experts < kMaxExperts,
               "MoE exchange: {} experts cannot be split evenly over {} ranks", num_experts, comm.size());
  experts_per_rank_ = num_experts / comm.size();
  const auto n = static_cast<size_t>(comm.size());
  send_counts_.resize(n);
  recv_counts_.resize(n);
  send_elems_.resize(n);
  recv_elems_.resize(n);
  next_.resize(n);
}

void MoeExchange::dispatch(const float* rows, int64_t tokens, int64_t width, const int32_t* ids, int64_t top_k) {
  const auto ranks = static_cast<size_t>(comm_.size());
  width_ = width;
  pairs_ = tokens * top_k;
  const int64_t stride = width + 1;

  std::fill(send_counts_.begin(), send_counts_.end(), 0);
  for (int64_t p = 0; p < pairs_; ++p) {
    const int64_t owner = ids[p] / experts_per_rank_;
    KIMIRT_ASSERT(ids[p] >= 0 && owner < static_cast<int64_t>(ranks));
    ++send_counts_[static_cast<size_t>(owner)];
  }
  std::exclusive_scan(send_counts_.begin(), send_counts_.end(), next_.begin(), size_t{0});
  send_pos_.resize(static_cast<size_t>(pairs_));
  send_.resize(static_cast<size_t>(pairs_ * stride));
  for (int64_t p = 0; p < pairs_; ++p) {
    const auto pos = static_cast<int64_t>(next_[static_cast<size_t>(ids[p] / experts_per_rank_)]++);
    send_pos_[static_cast<size_t>(p)] = pos;
    float* dst = send_.data() + pos * stride;
    std::copy_n(rows + (p / top_k) * width, width, dst);
    dst[width] = static_cast<float>(ids[p]);
  }

  comm_.all_to_all_v(send_counts_.data(), ones_, recv_counts_.data(), ones_, DType::kU64);
  size_t received = 0;
  for (size_t r = 0; r < ranks; ++r) {
    send_elems_[r] = send_counts_[r] * static_cast<size_t>(stride);
    recv_elems_[r] = recv_counts_[r] * static_cast<size_t>(stride);
    received += recv_counts_[r];
  }
  recv_.resize(received * static_cast<size_t>(stride));
  comm_.all_to_all_v(send_.data(), send_elems_, recv_.data(), recv_elems_, DType::kF32);

  const auto n = static_cast<int64_t>(received);
  recv_rows_.resize(static_cast<size_t>(n * width));
  recv_experts_.resize(static_cast<size_t>(n));
  results_.resize(recv_rows_.size());
  for (int64_t i = 0; i < n; ++i) {
    const float* src = recv_.data() + i * stride;
    std::copy_n(src, width, recv_rows_.data() + i * width);
    recv_experts_[static_cast<size_t>(i)] = static_cast<int32_t>(src[width]);
  }
}

void MoeExchange::combine(float* out) {
  const auto ranks = static_cast<size_t>(comm_.size());
  for (size_t r = 0; r < ranks; ++r) {
    send_elems_[r] = recv_counts_[r] * static_cast<size_t>(width_);  // back the way they came
    recv_elems_[r] = send_counts_[r] * static_cast<size_t>(width_);
  }
  back_.resize(static_cast<size_t>(pairs_ * width_));
  comm_.all_to_all_v(results_.data(), send_elems_, back_.data(), recv_elems_, DType::kF32);
  for (int64_t p = 0; p < pairs_; ++p) {
    std::copy_n(back_.data() + send_pos_[static_cast<size_t>(p)] * width_, width_, out + p * width_);
  }
}

}  // namespace kimirt::runtime
