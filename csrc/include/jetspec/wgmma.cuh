// Thin wrappers over the sm_90a warpgroup MMA (wgmma) PTX used by the Hopper attention kernel:
// shared-memory matrix descriptors for the 128-byte swizzled layout, wgmma.mma_async
// m64n64k16 with fp32 accumulators (A from shared memory or from registers), and the fences and
// group waits around it. Layouts follow the PTX ISA ("Asynchronous Warpgroup Level Matrix Shared
// Memory Layout"):
//
//   128B swizzle atom: 8 rows of 128 bytes (64 fp16/bf16), 1024-byte aligned; 16-byte chunk c of
//   row r is stored at chunk c ^ (r % 8). A tile of R rows x 64 columns is R / 8 atoms, 1024
//   bytes apart. Wider tiles are several such column blocks.
//   K-major operand (Q as A, K as B): rows are M / N, columns K; SBO = 1024 (next 8 rows),
//   LBO unused (1). A k16 step inside an atom advances the start address by 32 bytes.
//   MN-major operand (V as B, imm-trans-b = 1): rows are K (keys), columns N; SBO = 1024 (next 8
//   keys); LBO is the stride to the next 64 columns, never used with N = 64.
#pragma once
#include "jetspec/mma.cuh"

namespace jetspec {

constexpr int kSw128Bytes = 1024;  // one swizzle atom; its alignment

// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` in a 128B-swizzled column block.
__device__ __forceinline__ int sw128_offset(int row, int chunk) {
  return row * 128 + ((chunk ^ (row & 7)) << 4);
}

#ifdef JETSPEC_CPU_SIM
}  // namespace jetspec
#include "wgmma_sim.h"  // tests/cuda_sim: descriptors decoded and the MMA emulated per warpgroup
namespace jetspec {
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define JETSPEC_WGMMA 1

// The first 1024-byte aligned address at or after p (shared memory).
__device__ __forceinline__ unsigned char* align_smem_1024(unsigned char* p) {
  const uint32_t a = smem_u32(p);
  return p + ((kSw128Bytes - (a & (kSw128Bytes - 1))) & (kSw128Bytes - 1));
}

// Shared-memory matrix descriptor: start address, leading / stride byte offsets (all >> 4),
// base offset 0 (atoms are 1024-byte aligned), swizzle mode 1 = 128B.
__device__ __forceinline__ uint64_t sw128_desc(const void* smem, uint32_t lbo_bytes,
                                               uint32_t sbo_bytes) {
  const uint64_t addr = smem_u32(smem);
  return ((addr & 0x3FFFFu) >> 4) | (static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFFu) << 16) |
         (static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Orders this thread's generic-proxy shared-memory writes (cp.async, st.shared) before later
// async-proxy reads (wgmma operands).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// 16 zero bytes stored to shared memory that a wgmma will read (a generic-proxy write: it needs
// fence_proxy_async before the wgmma; the simulator checks that).
__device__ __forceinline__ void st_shared_zero16(void* dst) {
  *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
}
// Keeps the compiler from moving accesses to the accumulators across wgmma issue / wait.
__device__ __forceinline__ void wgmma_fence_operand(float (&d)[8][4]) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}
// Register fence on an A fragment a wgmma reads from registers (P in the attention kernels):
// call it after the fragment's last write and right before wgmma_fence(). The "+r" operands make
// the definitions (e.g. P's fp32 -> 16-bit conversions) happen before this point and the wgmma
// read what it leaves, so the compiler cannot move those conversions past wgmma.fence, which
// orders only what precedes it.
__device__ __forceinline__ void wgmma_fence_fragment(uint32_t (&a)[4]) {
#pragma unroll
  for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[e])::"memory");
}

#define JETSPEC_WGMMA_D32                                                                     \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define JETSPEC_WGMMA_D32_OPERANDS(d)                                                          \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),    \
      "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
      "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), \
      "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
      "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), \
      "+f"(d[7][2]), "+f"(d[7][3])

// d (m64n64, f32) = A (64 x 16, K-major in shared memory) * B (16 x 64, K-major) [+ d].
template <typename T>
__device__ __forceinline__ void wgmma_ss(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b,
                                         bool accumulate);
// d (m64n64, f32) += A (64 x 16 in registers, the m16k16 fragment per warp) * B (16 x 64,
// MN-major in shared memory).
template <typename T>
__device__ __forceinline__ void wgmma_rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc_b);

#define JETSPEC_WGMMA_SS(TY)                                                                  \
  template <>                                                                                 \
  __device__ __forceinline__ void wgmma_ss<TY>(float (&d)[8][4], uint64_t desc_a,            \
                                               uint64_t desc_b, bool accumulate) {           \
    asm volatile(                                                                             \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                          \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." JETSPEC_WGMMA_NAME_##TY                  \
        " " JETSPEC_WGMMA_D32 ", %32, %33, p, 1, 1, 0, 0;\n}\n"                                \
        : JETSPEC_WGMMA_D32_OPERANDS(d)                                                       \
        : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));                      \
  }
#define JETSPEC_WGMMA_RS(TY)                                                                  \
  template <>                                                                                 \
  __device__ __forceinline__ void wgmma_rs<TY>(float (&d)[8][4], const uint32_t (&a)[4],     \
                                               uint64_t desc_b) {                             \
    asm volatile(                                                                             \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                            \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." JETSPEC_WGMMA_NAME_##TY                  \
        " " JETSPEC_WGMMA_D32 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                 \
        : JETSPEC_WGMMA_D32_OPERANDS(d)                                                       \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));                   \
  }
#define JETSPEC_WGMMA_NAME___half "f16.f16"
#define JETSPEC_WGMMA_NAME___nv_bfloat16 "bf16.bf16"
JETSPEC_WGMMA_SS(__half)
JETSPEC_WGMMA_SS(__nv_bfloat16)
JETSPEC_WGMMA_RS(__half)
JETSPEC_WGMMA_RS(__nv_bfloat16)
#undef JETSPEC_WGMMA_SS
#undef JETSPEC_WGMMA_RS
#endif

}  // namespace jetspec
