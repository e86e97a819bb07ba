#include "kimirt/comm/comm.h"

#include <cstring>

#include "kimirt/base/error.h"

namespace kimirt {
size_t comm_bytes(size_t count, DType dtype) {
  auto bytes = dtype_bytes(dtype, count);
  KIMIRT_CHECK(bytes.has_value(), "comm: {} elements of {} are not a whole number of bytes", count,
               dtype_name(dtype));
  return static_cast<size_t>(*bytes);
}

namespace {

void copy_if_distinct(const void* src, void* dst, size_t bytes) {
  if (src != dst && bytes) std::memcpy(dst, src, bytes);
}

}  // namespace

void SingleComm::all_gather(const void* send, void* recv, size_t count, DType dtype, void*) {
  copy_if_distinct(send, recv, comm_bytes(count, dtype));
}

void SingleComm::reduce_scatter_sum(const void* send, void* recv, size_t count, DType dtype, void*) {
  copy_if_distinct(send, recv, comm_bytes(count, dtype));
}

void SingleComm::all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                              std::span<const size_t> recv_counts, DType dtype, void*) {
  KIMIRT_CHECK(send_counts.size() == 1 && recv_counts.size() == 1 && send_counts[0] == recv_counts[0],
               "comm: all_to_all_v on one rank needs one equal send/recv count");
  copy_if_distinct(send, recv, comm_bytes(send_counts[0], dtype));
}

}  // namespace kimirt
