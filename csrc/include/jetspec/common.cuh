// Shared helpers for the torch-free kernel layer: launchers return a Status (status.h), never
// throw.
#pragma once
#ifdef JETSPEC_CPU_SIM
#include "cuda_sim.h"  // tests/cuda_sim: runs these kernels on CPU threads (CI has no GPU)
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif
#include <cstdint>
#include <initializer_list>

#include "jetspec/params.h"
#include "jetspec/pdl.cuh"
#include "jetspec/primitives/warp_reduce.cuh"
#include "jetspec/status.h"

namespace jetspec {

// Return the first failing CUDA call's error from a launcher.
#define JETSPEC_RETURN_IF_ERROR(expr)              \
  do {                                             \
    cudaError_t jetspec_err_ = (expr);             \
    if (jetspec_err_ != cudaSuccess) return jetspec_err_; \
  } while (0)

// kernel<<<grid, block, smem, stream>>>(args...) with programmatic dependent launch where the
// kernel's code has it (pdl.cuh: every kernel must start with pdl_begin()), or a run on CPU
// threads in the simulator. A templated kernel with several parameters goes through a local pointer (commas).
#ifdef JETSPEC_CPU_SIM
#define JETSPEC_LAUNCH(kernel, grid, block, smem, stream, ...) \
  ::jetspec_sim::launch(grid, block, smem, kernel, __VA_ARGS__)
#define JETSPEC_DYNAMIC_SMEM(name) unsigned char* name = ::jetspec_sim::dynamic_smem()
#else
#define JETSPEC_LAUNCH(kernel, grid, block, smem, stream, ...) \
  ::jetspec::launch_kernel(kernel, grid, block, smem, stream, __VA_ARGS__)
#define JETSPEC_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Whether rows of `elems` elements at ptr + k * stride (elements) all start 16-byte aligned and
// are whole 16-byte units.
inline bool rows_aligned16(const void* ptr, int elem_bytes, int elems,
                           std::initializer_list<int64_t> strides) {
  if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0 || (static_cast<int64_t>(elems) * elem_bytes) % 16)
    return false;
  for (int64_t s : strides)
    if ((s * elem_bytes) % 16 != 0) return false;
  return true;
}

// p as a pointer to U (a 16-byte vector such as uint4, or the element type itself): a vector
// access must be aligned to its size on the GPU, which the simulator checks here (x86 would
// read a misaligned one as if nothing were wrong). Qualify U as p is: as_units<const uint4>(x).
template <typename U, typename T>
__device__ __forceinline__ U* as_units(T* p) {
#ifdef JETSPEC_CPU_SIM
  ::jetspec_sim::require_aligned(p, alignof(U));
#endif
  return reinterpret_cast<U*>(p);
}

// Launch limits of every CUDA device the package builds for: grid x, grids y and z, and the
// dynamic shared memory a kernel gets without cudaFuncSetAttribute's opt-in.
constexpr long long kMaxGridX = 0x7fffffffLL;
constexpr int kMaxGridYZ = 65535;
constexpr int kSmemWithoutOptIn = 48 * 1024;

// "<name> <code> (<type>) is not supported (<taken>)": an element type code the launcher does not
// take; taken lists those it does, e.g. "1 float16, 2 bfloat16".
inline Status bad_dtype(const char* name, int code, const char* taken) {
  const char* type = code == kFloat32 ? " (float32)" : code == kFloat16 ? " (float16)"
                     : code == kBFloat16 ? " (bfloat16)" : "";
  return bad_input(name, " ", code, type, " is not supported (", taken, ")");
}
constexpr const char* kAllDtypes = "0 float32, 1 float16, 2 bfloat16";
constexpr const char* kHalfDtypes = "1 float16, 2 bfloat16";

// fp32 <-> storage type conversions (round to nearest even, as torch's .to()).
template <typename T> __device__ __forceinline__ float to_float(T x);
template <> __device__ __forceinline__ float to_float<float>(float x) { return x; }
template <> __device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}


// Element offset of logical cache position p of sequence b, kv head h (contiguous or paged).
__device__ __forceinline__ int64_t cache_offset(const Strides4& st, const int32_t* block_table,
                                                int64_t block_table_batch_stride, int page_size,
                                                int b, int p, int h) {
  if (block_table == nullptr) return b * st.batch + p * st.row + h * st.head;
  const int page = block_table[b * block_table_batch_stride + p / page_size];
  return page * st.batch + (p % page_size) * st.row + h * st.head;
}

}  // namespace jetspec
