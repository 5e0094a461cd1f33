// Block-wide reductions over the Threads threads of a block (a multiple of 32, every thread takes
// part); every thread gets the result. Scratch arrays are shared memory the caller owns.
#pragma once
#include "jetspec/primitives/warp_reduce.cuh"

namespace jetspec {

struct MinOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a < b ? a : b; }
};
struct MaxOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a > b ? a : b; }
};
struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};

// op over every thread's v[j], for each of the N values in one pass (two barriers in all);
// red holds N * Threads / 32 entries. The first barrier waits for the previous call's readers,
// so consecutive calls may share red. Warp results combine in warp order.
template <int Threads, int N, typename T, typename Op>
__device__ __forceinline__ void block_reduce_n(T (&v)[N], Op op, T* red) {
  static_assert(Threads % 32 == 0, "whole warps");
  constexpr int kWarps = Threads / 32;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = op(v[j], __shfl_xor_sync(0xffffffffu, v[j], o));
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) {
#pragma unroll
    for (int j = 0; j < N; ++j) red[j * kWarps + (threadIdx.x >> 5)] = v[j];
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < N; ++j) {
    v[j] = red[j * kWarps];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) v[j] = op(v[j], red[j * kWarps + w]);
  }
}

// op over every thread's v; red holds Threads / 32 entries (as block_reduce_n).
template <int Threads, typename T, typename Op>
__device__ __forceinline__ T block_reduce(T v, Op op, T* red) {
  T one[1] = {v};
  block_reduce_n<Threads>(one, op, red);
  return one[0];
}

// The best of every thread's (v, i) by the strict order better(av, ai, bv, bi). buf_v and buf_i
// hold 2 * Threads / 32 entries; consecutive calls alternate parity (0, 1, 0, ...), so each call
// needs one barrier only: a call's writes go to the half the previous call did not read.
template <int Threads, typename Better>
__device__ __forceinline__ void block_best(float& v, int& i, Better better, float* buf_v,
                                           int* buf_i, int parity) {
  static_assert(Threads % 32 == 0, "whole warps");
  constexpr int kWarps = Threads / 32;
  warp_best(v, i, better);
  if ((threadIdx.x & 31) == 0) {
    buf_v[parity * kWarps + (threadIdx.x >> 5)] = v;
    buf_i[parity * kWarps + (threadIdx.x >> 5)] = i;
  }
  __syncthreads();
  v = buf_v[parity * kWarps];
  i = buf_i[parity * kWarps];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) {
    const float ov = buf_v[parity * kWarps + w];
    const int oi = buf_i[parity * kWarps + w];
    if (better(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
}

}  // namespace jetspec
