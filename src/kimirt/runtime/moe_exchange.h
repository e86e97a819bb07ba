// The token exchange of the all-to-all MoE path (ParallelConfig: all_to_all, and always under attention-DP),
// for expert parallelism with whole experts per rank: every (token, slot) pair's row goes to the rank that
// owns the pair's expert, that rank runs its experts on what it received, and the outputs come back to the
// pair's token. Three all-to-all-v per call pair: the pair counts, the rows (dispatch), the outputs
// (combine). Host buffers, kept and reused from call to call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kimirt/comm/comm.h"

namespace kimirt::runtime {

// The rows [begin, end) of `tokens` that `rank` of `ranks` owns when every rank holds all of them
// (contiguous; the shares differ by at most one token, the lower ranks taking the remainder).
struct TokenShare {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};
TokenShare token_share(int64_t tokens, int ranks, int rank);

class MoeExchange {
 public:
  // comm: the expert-parallel group; rank r owns experts [r·E/size, (r+1)·E/size).
  MoeExchange(Comm& comm, int64_t num_experts);

  // Sends row t of rows[tokens, width] to the owner of expert ids[t·top_k + j], for every slot j.
  // Collective: every rank calls it, with zero tokens if it has none.
  void dispatch(const float* rows, int64_t tokens, int64_t width, const int32_t* ids, int64_t top_k);

  // What dispatch() delivered to this rank: received() rows [n, width], the global expert id of each, and
  // results() [n, width], where the caller puts each row's expert output before combine().
  int64_t received() const { return static_cast<int64_t>(recv_experts_.size()); }
  const float* received_rows() const { return recv_rows_.data(); }
  const int32_t* received_experts() const { return recv_experts_.data(); }
  float* results() { return results_.data(); }

  // Returns every rank its pairs' outputs: out[(t·top_k + j), width] is the output for pair (t, j) of the
  // last dispatch(). Collective.
  void combine(float* out);

 private:
  Comm& comm_;
  int64_t experts_per_rank_;
  int64_t width_ = 0;
  int64_t pairs_ = 0;
  std::vector<size_t> send_counts_, recv_counts_, send_elems_, recv_elems_, next_;
  const std::vector<size_t> ones_;
  std::vector<int64_t> send_pos_;  // pair → its row in the send order (grouped by destination rank)
  std::vector<float> send_, recv_, back_;
  std::vector<float> recv_rows_, results_;
  std::vector<int32_t> recv_experts_;
};

}  // namespace kimirt::runtime
