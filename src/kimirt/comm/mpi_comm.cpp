#include "kimirt/comm/mpi_comm.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#ifdef KIMIRT_HAVE_MPI
#include <mpi.h>
#endif

#include "kimirt/base/error.h"
#include "kimirt/comm/half_float.h"
#include "kimirt/tensor/float_convert.h"

namespace kimirt {

bool launched_under_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr;
}

bool mpi_built() {
#ifdef KIMIRT_HAVE_MPI
  return true;
#else
  return false;
#endif
}

#ifdef KIMIRT_HAVE_MPI

struct MpiComm::Impl {
  MPI_Comm comm = MPI_COMM_WORLD;
  bool owned = false;
};

namespace {

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kF64:
      return MPI_DOUBLE;
    case DType::kI32:
      return MPI_INT32_T;
    case DType::kI64:
      return MPI_INT64_T;
    case DType::kU8:
      return MPI_UINT8_T;
    case DType::kI8:
      return MPI_INT8_T;
    case DType::kU32:
      return MPI_UINT32_T;
    case DType::kU64:
      return MPI_UINT64_T;
    case DType::kBF16:
    case DType::kF16:
      return MPI_UINT16_T;  // MPI has no 16-bit floats: moved as 16-bit words, summed by sum_op's own operation
    default:
      fail("MPI: no data type for {}", dtype_name(dtype));
  }
}

// inout[i] ← in[i] + inout[i] for 16-bit floats, in fp32, rounded once per step (as NCCL's sums are).
template <float (*to_f32)(uint16_t), uint16_t (*from_f32)(float)>
void sum_16(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = from_f32(to_f32(a[i]) + to_f32(b[i]));
}

MPI_Op sum_op(DType dtype) {
  // Made once, after MPI_Init (every MpiComm comes from world()); MPI frees them at finalize.
  static const MPI_Op bf16_sum = [] {
    MPI_Op op;
    MPI_Op_create(&sum_16<bf16_to_f32, round_to_bf16>, 1, &op);
    return op;
  }();
  static const MPI_Op f16_sum = [] {
    MPI_Op op;
    MPI_Op_create(&sum_16<f16_to_f32, round_to_f16>, 1, &op);
    return op;
  }();
  if (dtype == DType::kBF16) return bf16_sum;
  if (dtype == DType::kF16) return f16_sum;
  return MPI_SUM;
}

bool overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return a_bytes && b_bytes && x < y + b_bytes && y < x + a_bytes;
}

int as_int(size_t count, const char* what) {
  KIMIRT_CHECK(count <= static_cast<size_t>(std::numeric_limits<int>::max()), "MPI: {} of {} elements is too large",
               what, count);
  return static_cast<int>(count);
}

void check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  fail("MPI: {} failed: {}", call, std::string(text, static_cast<size_t>(len)));
}

}  // namespace

MpiComm::MpiComm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  check(MPI_Comm_rank(impl_->comm, &rank_), "MPI_Comm_rank");
  check(MPI_Comm_size(impl_->comm, &size_), "MPI_Comm_size");
}

MpiComm::~MpiComm() {
  if (impl_ && impl_->owned) MPI_Comm_free(&impl_->comm);
}

std::unique_ptr<MpiComm> MpiComm::world() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    // Funneled: the process runs a thread pool, and only the thread that initialized MPI calls it.
    int provided = MPI_THREAD_SINGLE;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    // Finalize at exit so that mpirun sees a clean shutdown.
    std::atexit([] {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Finalize();
    });
    KIMIRT_CHECK(provided >= MPI_THREAD_FUNNELED,
                 "MPI: this MPI library gives a multi-threaded process no thread support (level {}; funneled is {})",
                 provided, static_cast<int>(MPI_THREAD_FUNNELED));
  }
  // Errors come back as codes, which become kimirt::Error, instead of aborting every rank.
  check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  return std::unique_ptr<MpiComm>(new MpiComm(std::make_unique<Impl>()));
}

void MpiComm::all_reduce_sum(void* buf, size_t count, DType dtype, void*) {
  ++num_all_reduces_;
  check(MPI_Allreduce(MPI_IN_PLACE, buf, as_int(count, "all_reduce"), mpi_type(dtype), sum_op(dtype), impl_->comm),
        "MPI_Allreduce");
}

// MPI forbids a send buffer that overlaps the receive buffer unless it is named MPI_IN_PLACE: the in-place
// all-gather (send = this rank's block of recv, as NCCL allows) is passed so, and any other overlap is sent
// from a copy.
void MpiComm::all_gather(const void* send, void* recv, size_t count, DType dtype, void*) {
  const MPI_Datatype t = mpi_type(dtype);
  const int n = as_int(count, "all_gather");
  const size_t bytes = comm_bytes(count, dtype);
  if (send == static_cast<const uint8_t*>(recv) + static_cast<size_t>(rank_) * bytes) send = MPI_IN_PLACE;
  std::vector<uint8_t> copy;
  if (send != MPI_IN_PLACE && overlap(send, bytes, recv, bytes * static_cast<size_t>(size_))) {
    copy.assign(static_cast<const uint8_t*>(send), static_cast<const uint8_t*>(send) + bytes);
    send = copy.data();
  }
  check(MPI_Allgather(send, n, t, recv, n, t, impl_->comm), "MPI_Allgather");
}

// In place (recv = this rank's block of send, as NCCL allows) or otherwise overlapping: sent from a copy.
// MPI's own in-place form would write the result at the start of the buffer, over another rank's block.
void MpiComm::reduce_scatter_sum(const void* send, void* recv, size_t count, DType dtype, void*) {
  const size_t bytes = comm_bytes(count, dtype);
  std::vector<uint8_t> copy;
  if (overlap(send, bytes * static_cast<size_t>(size_), recv, bytes)) {
    copy.assign(static_cast<const uint8_t*>(send),
                static_cast<const uint8_t*>(send) + bytes * static_cast<size_t>(size_));
    send = copy.data();
  }
  check(MPI_Reduce_scatter_block(send, recv, as_int(count, "reduce_scatter"), mpi_type(dtype), sum_op(dtype),
                                 impl_->comm),
        "MPI_Reduce_scatter_block");
}

void MpiComm::all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                           std::span<const size_t> recv_counts, DType dtype, void*) {
  const auto n = static_cast<size_t>(size_);
  KIMIRT_CHECK(send_counts.size() == n && recv_counts.size() == n,
               "MPI: all_to_all_v needs {} send and recv counts, got {} and {}", n, send_counts.size(),
               recv_counts.size());
  std::vector<int> sc(n), sd(n), rc(n), rd(n);
  size_t so = 0, ro = 0;
  for (size_t r = 0; r < n; ++r) {
    sc[r] = as_int(send_counts[r], "all_to_all_v");
    rc[r] = as_int(recv_counts[r], "all_to_all_v");
    sd[r] = as_int(so, "all_to_all_v offset");
    rd[r] = as_int(ro, "all_to_all_v offset");
    so += send_counts[r];
    ro += recv_counts[r];
  }
  const MPI_Datatype t = mpi_type(dtype);
  check(MPI_Alltoallv(send, sc.data(), sd.data(), t, recv, rc.data(), rd.data(), t, impl_->comm), "MPI_Alltoallv");
}

void MpiComm::broadcast(void* buf, size_t count, DType dtype, int root, void*) {
  KIMIRT_CHECK(root >= 0 && root < size_, "MPI: broadcast root {} outside a group of {}", root, size_);
  check(MPI_Bcast(buf, as_int(count, "broadcast"), mpi_type(dtype), root, impl_->comm), "MPI_Bcast");
}

void MpiComm::barrier() { check(MPI_Barrier(impl_->comm), "MPI_Barrier"); }

void MpiComm::abort(int exit_code) {
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort does not return; this is for implementations that do
}

std::unique_ptr<Comm> MpiComm::split(int color, int key) {
  // MPI_UNDEFINED (negative) would leave this rank without a communicator; LocalComm takes none either.
  KIMIRT_CHECK(color >= 0, "MPI: split color {} must not be negative", color);
  auto impl = std::make_unique<Impl>();
  check(MPI_Comm_split(impl_->comm, color, key, &impl->comm), "MPI_Comm_split");
  impl->owned = true;
  return std::unique_ptr<MpiComm>(new MpiComm(std::move(impl)));
}

#else  // no MPI in this build

struct MpiComm::Impl {};
MpiComm::MpiComm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MpiComm::~MpiComm() = default;
std::unique_ptr<MpiComm> MpiComm::world() {
  fail("this kimirt was built without MPI: install libopenmpi-dev and rebuild to run under mpirun");
}
void MpiComm::all_reduce_sum(void*, size_t, DType, void*) { fail("MPI is not built in"); }
void MpiComm::all_gather(const void*, void*, size_t, DType, void*) { fail("MPI is not built in"); }
void MpiComm::reduce_scatter_sum(const void*, void*, size_t, DType, void*) { fail("MPI is not built in"); }
void MpiComm::all_to_all_v(const void*, std::span<const size_t>, void*, std::span<const size_t>, DType, void*) {
  fail("MPI is not built in");
}
void MpiComm::broadcast(void*, size_t, DType, int, void*) { fail("MPI is not built in"); }
void MpiComm::barrier() { fail("MPI is not built in"); }
std::unique_ptr<Comm> MpiComm::split(int, int) { fail("MPI is not built in"); }
void MpiComm::abort(int exit_code) { std::_Exit(exit_code); }

#endif

}  // namespace kimirt
