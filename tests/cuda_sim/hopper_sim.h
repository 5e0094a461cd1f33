// The wrappers of jetspec/hopper_ops.cuh, emulated for cuda_sim.h: wgmma m64n128k16 (queued and
// retired like wgmma_sim.h's m64n64), bar.arrive, ex2.approx.ftz and the accumulator fence.
#pragma once
#include <cmath>

namespace jetspec {

template <int NT>
inline void wgmma_fence_acc(float (&)[NT][4]) {}

template <typename T>
inline void wgmma_ss128(float (&d)[16][4], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  sim_detail::issue_ss<T>(d, 16, desc_a, desc_b, accumulate);
}

template <typename T>
inline void wgmma_rs128(float (&d)[16][4], const uint32_t (&a)[4], uint64_t desc_b) {
  sim_detail::issue_rs<T>(d, 16, a, desc_b);
}

inline uint64_t opaque_u64(uint64_t x) { return x; }

inline void named_barrier_arrive(int id, int count) {
  ::jetspec_sim::named_barrier_arrive(id, count);
}

// ex2.approx.ftz.f32: subnormal inputs read as 0, subnormal results flush to +0. (The GPU's
// approximation differs from exp2f by up to 2 ulp; the tolerances cover it.)
inline float fast_exp2(float x) {
  if (std::fpclassify(x) == FP_SUBNORMAL) x = 0.f;
  const float y = std::exp2f(x);
  return std::fpclassify(y) == FP_SUBNORMAL ? 0.f : y;
}

}  // namespace jetspec
