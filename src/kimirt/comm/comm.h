// Collective communication between the ranks of a tensor/expert-parallel group. Two implementations:
// NCCL (one process per GPU, cuda/nccl_comm) and an in-process one over threads sharing memory
// (comm/local_comm), so that the CPU tests run the sharded forward exactly like the GPUs do. A call may
// take a stream (a cudaStream_t for NCCL); the in-process implementation ignores it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "kimirt/tensor/dtype.h"

namespace kimirt {

// Bytes of `count` elements of `dtype`; throws for a count that is not a whole number of bytes.
size_t comm_bytes(size_t count, DType dtype);

class Comm {
 public:
  virtual ~Comm() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Sums take F32, F64, BF16, F16, and I8, U8, I32, U32, I64, U64 (wrapping), on every implementation, as
  // NCCL does. The 16-bit floats add in fp32: LocalComm rounds the whole sum once, NCCL and MPI each step.
  //
  // In place: buf holds count elements; afterwards every rank holds the elementwise sum.
  virtual void all_reduce_sum(void* buf, size_t count, DType dtype, void* stream = nullptr) = 0;
  // recv holds size() * count elements: rank r's send at offset r * count. In place when send is this rank's
  // block of recv.
  virtual void all_gather(const void* send, void* recv, size_t count, DType dtype, void* stream = nullptr) = 0;
  // send holds size() * count elements; rank r receives the sum of every rank's block r. In place when recv is
  // this rank's block of send.
  virtual void reduce_scatter_sum(const void* send, void* recv, size_t count, DType dtype, void* stream = nullptr) = 0;
  // send_counts[r] elements go to rank r (taken in rank order from send); recv_counts[r] come from rank r
  // (stored in rank order in recv). send and recv must not overlap.
  virtual void all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                            std::span<const size_t> recv_counts, DType dtype, void* stream = nullptr) = 0;
  virtual void broadcast(void* buf, size_t count, DType dtype, int root, void* stream = nullptr) = 0;
  virtual void barrier() = 0;
  // Ranks with the same color form a new group, ordered by key then rank (e.g. the dense-MLP TP subgroup).
  // Every rank of this group must call it.
  virtual std::unique_ptr<Comm> split(int color, int key) = 0;

  // Collective calls made through this object, for tests that count reductions.
  uint64_t num_all_reduces() const { return num_all_reduces_; }

 protected:
  uint64_t num_all_reduces_ = 0;
};

// A group of one: every collective is a copy or nothing. What a single-device run uses.
class SingleComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(void*, size_t, DType, void*) override { ++num_all_reduces_; }
  void all_gather(const void* send, void* recv, size_t count, DType dtype, void* stream) override;
  void reduce_scatter_sum(const void* send, void* recv, size_t count, DType dtype, void* stream) override;
  void all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                    std::span<const size_t> recv_counts, DType dtype, void* stream) override;
  void broadcast(void*, size_t, DType, int, void*) override {}
  void barrier() override {}
  std::unique_ptr<Comm> split(int, int) override { return std::make_unique<SingleComm>(); }
};

}  // namespace kimirt
