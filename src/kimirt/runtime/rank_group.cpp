#include "kimirt/runtime/rank_group.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "kimirt/base/delayed_report.h"
#include "kimirt/base/error.h"
#include "kimirt/base/printable.h"
#include "kimirt/base/start_threads.h"
#include "kimirt/base/thread_pool.h"
#include "kimirt/comm/local_comm.h"
#include "kimirt/comm/mpi_comm.h"

#ifdef KIMIRT_HAVE_CUDA
#include "kimirt/cuda/device.h"
#include "kimirt/cuda/nccl_comm.h"
#endif

namespace kimirt::runtime {
namespace {

// The first of the launcher's variables that is set, as a number; -1 when none is.
int env_number(std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (const char* v = std::getenv(name); v && *v) {
      char* end = nullptr;
      const long n = std::strtol(v, &end, 10);
      KIMIRT_CHECK(end && *end == '\0' && n >= 0 && n < (1 << 20), "environment: {}={} is not a rank number", name, v);
      return static_cast<int>(n);
    }
  }
  return -1;
}

// Runs fn on one thread per comm; when one throws, abort(reason) releases the others and its error wins.
void run_threads(std::vector<Comm*> comms, const std::function<void(Comm&)>& fn,
                 const std::function<void(const std::string&)>& abort) {
  std::mutex mutex;
  std::exception_ptr first;
  auto rank = [&](size_t r) {
    try {
      fn(*comms[r]);
    } catch (...) {
      std::string what = "an unknown error";
      try {
        throw;
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      bool is_first = false;
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (!first) {
          first = std::current_exception();
          is_first = true;
        }
      }
      if (is_first) abort("rank " + std::to_string(r) + " failed: " + what);
    }
  };
  // A rank whose thread cannot start would leave the others waiting for it in their first collective.
  std::vector<std::thread> threads = start_threads(comms.size(), fmt::format("a group of {} ranks", comms.size()), rank,
                                                   [&] { abort("not every rank's thread could start"); });
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

#ifdef KIMIRT_HAVE_CUDA
int local_process_rank() {
  const int local = env_number({"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "KIMIRT_LOCAL_RANK"});
  return local < 0 ? 0 : local;
}
#endif

// Processes the launcher started on this host; 1 outside a launcher.
int local_ranks() {
  if (!launched_under_mpi()) return 1;
  const int n = env_number({"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"});
  return n < 1 ? 1 : n;
}

// The CPUs the processes of this host share: the container's cpuset when there is one (sysconf counts the
// host's, and ranks dividing those would still oversubscribe an 8-CPU container), else the online ones.
size_t shared_cpus() {
  for (const char* path : {"/sys/fs/cgroup/cpuset.cpus.effective", "/sys/fs/cgroup/cpuset/cpuset.effective_cpus"}) {
    std::ifstream file(path);
    std::string list;
    if (file && std::getline(file, list)) {
      if (const size_t n = count_cpu_list(list); n > 0) return n;
    }
  }
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : static_cast<size_t>(n);
}

}  // namespace

size_t count_cpu_list(std::string_view list) {
  size_t count = 0;
  while (!list.empty()) {
    const size_t comma = list.find(',');
    const std::string_view item = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    unsigned long first = 0, last = 0;
    const size_t dash = item.find('-');
    const auto parse = [](std::string_view text, unsigned long& value) {
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
      return ec == std::errc() && end == text.data() + text.size();
    };
    if (dash == std::string_view::npos) {
      if (!parse(item, first)) return 0;
      last = first;
    } else if (!parse(item.substr(0, dash), first) || !parse(item.substr(dash + 1), last) || last < first) {
      return 0;
    }
    count += last - first + 1;
  }
  return count;
}

size_t threads_per_process(size_t allowed, size_t shared, int local_ranks) {
  const size_t share = std::max<size_t>(1, shared / static_cast<size_t>(std::max(1, local_ranks)));
  return std::max<size_t>(1, std::min(allowed, share));
}

size_t default_threads() { return threads_per_process(hardware_threads(), shared_cpus(), local_ranks()); }

std::string default_threads_note() {
  const int local = local_ranks();
  const size_t pool = shared_cpus(), allowed = hardware_threads(), share = threads_per_process(pool, pool, local);
  if (local <= 1 || allowed >= share) return {};
  return fmt::format(
      "kimirt: mpirun bound this process to {} of the {} CPUs its host's processes share ({} each would share "
      "them); mpirun --bind-to none, or --map-by slot:PE={}, gives each process more, and --threads sets the count",
      allowed, pool, share, share);
}

RankLaunch plan_launch(Device device, int tp) {
  KIMIRT_CHECK(tp >= 0, "--tp must be at least 1, got {}", tp);
  RankLaunch launch;
  launch.device = device;
  if (launched_under_mpi()) {
    const int world = env_number({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"});
    const int rank = env_number({"OMPI_COMM_WORLD_RANK", "PMI_RANK"});
    KIMIRT_CHECK(world >= 1 && rank >= 0 && rank < world, "mpirun: this process is rank {} of {}", rank, world);
    // Without MPI the processes could not meet: each would run the whole group by itself (N times the memory,
    // N times the output). One process may still run its ranks inside itself.
    KIMIRT_CHECK(world == 1 || mpi_built(),
                 "mpirun started {} processes, but this kimirt was built without MPI, so they cannot form one group "
                 "(install libopenmpi-dev and rebuild, or run one process with --tp {} over this machine's devices)",
                 world, world);
    if (mpi_built()) {
      KIMIRT_CHECK(tp == 0 || tp == world,
                   "--tp {}: under mpirun every process is one rank, and mpirun started {} (use -np {} or --tp {})", tp,
                   world, tp, world);
      launch.world_size = world;
      launch.per_process = true;
      launch.process_rank = rank;
      return launch;
    }
  }
  launch.world_size = tp == 0 ? 1 : tp;
  return launch;
}

void run_local_ranks(int size, const std::function<void(Comm& comm)>& fn) {
  auto comms = LocalComm::create_group(size);
  std::vector<Comm*> ranks;
  for (auto& c : comms) ranks.push_back(c.get());
  run_threads(ranks, fn, [&](const std::string& reason) { comms[0]->abort(reason); });
}

void run_ranks(const RankLaunch& launch, const std::function<void(Comm& comm)>& fn) {
  if (!launch.per_process) {
    if (launch.device == Device::kCpu) {
      run_local_ranks(launch.world_size, fn);
      return;
    }
#ifdef KIMIRT_HAVE_CUDA
    const int devices = cuda::device_count();
    KIMIRT_CHECK(launch.world_size <= devices, "--tp {} in one process needs {} GPUs, this machine has {}",
                 launch.world_size, launch.world_size, devices);
    // One call sets up every rank: threads joining one by one could leave the others waiting in NCCL's
    // set-up, which has no time limit, when one failed before joining.
    std::vector<int> gpus(static_cast<size_t>(launch.world_size));
    for (int r = 0; r < launch.world_size; ++r) gpus[static_cast<size_t>(r)] = r;
    const auto comms = cuda::NcclComm::create_all(gpus);
    std::vector<Comm*> ranks;
    for (auto& c : comms) ranks.push_back(c.get());
    // Each rank's thread makes its GPU current first: every call of fn that allocates, launches or makes a
    // stream then goes to the rank's GPU.
    const auto on_rank_gpu = [&fn](Comm& c) {
      cuda::set_current_device(static_cast<cuda::NcclComm&>(c).device());
      fn(c);
    };
    // A failed rank leaves the others waiting in their next collective, which blocking NCCL never times out
    // (aborting a communicator under a thread that may be inside a call on it is not safe with this NCCL):
    // when the group has not ended a few seconds after a failure, the failure is printed, so that a hung
    // group at least says why. A group that ends reports it once, through the error rethrown here.
    DelayedReport hang_report(std::chrono::seconds(5));
    run_threads(ranks, on_rank_gpu, [&hang_report](const std::string& reason) {
      hang_report.arm(reason + " (the other ranks are still waiting for it, in a collective)");
    });
    return;
#else
    fail("--device {}: this kimirt was built without CUDA", device_name(launch.device));
#endif
  }

  // One rank per process.
  auto open_and_run = [&] {
    std::unique_ptr<Comm> comm;
    if (launch.device == Device::kCpu) {
      comm = MpiComm::world();
    } else {
#ifdef KIMIRT_HAVE_CUDA
      comm = cuda::NcclComm::from_mpi(local_process_rank() % std::max(cuda::device_count(), 1));
#else
      fail("--device {}: this kimirt was built without CUDA", device_name(launch.device));
#endif
    }
    // The launcher's environment and MPI's own count must agree, or the model would be sharded for a group
    // that is not the one the collectives run over.
    KIMIRT_CHECK(comm->size() == launch.world_size && comm->rank() == launch.process_rank,
                 "MPI: the launcher said rank {} of {}, the communicator is rank {} of {}", launch.process_rank,
                 launch.world_size, comm->rank(), comm->size());
    fn(*comm);
  };
  if (launch.world_size == 1) {
    open_and_run();
    return;
  }
  try {
    open_and_run();
  } catch (const std::exception& e) {
    // The other processes cannot be reached to unblock them: say what happened, then end the launch.
    std::fprintf(stderr, "kimirt: error: rank %d of %d: %s\n", launch.process_rank, launch.world_size,
                 printable(e.what()).c_str());
    std::fflush(stderr);
    MpiComm::world()->abort(1);
  }
}

}  // namespace kimirt::runtime
