// Hopper building blocks for kernels that stream tiles through shared memory: mbarriers (the full/empty
// signalling of a producer/consumer ring, also across the blocks of a cluster), bulk tensor copies (TMA)
// that complete on an mbarrier (multicast to a cluster too) and tensor stores, named barriers for a subset
// of the block's warps, ldmatrix on raw shared addresses, and programmatic dependent launch
// (griddepcontrol). Included by .cu files only; every address is a 32-bit shared-window address.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace kimirt::cuda::detail {

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}
// After the barriers are initialized, before any other thread or the copy engine uses them.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also announces `bytes` of bulk copies completing on this barrier's current phase.
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// One plain arrival (release: this thread's earlier shared-memory reads are done before it counts).
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Blocks until the phase with the given parity has completed. SEM: the try_wait's semantics qualifiers.
#define KIMIRT_MBAR_WAIT_LOOP(SEM)                        \
  "{\n.reg .pred p;\nWAIT:\nmbarrier.try_wait.parity" SEM \
  ".shared::cta.b64 p, [%0], %1;\n"                       \
  "@p bra DONE;\nbra WAIT;\nDONE:\n}\n"
// Acquire at block scope (the default).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(KIMIRT_MBAR_WAIT_LOOP("")::"r"(bar), "r"(parity) : "memory");
}
// Acquire at cluster scope: for a barrier completed by another block's st.async (release at cluster scope),
// so that the bytes it delivered are formally visible, not only in practice.
__device__ __forceinline__ void mbar_wait_cluster(uint32_t bar, uint32_t parity) {
  asm volatile(KIMIRT_MBAR_WAIT_LOOP(".acquire.cluster")::"r"(bar), "r"(parity) : "memory");
}

// `bytes` (a multiple of 16, both addresses 16-byte aligned) of contiguous global memory into shared memory at
// dst by the bulk-copy engine, counted on `bar`.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
// Box {c0, c1} of a 2-D tensor map into shared memory at dst, counted on `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
// The same box into shared memory at dst of every block of the cluster in cta_mask, each copy counted on
// that block's barrier at the same offset `bar`.
__device__ __forceinline__ void tma_load_2d_multicast(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                                      uint32_t bar, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, "
      "%3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "h"(cta_mask)
      : "memory");
}
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
// The same with an L2 cache policy (from l2_evict_first_policy) for the bytes read.
__device__ __forceinline__ void tma_load_3d_hint(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2,
                                                 uint32_t bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3, "
      "%4}], [%5], %6;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "l"(policy)
      : "memory");
}
// An L2 policy under which the lines a copy brings in are the first to be evicted: for data read once per step
// (the attention's cache), so that it does not push out what the step reads again (block tables, activations).
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}

// Box {c0, c1} of a 2-D tensor map from shared memory at src into global memory (elements outside the
// tensor are not written), as one bulk async-group of this thread once committed.
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, uint32_t src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(src)
               : "memory");
}
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Until at most N of this thread's committed bulk groups still read their shared-memory source.
template <int N>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// Until at most N of this thread's committed bulk groups are incomplete (their writes done).
template <int N>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// Barrier `id` (1..15; 0 is __syncthreads) among `threads` threads, whole warps.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Arrival on barrier `id` without waiting (a producer's signal to threads that named_barrier_sync on it;
// `threads` counts both sides). Orders this thread's earlier shared-memory writes before their reads.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ldmatrix from a shared-window address (lane l gives row l & 7 of matrix l >> 3). The memory clobber keeps
// the read after the mbarrier wait that made the tile visible.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// Distributed shared memory within a cluster. cluster_map: the address of the same shared variable in
// block `rank`. st_async_cluster: 4 bytes into another block's shared memory, completed on that block's
// mbarrier (as bulk copies complete theirs), so the receiver learns of them without a cluster barrier (whose
// release fence waits for every memory operation the block has outstanding).
__device__ __forceinline__ uint32_t cluster_map(uint32_t smem_addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(smem_addr), "r"(rank));
  return r;
}
__device__ __forceinline__ void st_async_cluster(uint32_t remote_addr, uint32_t value, uint32_t remote_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(remote_addr),
               "r"(value), "r"(remote_bar)
               : "memory");
}
// One arrival on another block's mbarrier (remote_bar from cluster_map), with the default release at CTA
// scope: enough for a consumer that announces it has finished reading its own shared memory (what the peer
// then overwrites by multicast). Release at cluster scope made every arrival a cluster-wide fence (the FP8
// GEMM ran at half speed).
__device__ __forceinline__ void mbar_arrive_remote(uint32_t remote_bar) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote_bar) : "memory");
}
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// The two halves of a cluster barrier, for every thread of the block: arrive without ordering memory (after
// mbar_init_fence, what the other blocks need is the barriers' initialization), wait with acquire.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
// Arrive with release: this thread's earlier memory operations (remote arrivals included) are performed
// before any block of the cluster passes the matching wait.
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory"); }

// Programmatic dependent launch. A kernel launched with the programmatic-serialization attribute may start
// while its predecessor still runs once every block of the predecessor has called launch_dependents (or
// exited); it must call wait before it reads anything the predecessor wrote. Both are no-ops otherwise.
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

}  // namespace kimirt::cuda::detail
