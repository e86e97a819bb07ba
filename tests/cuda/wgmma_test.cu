// The wgmma building blocks of the MLA decode kernel (wgmma.cuh) against fp64 products, one instruction
// shape at a time: the K-major score product (both operands from 128-byte-swizzled shared memory) and the
// P·V product (A from registers in the accumulator layout, B MN-major). A wrong descriptor field or
// fragment mapping shows up here as an O(1) error, before it is buried in the attention kernel.
#include <gtest/gtest.h>

#include "kimirt/cuda/device_utils.cuh"
#include "kimirt/cuda/wgmma.cuh"
#include "test_util.h"

namespace kimirt::cuda {
namespace {

using detail::bf16;

__device__ uint32_t swz(int r, int c16, int atom_bytes) {
  return static_cast<uint32_t>((c16 >> 3) * atom_bytes + r * 128 + (((c16 & 7) ^ (r & 7)) << 4));
}

// D[64 x 48] = A[64 x 64] · B[48 x 64]ᵀ: 4 k16 steps inside one atom, as the MLA score product walks it.
__global__ void scores_kernel(const bf16* a, const bf16* b, float* d) {
  __shared__ __align__(1024) uint8_t sa[64 * 128];
  __shared__ __align__(1024) uint8_t sb[48 * 128];
  const int t = threadIdx.x;
  for (int i = t; i < 64 * 8; i += 128) {
    const int r = i / 8, c = i % 8;
    *reinterpret_cast<uint4*>(sa + swz(r, c, 64 * 128)) = *reinterpret_cast<const uint4*>(a + r * 64 + c * 8);
  }
  for (int i = t; i < 48 * 8; i += 128) {
    const int r = i / 8, c = i % 8;
    *reinterpret_cast<uint4*>(sb + swz(r, c, 48 * 128)) = *reinterpret_cast<const uint4*>(b + r * 64 + c * 8);
  }
  detail::fence_proxy_async();
  __syncthreads();
  float acc[24];
  detail::wgmma_fence();
  for (int s = 0; s < 4; ++s) {
    const uint64_t da = detail::wgmma_desc_sw128(detail::smem_addr(sa) + 32 * s, 16, 1024);
    const uint64_t db = detail::wgmma_desc_sw128(detail::smem_addr(sb) + 32 * s, 16, 1024);
    detail::wgmma_m64n48k16_ss(acc, da, db, s > 0 ? 1 : 0);
  }
  detail::wgmma_commit();
  detail::wgmma_wait<0>();
  detail::fence_regs(acc);
  const int warp = t >> 5, lane = t & 31;
  for (int i = 0; i < 24; ++i) {
    const int row = 16 * warp + (lane >> 2) + 8 * ((i >> 1) & 1);
    const int col = 8 * (i >> 2) + 2 * (lane & 3) + (i & 1);
    d[row * 48 + col] = acc[i];
  }
}

// D[64 x 256] = P[64 x 48] · V[48 x 256]: P enters as registers in the accumulator layout (bf16 pairs), V is
// [48 rows x 256] stored as 4 atoms of [48 x 64] (MN-major). lbo/sbo come from the test.
__global__ void pv_kernel(const float* p, const bf16* v, float* d, uint32_t lbo, uint32_t sbo) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* sv = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const int t = threadIdx.x;
  for (int i = t; i < 48 * 32; i += 128) {
    const int r = i / 32, c = i % 32;
    *reinterpret_cast<uint4*>(sv + swz(r, c, 48 * 128)) = *reinterpret_cast<const uint4*>(v + r * 256 + c * 8);
  }
  detail::fence_proxy_async();
  __syncthreads();
  const int warp = t >> 5, lane = t & 31;
  float s[24];
  for (int i = 0; i < 24; ++i) {
    const int row = 16 * warp + (lane >> 2) + 8 * ((i >> 1) & 1);
    const int col = 8 * (i >> 2) + 2 * (lane & 3) + (i & 1);
    s[i] = p[row * 48 + col];
  }
  float acc[128];
  for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
  detail::wgmma_fence();
#pragma unroll
  for (int j = 0; j < 3; ++j) {
    const uint32_t a0 = detail::pack_bf16x2(s[8 * j + 0], s[8 * j + 1]);
    const uint32_t a1 = detail::pack_bf16x2(s[8 * j + 2], s[8 * j + 3]);
    const uint32_t a2 = detail::pack_bf16x2(s[8 * j + 4], s[8 * j + 5]);
    const uint32_t a3 = detail::pack_bf16x2(s[8 * j + 6], s[8 * j + 7]);
    const uint64_t db = detail::wgmma_desc_sw128(detail::smem_addr(sv) + j * 2048, lbo, sbo);
    detail::wgmma_m64n256k16_rs_tb(acc, a0, a1, a2, a3, db);
  }
  detail::wgmma_commit();
  detail::wgmma_wait<0>();
  detail::fence_regs(acc);
  for (int i = 0; i < 128; ++i) {
    const int row = 16 * warp + (lane >> 2) + 8 * ((i >> 1) & 1);
    const int col = 8 * (i >> 2) + 2 * (lane & 3) + (i & 1);
    d[row * 256 + col] = acc[i];
  }
}

TEST(Wgmma, ScoreProductKMajorSwizzled) {
  KIMIRT_REQUIRE_GPU();
  std::vector<float> a = test::random_vec(64 * 64, 1), b = test::random_vec(48 * 64, 2);
  DeviceBuffer da = test::upload(test::to_bf16(a)), db = test::upload(test::to_bf16(b)),
               dd = test::poisoned(64 * 48 * 4);
  scores_kernel<<<1, 128>>>(da.as<bf16>(), db.as<bf16>(), dd.as<float>());
  KIMIRT_CUDA_CHECK_LAUNCH();
  const auto got = test::download<float>(dd.data(), 64 * 48);
  std::vector<float> ref(64 * 48);
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < 48; ++j) {
      double acc = 0;
      for (int k = 0; k < 64; ++k) acc += double(a[i * 64 + k]) * b[j * 64 + k];
      ref[i * 48 + j] = float(acc);
    }
  EXPECT_LE(test::rel_err(got, ref), 1e-5);
}

TEST(Wgmma, PvProductRegistersTimesMnMajor) {
  KIMIRT_REQUIRE_GPU();
  std::vector<float> p = test::random_vec(64 * 48, 3, 0.0f, 1.0f), v = test::random_vec(48 * 256, 4);
  test::to_bf16(p);  // P enters the product as bf16
  DeviceBuffer dp = test::upload(p), dv = test::upload(test::to_bf16(v)), dd = test::poisoned(64 * 256 * 4);
  std::vector<float> ref(64 * 256);
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < 256; ++j) {
      double acc = 0;
      for (int k = 0; k < 48; ++k) acc += double(p[i * 48 + k]) * v[k * 256 + j];
      ref[i * 256 + j] = float(acc);
    }
  const int smem = 48 * 128 * 4 + 1024;
  KIMIRT_CUDA_CHECK(cudaFuncSetAttribute(pv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  // The kernel's convention first (LBO = the stride between 64-wide slices of N, SBO = 8 rows of K); the
  // swapped one is reported too, so a failure says which field the hardware reads how.
  double err[2];
  const uint32_t fields[2][2] = {{48 * 128, 1024}, {1024, 48 * 128}};
  for (int f = 0; f < 2; ++f) {
    poison(dd.data(), dd.size(), nullptr);
    pv_kernel<<<1, 128, smem>>>(dp.as<float>(), dv.as<bf16>(), dd.as<float>(), fields[f][0], fields[f][1]);
    KIMIRT_CUDA_CHECK_LAUNCH();
    err[f] = test::rel_err(test::download<float>(dd.data(), 64 * 256), ref);
  }
  EXPECT_LE(err[0], 1e-5) << "swapped LBO/SBO gives " << err[1];
}

}  // namespace
}  // namespace kimirt::cuda
