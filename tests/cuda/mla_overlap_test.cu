// MlaDecodeArgs::overlap_previous (programmatic dependent launch): the decode kernels may start while the
// previous kernel runs, so they must read q only after waiting for it, and write out and the split
// workspace only after it has ended. The previous kernel here lets its dependents start at once, spins for
// about a millisecond, then writes the new q and saves what out and the workspace hold at that moment.
// A control kernel that reads q without waiting shows that the window is real (it sees the old q), so a
// decode kernel that read too early would fail the comparison; where launches are serialized (a sanitizer,
// a profiler) the control sees the new q and the test is skipped, saying so.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "kimirt/cuda/async_pipeline.cuh"
#include "kimirt/cuda/mla_decode.h"
#include "kimirt/cuda/stream.h"
#include "mla_reference.h"
#include "test_util.h"

namespace kimirt::cuda {
namespace {

using test::download;
using test::upload;

constexpr long long kSpinCycles = 2'000'000;  // ~1 ms at 1.98 GHz

__global__ void late_writer(const uint16_t* q_new, uint16_t* q, int n_q, const uint4* watch_out, uint4* saved_out,
                            int n_out, const uint4* watch_ws, uint4* saved_ws, int n_ws) {
  detail::pdl_launch_dependents();
  if (threadIdx.x == 0) {
    const long long t0 = clock64();
    while (clock64() - t0 < kSpinCycles) {
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n_q; i += blockDim.x) q[i] = q_new[i];
  for (int i = threadIdx.x; i < n_out; i += blockDim.x) saved_out[i] = watch_out[i];
  for (int i = threadIdx.x; i < n_ws; i += blockDim.x) saved_ws[i] = watch_ws[i];
}

// Reads q[0] without griddepcontrol.wait.
__global__ void early_reader(const uint16_t* q, uint16_t* seen) { *seen = *q; }

void launch_dependent_early_reader(cudaStream_t stream, const uint16_t* q, uint16_t* seen) {
  cudaLaunchConfig_t cfg{};
  cfg.stream = stream;
  cfg.gridDim = dim3(1);
  cfg.blockDim = dim3(1);
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  KIMIRT_CUDA_CHECK(cudaLaunchKernelEx(&cfg, early_reader, q, seen));
}

TEST(MlaDecodeOverlap, WaitsForThePreviousKernelBeforeReadingQAndWriting) {
  KIMIRT_REQUIRE_GPU();
  const int page = 64, heads = 12;
  // The second sequence is short: under a split plan its later chunks are empty (the early-return path).
  const std::vector<int32_t> lens = {3000, 40};
  const int batch = static_cast<int>(lens.size()), max_pages = (3000 + page - 1) / page;
  std::vector<int32_t> table(batch * max_pages);
  for (int i = 0; i < batch * max_pages; ++i) table[i] = (i * 7) % (batch * max_pages);  // 7 is prime to 94
  std::vector<float> cache = test::random_vec(size_t(batch) * max_pages * page * 576, 31, -2, 2);
  DeviceBuffer dc = upload(test::to_bf16(cache)), dt = upload(table), dl = upload(lens);
  Stream stream;
  const cudaStream_t s = stream.get();
  int serialized = 0;  // configurations whose control never overlapped: not tested
  for (int h : {heads, 96}) {
    std::vector<float> q_old = test::random_vec(batch * h * 576, 32, -0.5f, 0.5f);
    std::vector<float> q_new = test::random_vec(batch * h * 576, 33, -0.5f, 0.5f);
    const std::vector<uint16_t> old_bf16 = test::to_bf16(q_old), new_bf16 = test::to_bf16(q_new);
    ASSERT_NE(old_bf16[0], new_bf16[0]);
    const std::vector<float> ref = test::mla_decode_reference(q_new, cache, table, max_pages, lens, h, page);
    const DeviceBuffer d_new = upload(new_bf16);
    for (MlaDecodeKernel kernel : {MlaDecodeKernel::kMma16, MlaDecodeKernel::kWgmma64, MlaDecodeKernel::kSeesaw}) {
      for (int sms : {1, 132}) {  // unsplit, split with the merge kernel
        const MlaDecodePlan plan = plan_mla_decode(batch, h, 3000, sms, kernel);
        const size_t out_bytes = size_t(batch) * h * 512 * 2;
        const size_t ws_bytes = plan.workspace_bytes / 16 * 16;
        DeviceBuffer dq = upload(old_bf16), out = test::poisoned(out_bytes), ws = test::poisoned(ws_bytes + 16);
        DeviceBuffer saved_out(out_bytes), saved_ws(ws_bytes + 16), seen(16);

        // Warm-up, so that no launch below loads its module lazily (loading waits for the device: no overlap).
        launch_dependent_early_reader(s, dq.as<uint16_t>(), seen.as<uint16_t>());
        MlaDecodeArgs a;
        a.q = dq.as<__nv_bfloat16>(), a.ld_q = h * 576, a.cache = dc.as<__nv_bfloat16>(), a.page_size = page;
        a.block_table = dt.as<int32_t>(), a.ld_block_table = max_pages, a.seq_lens = dl.as<int32_t>();
        a.out = out.as<__nv_bfloat16>(), a.ld_out = h * 512, a.batch = batch, a.heads = h;
        mla_decode(s, a, plan, ws.data());
        KIMIRT_CUDA_CHECK(cudaStreamSynchronize(s));
        poison(out.data(), out.size(), s);
        poison(ws.data(), ws.size(), s);
        const std::vector<uint8_t> poison_out = download<uint8_t>(out.data(), out_bytes);
        const std::vector<uint8_t> poison_ws = download<uint8_t>(ws.data(), ws_bytes);

        // The control: a dependent that does not wait sees the old q. A few tries: one launch that happened not to
        // overlap must not leave this configuration untested.
        bool overlaps = false;
        for (int attempt = 0; attempt < 3 && !overlaps; ++attempt) {
          KIMIRT_CUDA_CHECK(cudaMemcpy(dq.data(), old_bf16.data(), old_bf16.size() * 2, cudaMemcpyHostToDevice));
          late_writer<<<1, 256, 0, s>>>(d_new.as<uint16_t>(), dq.as<uint16_t>(), batch * h * 576, out.as<uint4>(),
                                        saved_out.as<uint4>(), 0, ws.as<uint4>(), saved_ws.as<uint4>(), 0);
          launch_dependent_early_reader(s, dq.as<uint16_t>(), seen.as<uint16_t>());
          overlaps = download<uint16_t>(seen.data(), 1)[0] == old_bf16[0];
        }
        KIMIRT_CUDA_CHECK(cudaMemcpy(dq.data(), old_bf16.data(), old_bf16.size() * 2, cudaMemcpyHostToDevice));
        if (!overlaps) {
          ++serialized;
          continue;
        }

        late_writer<<<1, 256, 0, s>>>(d_new.as<uint16_t>(), dq.as<uint16_t>(), batch * h * 576, out.as<uint4>(),
                                      saved_out.as<uint4>(), static_cast<int>(out_bytes / 16), ws.as<uint4>(),
                                      saved_ws.as<uint4>(), static_cast<int>(ws_bytes / 16));
        a.overlap_previous = true;
        mla_decode(s, a, plan, ws.data());
        const std::string what = std::string(mla_decode_kernel_name(kernel)) + " heads " + std::to_string(h) +
                                 " splits " + std::to_string(plan.splits);
        // Per sequence: the short one's larger rows would hide an error in the long, split one.
        const std::vector<float> got = test::from_bf16(download<uint16_t>(out.data(), out_bytes / 2));
        const int64_t per_seq = got.size() / batch;
        for (int b = 0; b < batch; ++b) {
          const std::vector<float> g(got.begin() + b * per_seq, got.begin() + (b + 1) * per_seq),
              r(ref.begin() + b * per_seq, ref.begin() + (b + 1) * per_seq);
          EXPECT_LE(test::rel_err(g, r), 1e-2) << what << ", sequence " << b;
        }
        EXPECT_TRUE(download<uint8_t>(saved_out.data(), out_bytes) == poison_out)
            << what << ": out was written before the previous kernel ended";
        EXPECT_TRUE(download<uint8_t>(saved_ws.data(), ws_bytes) == poison_ws)
            << what << ": the split workspace was written before the previous kernel ended";
      }
    }
  }
  if (serialized > 0) {
    // Under compute-sanitizer, ncu or CUDA_LAUNCH_BLOCKING=1 kernels run one after the other: nothing to test.
    // Elsewhere on the GPU machine (KIMIRT_EXPECT_GPU) it is a failure, not a quiet skip.
    const bool expected = std::getenv("KIMIRT_EXPECT_GPU") != nullptr &&
                          std::getenv("KIMIRT_UNDER_SANITIZER") == nullptr &&
                          std::getenv("CUDA_LAUNCH_BLOCKING") == nullptr;
    const std::string why = std::to_string(serialized) +
                            " configuration(s): programmatic launches did not overlap (serialized kernels?), so "
                            "this test could not catch an early read there";
    if (expected) {
      ADD_FAILURE() << why;
    } else {
      GTEST_SKIP() << why;
    }
  }
}

}  // namespace
}  // namespace kimirt::cuda
