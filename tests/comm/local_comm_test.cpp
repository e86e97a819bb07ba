#include "kimirt/comm/local_comm.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kimirt/base/error.h"
#include "kimirt/tensor/float_convert.h"

namespace kimirt {
namespace {

// Runs fn(comm) on one thread per rank; rethrows the first failure.
void run_ranks(int size, const std::function<void(Comm&)>& fn) {
  auto comms = LocalComm::create_group(size);
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(*comms[static_cast<size_t>(r)]);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

TEST(LocalComm, AllReduceIsInPlaceAndIdenticalOnEveryRank) {
  run_ranks(4, [](Comm& c) {
    std::vector<float> v = {1.0f * static_cast<float>(c.rank()), 0.5f, -2.0f};
    c.all_reduce_sum(v.data(), v.size(), DType::kF32);
    EXPECT_EQ(v, (std::vector<float>{6.0f, 2.0f, -8.0f}));
    EXPECT_EQ(c.num_all_reduces(), 1u);
  });
}

TEST(LocalComm, GatherScatterAllToAllBroadcast) {
  run_ranks(3, [](Comm& c) {
    const int r = c.rank();
    std::vector<int32_t> send = {r, 10 * r};
    std::vector<int32_t> gathered(6);
    c.all_gather(send.data(), gathered.data(), 2, DType::kI32);
    EXPECT_EQ(gathered, (std::vector<int32_t>{0, 0, 1, 10, 2, 20}));

    // Block b of rank q holds 10·q + b: rank r's result, Σ_q (10·q + r) = 30 + 3r, needs every rank's own block r
    // (equal blocks on every rank could not tell a sum over the wrong buffers).
    std::vector<float> blocks = {10.0f * r, 10.0f * r + 1, 10.0f * r + 2};
    float mine = 0.0f;
    c.reduce_scatter_sum(blocks.data(), &mine, 1, DType::kF32);
    EXPECT_EQ(mine, 30.0f + 3.0f * static_cast<float>(r));

    // Rank r sends r+1 copies of its id to every rank.
    const size_t n = static_cast<size_t>(r + 1);
    std::vector<int64_t> out(3 * n, r);
    std::vector<size_t> send_counts(3, n), recv_counts = {1, 2, 3};
    std::vector<int64_t> in(6, -1);
    c.all_to_all_v(out.data(), send_counts, in.data(), recv_counts, DType::kI64);
    EXPECT_EQ(in, (std::vector<int64_t>{0, 1, 1, 2, 2, 2}));

    int64_t value = r == 2 ? 77 : 0;
    c.broadcast(&value, 1, DType::kI64, 2);
    EXPECT_EQ(value, 77);
  });
}

// Every type NCCL sums: the 16-bit floats in fp32 (these sums are exact), the integers wrapping as theirs do.
TEST(LocalComm, SumsEveryTypeNcclSums) {
  run_ranks(3, [](Comm& c) {
    const int r = c.rank();
    for (const DType half : {DType::kBF16, DType::kF16}) {
      const auto to16 = [&](float x) { return half == DType::kBF16 ? f32_to_bf16(x) : f32_to_f16(x); };
      std::vector<uint16_t> h = {to16(1.5f + static_cast<float>(r)), to16(-0.25f)};
      c.all_reduce_sum(h.data(), h.size(), half);
      EXPECT_EQ(h, (std::vector<uint16_t>{to16(7.5f), to16(-0.75f)})) << dtype_name(half);
    }
    uint8_t u8 = static_cast<uint8_t>(200 + r);  // 603 = 91 mod 256
    c.all_reduce_sum(&u8, 1, DType::kU8);
    EXPECT_EQ(u8, 91);
    int8_t i8 = static_cast<int8_t>(-100 - r);  // -303 = -47 mod 256
    c.all_reduce_sum(&i8, 1, DType::kI8);
    EXPECT_EQ(i8, -47);
    uint32_t u32 = 0x80000000u + static_cast<uint32_t>(r);  // 3·2^31 + 3 = 2^31 + 3 mod 2^32
    c.all_reduce_sum(&u32, 1, DType::kU32);
    EXPECT_EQ(u32, 0x80000003u);
    uint64_t u64 = (uint64_t{1} << 63) + static_cast<uint64_t>(r);
    c.all_reduce_sum(&u64, 1, DType::kU64);
    EXPECT_EQ(u64, (uint64_t{1} << 63) + 3);
    int64_t i64 = int64_t{1} << 62;  // 3·2^62 = -2^62 mod 2^64
    c.all_reduce_sum(&i64, 1, DType::kI64);
    EXPECT_EQ(i64, -(int64_t{1} << 62));
  });
}

// In place, as NCCL allows: the all-gather's send is this rank's block of recv, the reduce-scatter's recv this
// rank's block of send.
TEST(LocalComm, GatherAndReduceScatterInPlace) {
  run_ranks(3, [](Comm& c) {
    const int r = c.rank();
    std::vector<int32_t> all(6, -1);
    all[static_cast<size_t>(2 * r)] = r;
    all[static_cast<size_t>(2 * r + 1)] = 10 * r;
    c.all_gather(all.data() + 2 * r, all.data(), 2, DType::kI32);
    EXPECT_EQ(all, (std::vector<int32_t>{0, 0, 1, 10, 2, 20}));
    std::vector<float> blocks = {10.0f * r, 10.0f * r + 1, 10.0f * r + 2};
    c.reduce_scatter_sum(blocks.data(), blocks.data() + r, 1, DType::kF32);
    EXPECT_EQ(blocks[static_cast<size_t>(r)], 30.0f + 3.0f * static_cast<float>(r));
  });
}

TEST(LocalComm, SplitMakesIndependentSubgroups) {
  run_ranks(4, [](Comm& c) {
    auto sub = c.split(c.rank() % 2, c.rank());
    EXPECT_EQ(sub->size(), 2);
    EXPECT_EQ(sub->rank(), c.rank() / 2);
    float v = static_cast<float>(c.rank());
    sub->all_reduce_sum(&v, 1, DType::kF32);
    EXPECT_EQ(v, c.rank() % 2 == 0 ? 2.0f : 4.0f);  // {0,2} and {1,3}
  });
}

// Every rank's error message, "(no error)" for a rank that returned normally. A deadlock fails by timeout.
std::vector<std::string> errors_of(int size, const std::function<void(Comm&)>& fn) {
  std::vector<std::string> errors(static_cast<size_t>(size), "(no error)");
  run_ranks(size, [&](Comm& c) {
    try {
      fn(c);
    } catch (const Error& e) {
      errors[static_cast<size_t>(c.rank())] = e.what();
    }
  });
  return errors;
}

// A rank out of step (another count, dtype, root or collective) must not make the others read past its
// buffers: every rank throws the same Error, and the group stays usable for a call that agrees.
TEST(LocalComm, RanksThatDisagreeAllThrowTheSameError) {
  auto expect_all = [](const std::vector<std::string>& errors, const std::string& what) {
    for (const auto& e : errors) EXPECT_NE(e.find(what), std::string::npos) << e;
    for (const auto& e : errors) EXPECT_EQ(e, errors[0]);
  };
  expect_all(errors_of(3,
                       [](Comm& c) {
                         std::vector<float> v(8, 1.0f);
                         c.all_reduce_sum(v.data(), c.rank() == 2 ? 8 : 4, DType::kF32);
                       }),
             "all_reduce_sum: rank 2 passed a count of 8, rank 0 4");
  expect_all(errors_of(2,
                       [](Comm& c) {
                         std::vector<float> send(4, 1.0f), recv(64);
                         c.all_gather(send.data(), recv.data(), 4, c.rank() == 1 ? DType::kF64 : DType::kF32);
                       }),
             "all_gather: rank 1 passed F64 elements, rank 0 F32");
  expect_all(errors_of(3,
                       [](Comm& c) {
                         int64_t v = 0;
                         c.broadcast(&v, 1, DType::kI64, c.rank() == 1 ? 1 : 0);
                       }),
             "broadcast: rank 1 passed root 1, rank 0 root 0");
  expect_all(errors_of(2,
                       [](Comm& c) {
                         std::vector<float> v(4, 1.0f), out(4);
                         if (c.rank() == 0) {
                           c.all_reduce_sum(v.data(), 4, DType::kF32);
                         } else {
                           c.reduce_scatter_sum(v.data(), out.data(), 2, DType::kF32);
                         }
                       }),
             "rank 1 is in reduce_scatter_sum while rank 0 is in all_reduce_sum");
  expect_all(errors_of(2,
                       [](Comm& c) {
                         int64_t v = 0;
                         c.broadcast(&v, 1, DType::kI64, 5);
                       }),
             "broadcast root 5 outside a group of 2");
  // A negative split color, on one rank only: every rank is refused together (MPI and NCCL refuse it too).
  expect_all(errors_of(3, [](Comm& c) { c.split(c.rank() == 1 ? -1 : 0, c.rank()); }),
             "split: rank 1 passed color -1, which must not be negative");
  // After a refused call every rank is at the same point: the next collective works.
  const auto after = errors_of(2, [](Comm& c) {
    float v = 1.0f;
    try {
      c.all_reduce_sum(&v, c.rank() == 0 ? 1 : 0, DType::kF32);
    } catch (const Error&) {
    }
    c.all_reduce_sum(&v, 1, DType::kF32);
    EXPECT_EQ(v, 2.0f);
  });
  expect_all(after, "(no error)");
  // A barrier while another rank is in a collective: out of step on both (the barrier published nothing, so
  // the collective matched a stale slot and read a buffer since freed).
  expect_all(errors_of(2,
                       [](Comm& c) {
                         std::vector<float> warm(4, 1.0f);
                         c.all_reduce_sum(warm.data(), 4, DType::kF32);  // leaves a slot behind
                         std::vector<float> v(4, 1.0f);
                         if (c.rank() == 0) {
                           c.barrier();
                         } else {
                           c.all_reduce_sum(v.data(), 4, DType::kF32);
                         }
                       }),
             "rank 1 is in all_reduce_sum while rank 0 is in barrier");
  // A refused split numbers nothing: the next split pairs the ranks again (their split numbers used to part,
  // and the first collective of the new subgroups never ended).
  const auto resplit = errors_of(2, [](Comm& c) {
    float v = 1.0f;
    try {
      if (c.rank() == 0) {
        (void)c.split(0, c.rank());
      } else {
        c.all_reduce_sum(&v, 1, DType::kF32);
      }
    } catch (const Error&) {
    }
    auto sub = c.split(0, c.rank());
    EXPECT_EQ(sub->size(), 2);
    float w = 1.0f;
    sub->all_reduce_sum(&w, 1, DType::kF32);
    EXPECT_EQ(w, 2.0f);
  });
  expect_all(resplit, "(no error)");
}

TEST(LocalComm, AllToAllCountsAreCheckedOnEveryRank) {
  // Rank 0 expects 2 elements from rank 1, which sends it 1: both ranks throw (the receiver alone throwing
  // would leave the sender waiting).
  const auto errors = errors_of(2, [](Comm& c) {
    std::vector<float> buf(4, 0.0f), in(4);
    std::vector<size_t> send = {1, 1};
    std::vector<size_t> recv = c.rank() == 0 ? std::vector<size_t>{1, 2} : std::vector<size_t>{1, 1};
    c.all_to_all_v(buf.data(), send, in.data(), recv, DType::kF32);
  });
  for (const auto& e : errors)
    EXPECT_NE(e.find("rank 1 sends 1 elements to rank 0, which expects 2"), std::string::npos) << e;
  const auto sizes = errors_of(2, [](Comm& c) {
    std::vector<float> buf(4, 0.0f), in(4);
    std::vector<size_t> send(c.rank() == 1 ? 3 : 2, 1), recv = {1, 1};
    c.all_to_all_v(buf.data(), send, in.data(), recv, DType::kF32);
  });
  for (const auto& e : sizes) EXPECT_NE(e.find("rank 1 passed 3 send and 2 recv counts"), std::string::npos) << e;
}

// The group keeps no subgroup alive: a split's group goes away with its members' communicators.
TEST(LocalComm, SubgroupsLiveOnlyAsLongAsTheirMembersUseThem) {
  auto comms = LocalComm::create_group(2);
  std::vector<std::thread> threads;
  std::vector<std::unique_ptr<Comm>> kept(2);
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      Comm& c = *comms[static_cast<size_t>(r)];
      for (int i = 0; i < 50; ++i) {
        auto sub = c.split(c.rank(), 0);  // dropped at once
        float v = 1.0f;
        sub->all_reduce_sum(&v, 1, DType::kF32);
      }
      kept[static_cast<size_t>(r)] = c.split(0, c.rank());  // one group of both, kept
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(comms[0]->live_subgroups(), 1u);
  kept[0].reset();
  EXPECT_EQ(comms[0]->live_subgroups(), 1u);  // rank 1 still holds it
  kept[1].reset();
  EXPECT_EQ(comms[1]->live_subgroups(), 0u);
}

TEST(LocalComm, MismatchedAllToAllCountsAreAnError) {
  EXPECT_THROW(run_ranks(2,
                         [](Comm& c) {
                           std::vector<float> buf(4, 0.0f), in(4);
                           std::vector<size_t> send = {1, 1};
                           std::vector<size_t> recv = {2, 2};  // expects more than is sent
                           c.all_to_all_v(buf.data(), send, in.data(), recv, DType::kF32);
                         }),
               Error);
}

// A failed rank aborts the group: ranks waiting in the group or in a group split from it are released with
// an Error carrying the reason, and later collectives fail the same way instead of blocking.
TEST(LocalComm, AbortReleasesRanksWaitingInTheGroupAndItsSubgroups) {
  auto comms = LocalComm::create_group(3);
  std::vector<std::string> errors(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      LocalComm& c = *comms[static_cast<size_t>(r)];
      try {
        auto sub = c.split(r % 2, r);  // {0, 2} and {1}
        if (r == 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let the others block first
          c.abort("rank 0 gave up");
        } else if (r == 2) {
          float v = 1.0f;
          sub->all_reduce_sum(&v, 1, DType::kF32);  // rank 0 never joins
        }
        c.barrier();
      } catch (const Error& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) EXPECT_NE(e.find("aborted: rank 0 gave up"), std::string::npos) << e;
}

}  // namespace
}  // namespace kimirt
