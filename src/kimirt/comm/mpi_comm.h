// Comm over MPI for CPU ranks in separate processes (`mpirun -np N kimirt run --device cpu ...`): the
// sharded CPU forward across processes or hosts. Built only when MPI is found (KIMIRT_HAVE_MPI); GPU
// ranks use NCCL (cuda/nccl_comm) instead.
#pragma once

#include <memory>

#include "kimirt/comm/comm.h"

namespace kimirt {

// True when the process was started by an MPI launcher (Open MPI's mpirun, or a PMI launcher such as MPICH's
// mpiexec), whether or not this build has MPI: a build without it must refuse such a launch rather than run
// every process as a whole group of its own.
bool launched_under_mpi();
// True when this build has MPI (MpiComm works).
bool mpi_built();

class MpiComm final : public Comm {
 public:
  // MPI_COMM_WORLD (initializes MPI on first use). Throws when kimirt was built without MPI.
  static std::unique_ptr<MpiComm> world();
  ~MpiComm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(void* buf, size_t count, DType dtype, void* stream = nullptr) override;
  void all_gather(const void* send, void* recv, size_t count, DType dtype, void* stream = nullptr) override;
  void reduce_scatter_sum(const void* send, void* recv, size_t count, DType dtype, void* stream = nullptr) override;
  void all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                    std::span<const size_t> recv_counts, DType dtype, void* stream = nullptr) override;
  void broadcast(void* buf, size_t count, DType dtype, int root, void* stream = nullptr) override;
  void barrier() override;
  std::unique_ptr<Comm> split(int color, int key) override;

  // Ends every process of the launch (MPI_Abort on MPI_COMM_WORLD) with exit_code: what a rank that failed
  // does, so that the others do not wait in a collective forever.
  [[noreturn]] void abort(int exit_code);

 private:
  struct Impl;
  MpiComm(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace kimirt
