#include "kimirt/cuda/nccl_comm.h"

#include <cuda_runtime_api.h>
#include <fmt/ranges.h>
#include <nccl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "kimirt/base/error.h"
#include "kimirt/comm/mpi_comm.h"
#include "kimirt/cuda/check.h"
#include "kimirt/cuda/device.h"

namespace kimirt::cuda {
namespace {

static_assert(sizeof(ncclUniqueId) == sizeof(NcclId), "ncclUniqueId is 128 bytes");

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF64:
      return ncclFloat64;
    case DType::kF16:
      return ncclFloat16;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kI8:
      return ncclInt8;
    case DType::kU8:
      return ncclUint8;
    case DType::kI32:
      return ncclInt32;
    case DType::kU32:
      return ncclUint32;
    case DType::kI64:
      return ncclInt64;
    case DType::kU64:
      return ncclUint64;
    default:
      fail("NCCL: no data type for {}", dtype_name(dtype));
  }
}

size_t element_bytes(DType dtype) {
  const int bits = dtype_bits(dtype);
  KIMIRT_CHECK(bits % 8 == 0, "NCCL: {} is not byte-sized", dtype_name(dtype));
  return static_cast<size_t>(bits / 8);
}

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  KIMIRT_CHECK(end != v && *end == '\0' && x >= 0 && x < (1 << 20), "environment: {}={} is not a rank number", name, v);
  return static_cast<int>(x);
}

}  // namespace

struct NcclComm::Impl {
  int device = 0;
  ncclComm_t comm = nullptr;
  int* scratch = nullptr;  // one int of device memory for barrier()
  explicit Impl(int device_) : device(device_) {}
  // Here rather than in ~NcclComm, so that a create(), create_all() or split() that throws after NCCL made
  // the communicator frees it (a failed ncclCommInitAll's are aborted in create_all).
  ~Impl() {
    const DeviceGuard on_device(device, std::nothrow);
    if (scratch) cudaFree(scratch);
    if (comm) ncclCommDestroy(comm);
  }
};

NcclId nccl_new_id() {
  ncclUniqueId id;
  KIMIRT_NCCL_CHECK(ncclGetUniqueId(&id));
  NcclId out;
  std::memcpy(out.data(), &id, sizeof(id));
  return out;
}

ProcessRank process_rank_from_env() {
  ProcessRank p;
  if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr) {
    p.world_size = env_int("OMPI_COMM_WORLD_SIZE", 1);
    p.rank = env_int("OMPI_COMM_WORLD_RANK", 0);
    p.under_mpi = true;
  } else if (std::getenv("PMI_SIZE") != nullptr) {
    p.world_size = env_int("PMI_SIZE", 1);
    p.rank = env_int("PMI_RANK", 0);
    p.under_mpi = true;
  } else {
    p.world_size = env_int("KIMIRT_WORLD_SIZE", 1);
    p.rank = env_int("KIMIRT_RANK", 0);
  }
  KIMIRT_CHECK(p.world_size >= 1 && p.rank < p.world_size, "environment: rank {} outside a world of {}", p.rank,
               p.world_size);
  return p;
}

NcclComm::NcclComm(std::unique_ptr<Impl> impl, int rank, int size, int device)
    : impl_(std::move(impl)), rank_(rank), size_(size), device_(device) {}

NcclComm::~NcclComm() = default;  // Impl frees, on its device

std::unique_ptr<NcclComm> NcclComm::create(const NcclId& id, int world_size, int rank, int device) {
  KIMIRT_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "NCCL: rank {} outside a world of {}", rank,
               world_size);
  KIMIRT_CUDA_CHECK(cudaSetDevice(device));
  ncclUniqueId nid;
  std::memcpy(&nid, id.data(), sizeof(nid));
  auto impl = std::make_unique<Impl>(device);
  KIMIRT_NCCL_CHECK(ncclCommInitRank(&impl->comm, world_size, nid, rank));
  KIMIRT_CUDA_CHECK(cudaMalloc(&impl->scratch, sizeof(int)));
  return std::unique_ptr<NcclComm>(new NcclComm(std::move(impl), rank, world_size, device));
}

std::vector<std::unique_ptr<NcclComm>> NcclComm::create_all(std::span<const int> devices) {
  const int n = static_cast<int>(devices.size());
  KIMIRT_CHECK(n >= 1, "NCCL: a group needs at least one device");
  const int available = device_count();
  for (int r = 0; r < n; ++r) {
    KIMIRT_CHECK(devices[r] >= 0 && devices[r] < available, "NCCL: rank {}'s device {} is not one of this machine's {}",
                 r, devices[r], available);
    for (int q = 0; q < r; ++q) {
      // NCCL does not support one device as two ranks of a communicator (it may hang).
      KIMIRT_CHECK(devices[q] != devices[r], "NCCL: ranks {} and {} are both on device {}", q, r, devices[r]);
    }
  }
  // Everything that may throw for lack of memory is made first: once ncclCommInitAll returns, each
  // communicator has its owner before anything else can fail.
  std::vector<std::unique_ptr<Impl>> impls;
  for (int r = 0; r < n; ++r) impls.push_back(std::make_unique<Impl>(devices[r]));
  std::vector<ncclComm_t> raw(static_cast<size_t>(n), nullptr);
  std::vector<std::unique_ptr<NcclComm>> comms;
  comms.reserve(static_cast<size_t>(n));
  const int caller_device = current_device();
  const ncclResult_t init = ncclCommInitAll(raw.data(), n, devices.data());
  if (init != ncclSuccess) {
    const std::string why = fmt::format("NCCL: setting up {} ranks on devices {} failed: {} ({})", n,
                                        fmt::join(devices, ", "), ncclGetErrorString(init), ncclGetLastError(nullptr));
    // A failed ncclCommInitAll hands back the communicators it had made (their buffers and proxy threads):
    // aborted, as a failed communicator must be (destroy returns early on one).
    for (ncclComm_t c : raw) {
      if (c) ncclCommAbort(c);
    }
    set_current_device(caller_device);
    fail("{}", why);
  }
  for (size_t r = 0; r < impls.size(); ++r) impls[r]->comm = raw[r];
  set_current_device(caller_device);  // ncclCommInitAll leaves one of the group's devices current
  for (int r = 0; r < n; ++r) {
    auto& impl = impls[static_cast<size_t>(r)];
    const DeviceGuard on_device(devices[r]);
    KIMIRT_CUDA_CHECK(cudaMalloc(&impl->scratch, sizeof(int)));
    comms.push_back(std::unique_ptr<NcclComm>(new NcclComm(std::move(impl), r, n, devices[r])));
  }
  return comms;
}

std::unique_ptr<NcclComm> NcclComm::from_id_file(const std::filesystem::path& id_file, int world_size, int rank,
                                                 int device, std::chrono::seconds timeout) {
  NcclId id{};
  if (rank == 0) {
    id = nccl_new_id();
    // Write then rename, so that a waiting rank never reads half an id.
    const auto tmp = id_file.string() + ".tmp." + std::to_string(::getpid());
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(id.data(), static_cast<std::streamsize>(id.size()));
      KIMIRT_CHECK(out.good(), "NCCL: cannot write the unique id to {}", tmp);
    }
    std::error_code ec;
    std::filesystem::rename(tmp, id_file, ec);
    KIMIRT_CHECK(!ec, "NCCL: cannot move the unique id to {}: {}", id_file.string(), ec.message());
  } else {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      std::ifstream in(id_file, std::ios::binary);
      if (in && in.read(id.data(), static_cast<std::streamsize>(id.size())) && in.gcount() == 128) break;
      KIMIRT_CHECK(std::chrono::steady_clock::now() < deadline, "NCCL: rank {} waited {} s for the unique id in {}",
                   rank, timeout.count(), id_file.string());
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  auto comm = create(id, world_size, rank, device);
  // Every rank has read the id once create() returns (it is collective): a later launch on the same path
  // must not find this one's id and join a communicator that no longer exists.
  if (rank == 0) {
    std::error_code ec;
    std::filesystem::remove(id_file, ec);
  }
  return comm;
}

std::unique_ptr<NcclComm> NcclComm::from_mpi(int device) {
#ifdef KIMIRT_HAVE_MPI
  // MpiComm initializes MPI as the CPU ranks do (thread level, finalize at exit, errors as codes).
  const auto world = MpiComm::world();
  NcclId id{};
  if (world->rank() == 0) id = nccl_new_id();
  world->broadcast(id.data(), id.size(), DType::kU8, 0);
  return create(id, world->size(), world->rank(), device);
#else
  (void)device;
  fail(
      "NCCL: launched under MPI, but this kimirt was built without MPI (install libopenmpi-dev and rebuild), "
      "or run the ranks in one process (--tp N over the GPUs of one machine)");
#endif
}

void NcclComm::all_reduce_sum(void* buf, size_t count, DType dtype, void* stream) {
  ++num_all_reduces_;
  KIMIRT_NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type(dtype), ncclSum, impl_->comm, as_stream(stream)));
}

void NcclComm::all_gather(const void* send, void* recv, size_t count, DType dtype, void* stream) {
  KIMIRT_NCCL_CHECK(ncclAllGather(send, recv, count, nccl_type(dtype), impl_->comm, as_stream(stream)));
}

void NcclComm::reduce_scatter_sum(const void* send, void* recv, size_t count, DType dtype, void* stream) {
  KIMIRT_NCCL_CHECK(ncclReduceScatter(send, recv, count, nccl_type(dtype), ncclSum, impl_->comm, as_stream(stream)));
}

void NcclComm::all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                            std::span<const size_t> recv_counts, DType dtype, void* stream) {
  const auto n = static_cast<size_t>(size_);
  KIMIRT_CHECK(send_counts.size() == n && recv_counts.size() == n,
               "NCCL: all_to_all_v needs {} send and recv counts, got {} and {}", n, send_counts.size(),
               recv_counts.size());
  const size_t elem = element_bytes(dtype);
  const ncclDataType_t type = nccl_type(dtype);
  size_t send_offset = 0, recv_offset = 0;
  KIMIRT_NCCL_CHECK(ncclGroupStart());
  // A failed send or receive must not leave this thread inside the group (every later call would be deferred).
  struct GroupEnd {
    bool open = true;
    ~GroupEnd() {
      if (open) ncclGroupEnd();
    }
  } group;
  for (size_t r = 0; r < n; ++r) {
    const int peer = static_cast<int>(r);
    if (send_counts[r]) {
      KIMIRT_NCCL_CHECK(ncclSend(static_cast<const char*>(send) + send_offset * elem, send_counts[r], type, peer,
                                 impl_->comm, as_stream(stream)));
    }
    if (recv_counts[r]) {
      KIMIRT_NCCL_CHECK(ncclRecv(static_cast<char*>(recv) + recv_offset * elem, recv_counts[r], type, peer, impl_->comm,
                                 as_stream(stream)));
    }
    send_offset += send_counts[r];
    recv_offset += recv_counts[r];
  }
  group.open = false;
  KIMIRT_NCCL_CHECK(ncclGroupEnd());
}

void NcclComm::broadcast(void* buf, size_t count, DType dtype, int root, void* stream) {
  KIMIRT_CHECK(root >= 0 && root < size_, "NCCL: broadcast root {} outside a group of {}", root, size_);
  KIMIRT_NCCL_CHECK(ncclBroadcast(buf, buf, count, nccl_type(dtype), root, impl_->comm, as_stream(stream)));
}

void NcclComm::barrier() {
  const DeviceGuard on_device(device_);
  KIMIRT_NCCL_CHECK(ncclAllReduce(impl_->scratch, impl_->scratch, 1, ncclInt32, ncclSum, impl_->comm, nullptr));
  KIMIRT_CUDA_CHECK(cudaStreamSynchronize(nullptr));
}

std::unique_ptr<Comm> NcclComm::split(int color, int key) {
  // NCCL_SPLIT_NOCOLOR (-1) would leave this rank without a communicator (a null one, failing later with a bare
  // "invalid argument"); the host communicators refuse negative colors too.
  KIMIRT_CHECK(color >= 0, "NCCL: split color {} must not be negative", color);
  const DeviceGuard on_device(device_);  // the sub-communicator's scratch goes on this comm's device
  auto impl = std::make_unique<Impl>(device_);
  KIMIRT_NCCL_CHECK(ncclCommSplit(impl_->comm, color, key, &impl->comm, nullptr));
  int rank = 0, size = 1;
  KIMIRT_NCCL_CHECK(ncclCommUserRank(impl->comm, &rank));
  KIMIRT_NCCL_CHECK(ncclCommCount(impl->comm, &size));
  KIMIRT_CUDA_CHECK(cudaMalloc(&impl->scratch, sizeof(int)));
  return std::unique_ptr<NcclComm>(new NcclComm(std::move(impl), rank, size, device_));
}

}  // namespace kimirt::cuda
