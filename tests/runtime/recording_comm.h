// A Comm that records every collective it forwards, interleaved with the TracePoints of a backend, in one
// log: what the tests of the MoE block's communication read (how many reductions per layer, and that the
// latent norm comes after them).
#pragma once

#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "kimirt/comm/comm.h"
#include "kimirt/runtime/op_trace.h"

namespace kimirt::runtime::testing {

struct LoggedCall {
  std::string op;           // "all_reduce", "all_gather", "reduce_scatter", "all_to_all_v", "broadcast", "barrier",
                            // "split", or a trace point's name ("moe_begin", "latent_norm", "moe_end")
  size_t count = 0;         // elements this rank sends (rows × cols for a trace point)
  int layer = -1;           // trace points only
  std::vector<float> data;  // latent_norm only: the latent about to be normalized
};

class RecordingComm final : public Comm, public OpTracer {
 public:
  explicit RecordingComm(Comm& inner) : inner_(&inner) {}
  explicit RecordingComm(std::unique_ptr<Comm> owned) : owned_(std::move(owned)), inner_(owned_.get()) {}

  std::vector<LoggedCall> log;

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  void all_reduce_sum(void* buf, size_t count, DType dtype, void* stream = nullptr) override {
    ++num_all_reduces_;
    log.push_back({"all_reduce", count});
    inner_->all_reduce_sum(buf, count, dtype, stream);
  }
  void all_gather(const void* send, void* recv, size_t count, DType dtype, void* stream = nullptr) override {
    log.push_back({"all_gather", count});
    inner_->all_gather(send, recv, count, dtype, stream);
  }
  void reduce_scatter_sum(const void* send, void* recv, size_t count, DType dtype, void* stream = nullptr) override {
    log.push_back({"reduce_scatter", count});
    inner_->reduce_scatter_sum(send, recv, count, dtype, stream);
  }
  void all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                    std::span<const size_t> recv_counts, DType dtype, void* stream = nullptr) override {
    log.push_back({"all_to_all_v", std::accumulate(send_counts.begin(), send_counts.end(), size_t{0})});
    inner_->all_to_all_v(send, send_counts, recv, recv_counts, dtype, stream);
  }
  void broadcast(void* buf, size_t count, DType dtype, int root, void* stream = nullptr) override {
    log.push_back({"broadcast", count});
    inner_->broadcast(buf, count, dtype, root, stream);
  }
  void barrier() override {
    log.push_back({"barrier", 0});
    inner_->barrier();
  }
  // The subgroup is recorded in its own log (the dense MLP's reductions on it are not MoE reductions).
  std::unique_ptr<Comm> split(int color, int key) override {
    log.push_back({"split", 0});
    return std::make_unique<RecordingComm>(inner_->split(color, key));
  }

  void on_point(TracePoint point, int layer, std::span<const float> data, int64_t rows, int64_t cols) override {
    LoggedCall c{std::string(trace_point_name(point)), static_cast<size_t>(rows * cols), layer, {}};
    if (point == TracePoint::kLatentNorm) c.data.assign(data.begin(), data.end());
    log.push_back(std::move(c));
  }

 private:
  std::unique_ptr<Comm> owned_;
  Comm* inner_;
};

// The calls strictly between moe_begin and moe_end of `layer` in a log (the last such block).
inline std::vector<LoggedCall> moe_calls(const std::vector<LoggedCall>& log, int layer) {
  std::vector<LoggedCall> out;
  bool inside = false;
  for (const auto& c : log) {
    if (c.op == "moe_begin" && c.layer == layer) {
      inside = true;
      out.clear();
    } else if (c.op == "moe_end" && c.layer == layer) {
      inside = false;
    } else if (inside) {
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace kimirt::runtime::testing
