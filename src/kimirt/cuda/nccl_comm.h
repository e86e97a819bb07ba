// Comm over NCCL: one process per GPU, buffers in device memory, every call on a CUDA stream (the
// `stream` argument is a cudaStream_t; null means the legacy default stream). The communicator is
// bootstrapped from a NCCL unique id that rank 0 creates and every rank must receive:
//   - under `mpirun -np N kimirt ...` through MPI (when kimirt was built with MPI),
//   - on one host without MPI through a file: rank 0 writes the id atomically, the others wait for it
//     (no launcher uses this path yet);
//   - in one process, one thread per GPU (runtime/rank_group.cpp): every communicator made by one call
//     (create_all), so that no rank can fail before joining and leave the others waiting in NCCL's set-up.
#pragma once

#include <array>
#include <chrono>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include "kimirt/comm/comm.h"

namespace kimirt::cuda {

// An opaque copy of ncclUniqueId (128 bytes), so that this header does not need <nccl.h>.
using NcclId = std::array<char, 128>;

NcclId nccl_new_id();

// Where this process sits: from the environment of mpirun (OMPI_COMM_WORLD_RANK/SIZE, PMI_RANK/SIZE) or
// kimirt's own KIMIRT_RANK / KIMIRT_WORLD_SIZE; rank 0 of 1 when none is set.
struct ProcessRank {
  int rank = 0;
  int world_size = 1;
  bool under_mpi = false;
};
ProcessRank process_rank_from_env();

class NcclComm final : public Comm {
 public:
  // Joins the communicator `id` as `rank` of `world_size` on CUDA device `device`. Collective: every rank
  // must call it.
  static std::unique_ptr<NcclComm> create(const NcclId& id, int world_size, int rank, int device);
  // The communicators of a group in one process, rank r on devices[r], made by one call (ncclCommInitAll):
  // a set-up that fails anywhere fails for all, and what NCCL had made is aborted. The devices must be distinct
  // CUDA devices of this machine.
  static std::vector<std::unique_ptr<NcclComm>> create_all(std::span<const int> devices);
  // Rank 0 creates the id and writes it to `id_file`; the others read it (waiting up to `timeout`). Rank 0
  // removes the file once every rank has joined; a launch that dies before that leaves its id behind, so a
  // launcher should give each launch a path of its own.
  static std::unique_ptr<NcclComm> from_id_file(const std::filesystem::path& id_file, int world_size, int rank,
                                                int device, std::chrono::seconds timeout = std::chrono::seconds(120));
  // Under mpirun: rank 0's id is broadcast with MPI. Throws when kimirt was built without MPI.
  static std::unique_ptr<NcclComm> from_mpi(int device);

  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const { return device_; }
  void all_reduce_sum(void* buf, size_t count, DType dtype, void* stream = nullptr) override;
  void all_gather(const void* send, void* recv, size_t count, DType dtype, void* stream = nullptr) override;
  void reduce_scatter_sum(const void* send, void* recv, size_t count, DType dtype, void* stream = nullptr) override;
  void all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                    std::span<const size_t> recv_counts, DType dtype, void* stream = nullptr) override;
  void broadcast(void* buf, size_t count, DType dtype, int root, void* stream = nullptr) override;
  // A one-element all-reduce, then a wait on the stream.
  void barrier() override;
  std::unique_ptr<Comm> split(int color, int key) override;

 private:
  struct Impl;
  NcclComm(std::unique_ptr<Impl> impl, int rank, int size, int device);

  std::unique_ptr<Impl> impl_;
  int rank_;
  int size_;
  int device_;
};

}  // namespace kimirt::cuda
