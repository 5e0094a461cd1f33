// Warp-wide reductions: every lane of the warp takes part and gets the result.
#pragma once
#ifdef JETSPEC_CPU_SIM
#include "cuda_sim.h"
#else
#include <cuda_runtime.h>
#endif

namespace jetspec {

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

// The best of each lane's (v, i) by the strict order better(av, ai, bv, bi).
template <typename Better>
__device__ __forceinline__ void warp_best(float& v, int& i, Better better) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (better(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
}

}  // namespace jetspec
