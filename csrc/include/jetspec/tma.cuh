// Thin wrappers over the sm_90 asynchronous-copy PTX used by the Hopper attention family
// (attention_hopper.cuh): shared-memory mbarriers (init, arrive, arrive with an expected transaction count, parity
// wait), TMA tensor loads (cp.async.bulk.tensor, 4-d tiles, completing on an mbarrier), named
// barriers, and the host-side tensor-map encoding (cuTensorMapEncodeTiled, reached through the
// runtime's driver entry point so that _C needs no link against libcuda).
//
// mbarrier phases: a barrier initialised with count c completes its current phase when c arrivals
// have happened and every expected transaction byte has landed; mbar_wait(bar, parity) returns
// once the phase of that parity has completed (the current phase has parity 0 after init, so a
// wait with parity 1 returns at once: the convention for "buffer initially free").
#pragma once
#include "jetspec/mma.cuh"

#ifdef JETSPEC_CPU_SIM
#include "tma_sim.h"  // tests/cuda_sim: mbarriers and TMA copies emulated for the fibers
#else
#include <cudaTypedefs.h>  // CUtensorMap, PFN_cuTensorMapEncodeTiled_v12000

namespace jetspec {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count)
               : "memory");
}
// Makes this thread's mbarrier inits visible to the async proxy (TMA completions); a
// __syncthreads after it publishes them to the other threads.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(
                   smem_u32(bar))
               : "memory");
}
// One arrival that also raises the phase's expected transaction count by `bytes`.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, unsigned bytes) {
  asm volatile(
      "{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(
          smem_u32(bar)),
      "r"(bytes)
      : "memory");
}
// A wait that has not completed after this long faults: a pipeline deadlock (a byte count or
// parity bug) then fails the launch with an error (an illegal address: a store to address 0,
// which compute-sanitizer names) instead of hanging the GPU. Not __trap(): a trap reachable from
// a warpgroup's code makes ptxas ignore that warpgroup's setmaxnreg, and the consumers of a
// two-warpgroup kernel then spill at the 168 registers of 384 threads (checked with ptxas 13.0).
// Legitimate waits are microseconds, milliseconds under compute-sanitizer.
constexpr unsigned long long kMbarTimeoutNs = 4000000000ull;

__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
  uint32_t done = 0;
  unsigned long long start = 0;
  for (uint32_t tries = 0;; ++tries) {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
    if (done) return;
    if ((tries & 1023u) == 0) {
      unsigned long long now;
      asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(now));
      if (tries == 0) {
        start = now;
      } else if (now - start > kMbarTimeoutNs) {
        asm volatile("st.global.u32 [%0], 0;\n" ::"l"(0ull) : "memory");
      }
    }
  }
}

// Copies the box of `map` at coordinates (c0 innermost .. c3) into shared memory at dst (laid out
// as the map's swizzle says); its bytes count towards bar's current phase.
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, int c0, int c1,
                                            int c2, int c3, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
      "r"(smem_u32(bar))
      : "memory");
}

// Warp specialisation's register split (setmaxnreg): the calling warpgroup's per-thread register
// limit drops to (dealloc) or rises to (alloc) N, a multiple of 8 in 24..256. Every thread of the
// warpgroup must execute it; alloc waits until the registers are free.
template <int N>
__device__ __forceinline__ void warpgroup_reg_dealloc() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: a multiple of 8 in 24..256");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void warpgroup_reg_alloc() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: a multiple of 8 in 24..256");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// bar.sync on named barrier `id` (1..15; 0 is __syncthreads) for `count` threads (whole warps).
__device__ __forceinline__ void named_barrier_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace jetspec
#endif  // JETSPEC_CPU_SIM

namespace jetspec {

// cuTensorMapEncodeTiled, looked up once. A namespace-scope variable, not a function-local
// static: the simulator build poisons those in namespace jetspec as if they were __shared__.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder = nullptr;

// A 4-d tensor map of 16-bit elements with 128-byte swizzled boxes: dims innermost first,
// strides (bytes) of dims 1..3, box extents; `name` is the tensor's, for messages. Unsupported
// when the runtime has no cuTensorMapEncodeTiled; bad input when the driver refuses the layout.
inline Status encode_tensor_map_4d(CUtensorMap* map, const char* name, const void* base,
                                   const uint64_t (&dims)[4], const uint64_t (&strides)[3],
                                   const uint32_t (&box)[4]) {
  PFN_cuTensorMapEncodeTiled_v12000& encode = tensor_map_encoder;
  if (encode == nullptr) {
    cudaDriverEntryPointQueryResult found{};
    void* fn = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess || fn == nullptr) {
      (void)cudaGetLastError();
      return unsupported("the CUDA driver offers no cuTensorMapEncodeTiled (TMA; kernel 4, hopper)");
    }
    encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUresult res = encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, const_cast<void*>(base), dims,
                              strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (res == CUDA_SUCCESS) return Status();
  return bad_input("cuTensorMapEncodeTiled refused ", name, " (CUresult ", static_cast<int>(res),
                   "; byte strides ", strides[0], ", ", strides[1], ", ", strides[2],
                   "): TMA needs a 16-byte aligned base and strides that are multiples of 16 "
                   "bytes (kernel 4, hopper)");
}

}  // namespace jetspec
