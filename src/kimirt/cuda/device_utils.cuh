// Device-side helpers shared by the kernels: packed bf16 loads/stores, warp and block reductions, the
// bf16 tensor-core MMA, cp.async. Included by .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace kimirt::cuda::detail {

using bf16 = __nv_bfloat16;

// 8 bf16 (16 bytes) <-> 8 floats. bf16 -> fp32 puts the bf16 bits in the top half of a float: one shift or
// mask per value (the bf162 intrinsic compiled to a byte permute and a shift for every high half).
__device__ __forceinline__ void unpack8(const uint4& u, float (&f)[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

// Two floats -> bf16x2 (lo in the low half), rounded to nearest even: one packed F2FP. In PTX because the
// compiler, seeing __floats2bfloat162_rn's halves unpacked again, emitted one F2F per value instead, on the
// conversion unit, a quarter of the ALU's rate: rms_norm_fp8 was issue-bound on them (PERF.md, 2026-11-30,
// machine CK).
__device__ __forceinline__ uint32_t cvt_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// a · b per bf16 half, correctly rounded (one HMUL2).
__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

__device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
  return uint4{cvt_bf16x2(f[0], f[1]), cvt_bf16x2(f[2], f[3]), cvt_bf16x2(f[4], f[5]), cvt_bf16x2(f[6], f[7])};
}

// An RMSNorm's output for 8 values: bf16(bf16(v · rs) · w) (w: 8 packed bf16 weights), the reference's two
// roundings, on bf16 pairs. The product of two bf16 values is exact in fp32 (short of overflow, and of products
// below 2^-134, which round alike either way), so the fp32 multiply and a rounding give what one correctly
// rounded bf16 multiply gives: per pair one packed conversion and one HMUL2, where the fp32 form took two
// unpacks of w, two multiplies and two roundings more.
__device__ __forceinline__ uint4 normalize8(const float (&v)[8], float rs, const uint4& w) {
  const uint32_t wp[4] = {w.x, w.y, w.z, w.w};
  uint32_t y[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) y[i] = mul_bf16x2(cvt_bf16x2(v[2 * i] * rs, v[2 * i + 1] * rs), wp[i]);
  return uint4{y[0], y[1], y[2], y[3]};
}

__device__ __forceinline__ uint4 load16(const void* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ void store16(void* p, const uint4& v) { *reinterpret_cast<uint4*>(p) = v; }
// Read-only path (L1-cached).
__device__ __forceinline__ uint4 ldg16(const void* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
// Streaming load for data read once (weights): evict-first, so activations stay cached.
__device__ __forceinline__ uint4 ldcs16(const void* p) { return __ldcs(reinterpret_cast<const uint4*>(p)); }

// Order-preserving map of floats to unsigned keys (larger float, larger key), for radix selection and for
// packing a value with its index into one comparable integer. NaN maps to 0, below every number. -0 and +0
// are one value (one key): a threshold at 0 keeps both, as every comparison of the values does.
__device__ __forceinline__ uint32_t order_key(float f) {
  if (isnan(f)) return 0u;
  const uint32_t u = f == 0.0f ? 0u : __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `scratch` holds 32 floats; the call synchronizes the block twice, so it may be reused right after.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = lane < warps ? scratch[lane] : 0.0f;
  total = warp_sum(total);
  __syncthreads();
  return total;
}

// 2^x on the special-function unit, flushing denormal results (softmax weights need no more; 2^-inf = 0).
// exp2f would wrap each one in a range check and two predicated multiplies: three more dependent
// instructions per weight on the softmax's critical path.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// σ(x) written as the CPU reference writes it (exp of a non-positive argument only), in fp32.
__device__ __forceinline__ float sigmoid(float x) {
  if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
  const float e = expf(x);
  return e / (1.0f + e);
}

// σ(x) with the fast exp and reciprocal (~1e-6 relative): for the bandwidth-bound elementwise kernels,
// whose bf16 outputs round far coarser. The argument is clamped so the reciprocal never sees infinity, by a
// comparison that lets NaN through (fmaxf would turn NaN into -80, hiding an upstream NaN as σ ≈ 0).
__device__ __forceinline__ float sigmoid_fast(float x) {
  return __fdividef(1.0f, 1.0f + __expf(-(x < -80.0f ? -80.0f : x)));
}

// tanh on the special-function unit (one instruction; relative error about 2^-11).
__device__ __forceinline__ float tanh_fast(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Tensor-core D = A·B + D, m16n8k16, bf16 inputs, fp32 accumulators (row.col fragments as in the PTX
// ISA: a = 4 regs of bf16x2, b = 2 regs, c = 4 floats).
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) { return cvt_bf16x2(lo, hi); }

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The dynamic shared memory from its first 1024-byte boundary (what the 128-byte swizzle of the tensor copies and the
// wgmma descriptors assume); kernels ask for 1 KB more than they use. The offset is added to the shared array itself:
// through an integer (the generic address rounded up) the compiler lost the pointer's address space, and every shared-
// memory access of the MLA decode kernel kSeesaw became a generic LD/ST (longer latency than LDS/STS; its publication
// reads were among the top stalls).
__device__ __forceinline__ uint8_t* smem_aligned_1024(uint8_t* smem_raw) {
  return smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
}

// 16-byte asynchronous global -> shared copy; src_bytes = 0 fills the 16 bytes with zeros (rows past the
// end of a tile) without reading global memory. The memory clobbers keep the compiler from moving plain
// shared-memory reads of the same bytes across the copy or the wait.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ldmatrix: four 8x8 b16 matrices; lane l supplies the address of row (l & 7) of matrix (l >> 3). The memory
// clobber keeps the read between the barriers that order it against the writes of the same shared memory
// (volatile alone does not forbid moving it across them).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem_row))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem_row))
               : "memory");
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace kimirt::cuda::detail
