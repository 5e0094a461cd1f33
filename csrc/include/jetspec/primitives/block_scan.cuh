// Prefix sums over the lanes of a warp and over the threads of a block (every lane / thread takes
// part).
#pragma once
#ifdef JETSPEC_CPU_SIM
#include "cuda_sim.h"
#else
#include <cuda_runtime.h>
#endif

namespace jetspec {

// Sum of v over lanes 0 .. this lane.
template <typename T>
__device__ __forceinline__ T warp_inclusive_scan(T v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T u = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += u;
  }
  return v;
}

// Sum of v over the threads before this one (index order). red holds blockDim.x / 32 entries;
// the first barrier waits for the previous call's readers, so consecutive calls may share red.
template <typename T>
__device__ __forceinline__ T block_exclusive_scan(T v, T* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const T inc = warp_inclusive_scan(v);
  __syncthreads();
  if (lane == 31) red[warp] = inc;
  __syncthreads();
  T base = 0;
  for (int w = 0; w < warp; ++w) base += red[w];
  return base + inc - v;
}

}  // namespace jetspec
