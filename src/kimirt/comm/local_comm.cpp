#include "kimirt/comm/local_comm.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "kimirt/base/error.h"
#include "kimirt/comm/half_float.h"
#include "kimirt/tensor/float_convert.h"

namespace kimirt {

// What the ranks of one group share: a reusable barrier and one published slot per rank.
class LocalCommGroup {
 public:
  explicit LocalCommGroup(int size) : size_(size), slots_(static_cast<size_t>(size)) {}

  enum class Op : uint8_t { kAllReduce, kAllGather, kReduceScatter, kAllToAllV, kBroadcast, kSplit, kBarrier };

  // What a rank passed to the collective it is in. Published before the first rendezvous, read by every rank
  // after it, and not changed before the last one, so that no rank reads a slot while its owner rewrites it.
  struct Slot {
    Op op = Op::kAllReduce;
    const void* send = nullptr;
    size_t count = 0;  // elements (per rank for all_gather and reduce_scatter); unused by all_to_all_v, split
    DType dtype = DType::kF32;
    int root = 0;                         // broadcast
    std::span<const size_t> counts;       // all_to_all_v send counts
    std::span<const size_t> recv_counts;  // all_to_all_v
    int color = 0;
    int key = 0;
  };

  int size() const { return size_; }
  Slot& slot(int rank) { return slots_[static_cast<size_t>(rank)]; }

  // What the ranks disagree about in the collective they are in (empty when nothing): read by every rank
  // after the first rendezvous, so all see the same verdict.
  std::string disagreement() const {
    const Slot& first = slots_[0];
    const std::string_view op = op_name(first.op);
    for (int r = 1; r < size_; ++r) {
      const Slot& s = slots_[static_cast<size_t>(r)];
      if (s.op != first.op) {
        return fmt::format("comm: rank {} is in {} while rank 0 is in {}: the ranks are out of step", r, op_name(s.op),
                           op);
      }
      if (s.dtype != first.dtype) {
        return fmt::format("comm: {}: rank {} passed {} elements, rank 0 {}", op, r, dtype_name(s.dtype),
                           dtype_name(first.dtype));
      }
      if (s.count != first.count) {
        return fmt::format("comm: {}: rank {} passed a count of {}, rank 0 {}", op, r, s.count, first.count);
      }
      if (s.root != first.root) {
        return fmt::format("comm: {}: rank {} passed root {}, rank 0 root {}", op, r, s.root, first.root);
      }
    }
    // A negative color would leave a rank without a communicator: MPI and NCCL refuse it, and so does this.
    if (first.op == Op::kSplit) {
      for (int r = 0; r < size_; ++r) {
        const int color = slots_[static_cast<size_t>(r)].color;
        if (color < 0) return fmt::format("comm: split: rank {} passed color {}, which must not be negative", r, color);
      }
    }
    if (first.op == Op::kBroadcast && (first.root < 0 || first.root >= size_)) {
      return fmt::format("comm: broadcast root {} outside a group of {}", first.root, size_);
    }
    if (first.op == Op::kAllToAllV) {
      const auto n = static_cast<size_t>(size_);
      for (size_t r = 0; r < n; ++r) {
        if (slots_[r].counts.size() != n || slots_[r].recv_counts.size() != n) {
          return fmt::format("comm: all_to_all_v: rank {} passed {} send and {} recv counts for a group of {}", r,
                             slots_[r].counts.size(), slots_[r].recv_counts.size(), n);
        }
      }
      for (size_t r = 0; r < n; ++r) {
        for (size_t d = 0; d < n; ++d) {
          if (slots_[r].counts[d] != slots_[d].recv_counts[r]) {
            return fmt::format("comm: all_to_all_v: rank {} sends {} elements to rank {}, which expects {}", r,
                               slots_[r].counts[d], d, slots_[d].recv_counts[r]);
          }
        }
      }
    }
    return {};
  }

  // `abortable`: the first rendezvous of a call, where an abort releases the ranks. The later ones of a call
  // that every rank has entered (committed) ignore it: every rank is sure to come, and one released early
  // could free a buffer that another is still reading.
  void arrive_and_wait(bool abortable = true) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (abortable) throw_if_aborted();
    const uint64_t generation = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != generation || (abortable && aborted_); });
      if (generation_ == generation) throw_if_aborted();
    }
  }

  void abort(const std::string& reason) {
    std::vector<std::shared_ptr<LocalCommGroup>> subs;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (aborted_) return;
      aborted_ = true;
      reason_ = reason;
      for (auto& [id, weak] : subgroups_) {
        if (auto group = weak.lock()) subs.push_back(std::move(group));
      }
    }
    cv_.notify_all();
    for (auto& group : subs) group->abort(reason);
  }

  // The subgroup of `color` from the split numbered `split_id`, created by whichever member asks first. The
  // group holds it weakly (only to pass an abort on): it lives as long as a member's LocalComm does. Every
  // member asks between the two rendezvous of split(), while the first one's copy is still alive.
  std::shared_ptr<LocalCommGroup> subgroup(uint64_t split_id, int color, int members) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::erase_if(subgroups_, [](const auto& entry) { return entry.second.expired(); });
    auto& weak = subgroups_[{split_id, color}];
    std::shared_ptr<LocalCommGroup> group = weak.lock();
    if (!group) {
      group = std::make_shared<LocalCommGroup>(members);
      if (aborted_) group->abort(reason_);
      weak = group;
    }
    return group;
  }
  size_t live_subgroups() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::erase_if(subgroups_, [](const auto& entry) { return entry.second.expired(); });
    return subgroups_.size();
  }
  // Each rank numbers its own splits; as every rank calls split in the same order, the numbers agree.
  uint64_t next_split_id(int rank) {
    std::lock_guard<std::mutex> lock(mutex_);
    return split_counts_[rank]++;
  }

 private:
  int size_;
  std::vector<Slot> slots_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::map<std::pair<uint64_t, int>, std::weak_ptr<LocalCommGroup>> subgroups_;
  std::map<int, uint64_t> split_counts_;
  bool aborted_ = false;
  std::string reason_;

  void throw_if_aborted() const {
    if (aborted_) fail("comm: the group was aborted: {}", reason_);
  }

  static std::string_view op_name(Op op) {
    switch (op) {
      case Op::kAllReduce:
        return "all_reduce_sum";
      case Op::kAllGather:
        return "all_gather";
      case Op::kReduceScatter:
        return "reduce_scatter_sum";
      case Op::kAllToAllV:
        return "all_to_all_v";
      case Op::kBroadcast:
        return "broadcast";
      case Op::kSplit:
        return "split";
      case Op::kBarrier:
        return "barrier";
    }
    return "?";
  }
};

namespace {

// dst[i] = Σ_r srcs[r][offset + i] in rank order, summed as Acc (integers wrap to T, as NCCL's do).
template <typename T, typename Acc>
void sum_native(const std::vector<const void*>& srcs, size_t offset, size_t count, void* dst) {
  auto* d = static_cast<T*>(dst);
  for (size_t i = 0; i < count; ++i) {
    Acc acc = 0;
    for (const void* s : srcs) acc += static_cast<const T*>(s)[offset + i];
    d[i] = static_cast<T>(acc);
  }
}

// The 16-bit floats accumulate in fp32 and round once, as NCCL's sums do per step at best.
template <float (*to_f32)(uint16_t), uint16_t (*from_f32)(float)>
void sum_16(const std::vector<const void*>& srcs, size_t offset, size_t count, void* dst) {
  auto* d = static_cast<uint16_t*>(dst);
  for (size_t i = 0; i < count; ++i) {
    float acc = 0.0f;
    for (const void* s : srcs) acc += to_f32(static_cast<const uint16_t*>(s)[offset + i]);
    d[i] = from_f32(acc);
  }
}

void sum_into(DType dtype, const std::vector<const void*>& srcs, size_t offset, size_t count, void* dst) {
  switch (dtype) {
    case DType::kF32:
      return sum_native<float, float>(srcs, offset, count, dst);
    case DType::kF64:
      return sum_native<double, double>(srcs, offset, count, dst);
    case DType::kBF16:
      return sum_16<bf16_to_f32, round_to_bf16>(srcs, offset, count, dst);
    case DType::kF16:
      return sum_16<f16_to_f32, round_to_f16>(srcs, offset, count, dst);
    case DType::kI8:
      return sum_native<int8_t, int64_t>(srcs, offset, count, dst);
    case DType::kU8:
      return sum_native<uint8_t, uint64_t>(srcs, offset, count, dst);
    case DType::kI32:
      return sum_native<int32_t, int64_t>(srcs, offset, count, dst);
    case DType::kU32:
      return sum_native<uint32_t, uint64_t>(srcs, offset, count, dst);
    case DType::kI64:
      return sum_native<int64_t, uint64_t>(srcs, offset, count, dst);  // wraps without overflowing
    case DType::kU64:
      return sum_native<uint64_t, uint64_t>(srcs, offset, count, dst);
    default:
      fail("comm: sum of {} is not supported", dtype_name(dtype));
  }
}

// Publishes this rank's arguments and waits for every rank. When the ranks did not all call the same
// collective with the same count, dtype and root (a rank out of step, a count computed differently), every
// rank throws the same Error instead of reading past another's buffer.
void meet(LocalCommGroup& group, int rank, const LocalCommGroup::Slot& mine) {
  group.slot(rank) = mine;
  group.arrive_and_wait();
  const std::string problem = group.disagreement();
  if (!problem.empty()) {
    group.arrive_and_wait(false);  // every rank has read every slot before any may publish its next call
    fail("{}", problem);
  }
}

// The rendezvous of a call after meet(): `count` of them, committed (not released by an abort). A rank that
// throws on the way still arrives at the ones it has left, so that the others neither wait forever nor
// read its buffers after it has unwound.
class Committed {
 public:
  Committed(LocalCommGroup& group, int count) : group_(group), left_(count) {}
  void wait() {
    --left_;
    group_.arrive_and_wait(false);
  }
  ~Committed() {
    while (left_ > 0) wait();
  }
  Committed(const Committed&) = delete;
  Committed& operator=(const Committed&) = delete;

 private:
  LocalCommGroup& group_;
  int left_;
};

}  // namespace

std::vector<std::unique_ptr<LocalComm>> LocalComm::create_group(int size) {
  KIMIRT_CHECK(size >= 1, "comm: group size must be >= 1, got {}", size);
  auto group = std::make_shared<LocalCommGroup>(size);
  std::vector<std::unique_ptr<LocalComm>> comms;
  for (int r = 0; r < size; ++r) comms.push_back(std::make_unique<LocalComm>(group, r));
  return comms;
}

LocalComm::LocalComm(std::shared_ptr<LocalCommGroup> group, int rank) : group_(std::move(group)), rank_(rank) {
  KIMIRT_CHECK(rank >= 0 && rank < group_->size(), "comm: rank {} outside a group of {}", rank, group_->size());
}

LocalComm::~LocalComm() = default;

int LocalComm::size() const { return group_->size(); }

// Through meet(), as every call: a rank in barrier() while another is in a collective is the same "out of
// step" error on both, not a match against a stale slot.
void LocalComm::barrier() {
  meet(*group_, rank_, {.op = LocalCommGroup::Op::kBarrier});
  Committed(*group_, 1).wait();
}

void LocalComm::all_reduce_sum(void* buf, size_t count, DType dtype, void*) {
  ++num_all_reduces_;
  const size_t bytes = comm_bytes(count, dtype);
  std::vector<uint8_t> result(bytes);
  meet(*group_, rank_, {.op = LocalCommGroup::Op::kAllReduce, .send = buf, .count = count, .dtype = dtype});
  Committed done(*group_, 2);
  std::vector<const void*> srcs;
  for (int r = 0; r < size(); ++r) srcs.push_back(group_->slot(r).send);
  sum_into(dtype, srcs, 0, count, result.data());
  done.wait();  // everyone has read every buffer: now each may overwrite its own
  if (bytes) std::memcpy(buf, result.data(), bytes);
  done.wait();
}

void LocalComm::all_gather(const void* send, void* recv, size_t count, DType dtype, void*) {
  const size_t bytes = comm_bytes(count, dtype);
  meet(*group_, rank_, {.op = LocalCommGroup::Op::kAllGather, .send = send, .count = count, .dtype = dtype});
  Committed done(*group_, 1);
  for (int r = 0; r < size(); ++r) {
    if (bytes) std::memmove(static_cast<uint8_t*>(recv) + static_cast<size_t>(r) * bytes, group_->slot(r).send, bytes);
  }
  done.wait();
}

void LocalComm::reduce_scatter_sum(const void* send, void* recv, size_t count, DType dtype, void*) {
  std::vector<uint8_t> result(comm_bytes(count, dtype));
  meet(*group_, rank_, {.op = LocalCommGroup::Op::kReduceScatter, .send = send, .count = count, .dtype = dtype});
  Committed done(*group_, 2);
  std::vector<const void*> srcs;
  for (int r = 0; r < size(); ++r) srcs.push_back(group_->slot(r).send);
  sum_into(dtype, srcs, static_cast<size_t>(rank_) * count, count, result.data());
  done.wait();
  if (!result.empty()) std::memcpy(recv, result.data(), result.size());
  done.wait();
}

void LocalComm::all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                             std::span<const size_t> recv_counts, DType dtype, void*) {
  const auto n = static_cast<size_t>(size());
  meet(*group_, rank_,
       {.op = LocalCommGroup::Op::kAllToAllV,
        .send = send,
        .dtype = dtype,
        .counts = send_counts,
        .recv_counts = recv_counts});
  Committed done(*group_, 1);
  size_t recv_offset = 0;
  for (size_t r = 0; r < n; ++r) {
    const auto& peer = group_->slot(static_cast<int>(r));
    size_t send_offset = 0;
    for (int d = 0; d < rank_; ++d) send_offset += peer.counts[static_cast<size_t>(d)];
    const size_t count = peer.counts[static_cast<size_t>(rank_)];
    const size_t bytes = comm_bytes(count, dtype);
    if (bytes) {
      std::memcpy(static_cast<uint8_t*>(recv) + comm_bytes(recv_offset, dtype),
                  static_cast<const uint8_t*>(peer.send) + comm_bytes(send_offset, dtype), bytes);
    }
    recv_offset += count;
  }
  done.wait();
}

void LocalComm::broadcast(void* buf, size_t count, DType dtype, int root, void*) {
  meet(*group_, rank_,
       {.op = LocalCommGroup::Op::kBroadcast, .send = buf, .count = count, .dtype = dtype, .root = root});
  Committed done(*group_, 1);
  if (rank_ != root && count) std::memcpy(buf, group_->slot(root).send, comm_bytes(count, dtype));
  done.wait();
}

void LocalComm::abort(const std::string& reason) { group_->abort(reason); }

size_t LocalComm::live_subgroups() const { return group_->live_subgroups(); }

std::unique_ptr<Comm> LocalComm::split(int color, int key) {
  meet(*group_, rank_, {.op = LocalCommGroup::Op::kSplit, .color = color, .key = key});
  Committed done(*group_, 1);
  // Numbered once every rank is in the split: a refused one (a rank out of step) numbers none, so the
  // ranks' numbers stay equal.
  const uint64_t split_id = group_->next_split_id(rank_);
  std::vector<std::pair<int, int>> members;  // (key, rank) of my color
  for (int r = 0; r < size(); ++r) {
    if (group_->slot(r).color == color) members.emplace_back(group_->slot(r).key, r);
  }
  std::sort(members.begin(), members.end());
  const int new_rank = static_cast<int>(
      std::find_if(members.begin(), members.end(), [&](const auto& m) { return m.second == rank_; }) - members.begin());
  auto sub = group_->subgroup(split_id, color, static_cast<int>(members.size()));
  done.wait();
  return std::make_unique<LocalComm>(std::move(sub), new_rank);
}

}  // namespace kimirt
