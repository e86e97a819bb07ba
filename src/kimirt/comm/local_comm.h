// In-process Comm over threads that share memory: one LocalComm per rank, all made from one group. Used
// by the CPU tests and CPU runs of the sharded forward, so that tensor/expert parallelism is exercised
// without GPUs. Every collective is a rendezvous of all ranks: each publishes its buffer and arguments,
// waits for the others, checks that every rank called the same collective with the same count, dtype and
// root (all ranks throw together otherwise), reads what it needs, and waits again before anyone reuses a
// buffer. Sums are taken in rank
// order, so every rank gets bit-identical results (greedy decoding must agree across ranks).
// A rank that fails must not leave the others blocked in a rendezvous: abort() wakes them with an Error.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kimirt/comm/comm.h"

namespace kimirt {

class LocalCommGroup;

class LocalComm final : public Comm {
 public:
  // The ranks of a new group of `size` threads; hand comms[r] to the thread of rank r.
  static std::vector<std::unique_ptr<LocalComm>> create_group(int size);

  LocalComm(std::shared_ptr<LocalCommGroup> group, int rank);
  ~LocalComm() override;

  int rank() const override { return rank_; }
  int size() const override;
  void all_reduce_sum(void* buf, size_t count, DType dtype, void* stream = nullptr) override;
  void all_gather(const void* send, void* recv, size_t count, DType dtype, void* stream = nullptr) override;
  void reduce_scatter_sum(const void* send, void* recv, size_t count, DType dtype, void* stream = nullptr) override;
  void all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                    std::span<const size_t> recv_counts, DType dtype, void* stream = nullptr) override;
  void broadcast(void* buf, size_t count, DType dtype, int root, void* stream = nullptr) override;
  void barrier() override;
  std::unique_ptr<Comm> split(int color, int key) override;

  // Every rank of the group, and of the groups split from it, that waits in or later enters a collective
  // throws an Error carrying `reason`. Callable from any thread; the group cannot be used afterwards.
  void abort(const std::string& reason);

  // Groups split from this one that a member still uses: the group does not keep the others alive.
  size_t live_subgroups() const;

 private:
  std::shared_ptr<LocalCommGroup> group_;
  int rank_;
};

}  // namespace kimirt
