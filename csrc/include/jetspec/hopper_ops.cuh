// PTX wrappers of the Hopper attention family (attention_hopper.cuh) beyond wgmma.cuh / tma.cuh:
// wgmma m64nNk16 for N = 64 and 128 (N = 64 is wgmma.cuh's), register fences for accumulators of
// any width, a named-barrier arrive (bar.arrive: the ping-pong of two consumer warpgroups),
// ex2.approx.ftz (the softmax exponential: one MUFU.EX2, no denormal handling around it) and
// setmaxnreg for a register split computed at compile time.
//
// Accumulator layout of m64nN (f32): thread t of the warpgroup holds d[j][e], column
// 8j + 2 (t % 4) + (e & 1) of row 16 (t / 32) + (t % 32) / 4 + 8 (e >> 1): wgmma.cuh's m64n64
// layout, N / 8 column tiles wide.
#pragma once
#include "jetspec/tma.cuh"
#include "jetspec/wgmma.cuh"

#ifdef JETSPEC_CPU_SIM
#include "hopper_sim.h"  // tests/cuda_sim: the same wrappers on the simulated warpgroup
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)

namespace jetspec {

// Keeps the compiler from moving accesses to accumulators across a wgmma issue or wait.
template <int NT>
__device__ __forceinline__ void wgmma_fence_acc(float (&d)[NT][4]) {
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}

#define JETSPEC_ACC4(d, j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define JETSPEC_WGMMA_D64                                                                      \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "  \
  "%56, %57, %58, %59, %60, %61, %62, %63}"
#define JETSPEC_WGMMA_D64_OPERANDS(d)                                                           \
  JETSPEC_ACC4(d, 0), JETSPEC_ACC4(d, 1), JETSPEC_ACC4(d, 2), JETSPEC_ACC4(d, 3),               \
      JETSPEC_ACC4(d, 4), JETSPEC_ACC4(d, 5), JETSPEC_ACC4(d, 6), JETSPEC_ACC4(d, 7),           \
      JETSPEC_ACC4(d, 8), JETSPEC_ACC4(d, 9), JETSPEC_ACC4(d, 10), JETSPEC_ACC4(d, 11),         \
      JETSPEC_ACC4(d, 12), JETSPEC_ACC4(d, 13), JETSPEC_ACC4(d, 14), JETSPEC_ACC4(d, 15)

// d (m64n128, f32) = A (64 x 16, K-major in shared memory) * B (16 x 128, K-major) [+ d].
template <typename T>
__device__ __forceinline__ void wgmma_ss128(float (&d)[16][4], uint64_t desc_a, uint64_t desc_b,
                                            bool accumulate);
// d (m64n128, f32) += A (64 x 16 in registers) * B (16 x 128, MN-major in shared memory).
template <typename T>
__device__ __forceinline__ void wgmma_rs128(float (&d)[16][4], const uint32_t (&a)[4],
                                            uint64_t desc_b);

#define JETSPEC_WGMMA_SS128(TY)                                                               \
  template <>                                                                                 \
  __device__ __forceinline__ void wgmma_ss128<TY>(float (&d)[16][4], uint64_t desc_a,        \
                                                  uint64_t desc_b, bool accumulate) {         \
    asm volatile(                                                                             \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                          \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." JETSPEC_WGMMA_NAME_##TY                 \
        " " JETSPEC_WGMMA_D64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"                                \
        : JETSPEC_WGMMA_D64_OPERANDS(d)                                                       \
        : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));                      \
  }
#define JETSPEC_WGMMA_RS128(TY)                                                               \
  template <>                                                                                 \
  __device__ __forceinline__ void wgmma_rs128<TY>(float (&d)[16][4], const uint32_t (&a)[4], \
                                                  uint64_t desc_b) {                          \
    asm volatile(                                                                             \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                          \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." JETSPEC_WGMMA_NAME_##TY                 \
        " " JETSPEC_WGMMA_D64 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                 \
        : JETSPEC_WGMMA_D64_OPERANDS(d)                                                       \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));                   \
  }
JETSPEC_WGMMA_SS128(__half)
JETSPEC_WGMMA_SS128(__nv_bfloat16)
JETSPEC_WGMMA_RS128(__half)
JETSPEC_WGMMA_RS128(__nv_bfloat16)
#undef JETSPEC_WGMMA_SS128
#undef JETSPEC_WGMMA_RS128

// bar.arrive on named barrier `id` for `count` threads: counts this thread's warp towards the
// barrier without waiting (the threads that bar.sync on it wait for all `count`).
__device__ __forceinline__ void named_barrier_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// x, opaque to the optimiser: a descriptor recomputed from it in every loop iteration is a few
// integer adds, where the hoisted descriptors of every k-step spill (seen with ptxas 13.0).
__device__ __forceinline__ uint64_t opaque_u64(uint64_t x) {
  asm volatile("" : "+l"(x));
  return x;
}

// 2^x with one MUFU.EX2: subnormal inputs and results flush to zero, 2^-inf = 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm volatile("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace jetspec
#endif

namespace jetspec {

// d (m64nN) = A (smem, K-major) * B (smem, K-major) [+ d], N = 64 or 128.
template <typename T, int N>
__device__ __forceinline__ void wgmma_ss_n(float (&d)[N / 8][4], uint64_t desc_a, uint64_t desc_b,
                                           bool accumulate) {
#if defined(JETSPEC_WGMMA)
  static_assert(N == 64 || N == 128, "wgmma_ss_n: N is 64 or 128");
  if constexpr (N == 64) {
    wgmma_ss<T>(d, desc_a, desc_b, accumulate);
  } else {
    wgmma_ss128<T>(d, desc_a, desc_b, accumulate);
  }
#endif
}

// d (m64nN) += A (registers) * B (smem, MN-major), N = 64 or 128.
template <typename T, int N>
__device__ __forceinline__ void wgmma_rs_n(float (&d)[N / 8][4], const uint32_t (&a)[4],
                                           uint64_t desc_b) {
#if defined(JETSPEC_WGMMA)
  static_assert(N == 64 || N == 128, "wgmma_rs_n: N is 64 or 128");
  if constexpr (N == 64) {
    wgmma_rs<T>(d, a, desc_b);
  } else {
    wgmma_rs128<T>(d, a, desc_b);
  }
#endif
}

}  // namespace jetspec
