// Where the ranks of a parallel run live and how each gets its communicator, for any device:
//   in one process  one thread per rank (CPU: LocalComm over shared memory; CUDA: NCCL, GPU r for rank r);
//   under mpirun    this process is one rank (CPU: MpiComm; CUDA: NCCL bootstrapped through MPI, the GPU of
//                   the process's local rank).
// A rank that fails must not leave the others waiting in a collective: in one process on the CPU the group's
// LocalComm is aborted and the first error (the cause, not the aborts it caused) is rethrown; under mpirun the
// error is printed with the rank and the whole launch is aborted (MPI_Abort), as the other processes cannot be
// reached. Not yet for NCCL ranks in one process: the other ranks wait in their next collective, and the failure
// is printed if the group is still waiting 5 s later (a known gap: blocking communicators cannot be aborted
// safely under a thread that may be inside a call on them; non-blocking ones, polled, could).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include "kimirt/comm/comm.h"
#include "kimirt/runtime/backend_factory.h"

namespace kimirt::runtime {

struct RankLaunch {
  Device device = Device::kCpu;
  int world_size = 1;        // ranks in the group
  bool per_process = false;  // started by mpirun: this process is rank `process_rank`
  int process_rank = 0;
};

// This process's part of a group of `tp` ranks: under an MPI launcher the launcher's world (tp must equal its
// size; 0 takes it), otherwise `tp` ranks (0 means 1) in this process. Throws naming --tp on a mismatch. A build
// without MPI refuses a launch of several processes (they could not meet) and runs a launch of one as if
// there were no launcher.
RankLaunch plan_launch(Device device, int tp);

// CPU threads for this process when --threads is not given: the CPUs it may run on, but no more than its share
// of the host's when mpirun started several processes here (an unbound process sees every CPU, and N such
// processes with a thread per CPU each would run N threads per core).
size_t default_threads();
// The pure rule: `allowed` CPUs in the process's mask, `shared` CPUs that the host's processes share (its
// container's cpuset, or its online CPUs), `local_ranks` processes on it.
size_t threads_per_process(size_t allowed, size_t shared, int local_ranks);
// The CPUs of a kernel CPU list ("0-3,8,10-11": 7); 0 when it is not one.
size_t count_cpu_list(std::string_view list);
// Empty, or a line for stderr when mpirun's binding leaves this process fewer CPUs than its share (OpenMPI binds
// each process to one core when it starts two or fewer): how to give it more.
std::string default_threads_note();

// Runs fn(comm) for every rank this process owns, each with its communicator of the whole group (comm.rank()
// is the rank). Returns once every rank has returned.
void run_ranks(const RankLaunch& launch, const std::function<void(Comm& comm)>& fn);

// The in-process CPU group on its own: `size` threads over a LocalComm group.
void run_local_ranks(int size, const std::function<void(Comm& comm)>& fn);

}  // namespace kimirt::runtime
