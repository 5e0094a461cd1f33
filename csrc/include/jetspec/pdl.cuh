// Programmatic dependent launch (PDL, sm_90 and later) for every kernel of the package.
//
// launch_kernel() launches with programmatic stream serialisation allowed, so the GPU may launch a
// grid (place its CTAs, run their first instructions) while the previous kernel in the stream is
// still finishing. Every kernel's first statement is pdl_begin(): griddepcontrol.wait blocks until
// the previous grid has completed and its memory is visible, then griddepcontrol.launch_dependents
// lets the next grid start launching. So no kernel touches global memory before its predecessor is
// done (the result is what plain stream order gives); what overlaps is the next grid's launch with
// this one's tail, about 1-2 us a boundary, which matters for the short kernel chains of a round
// (top-K partial -> merge -> tree build, attention -> split combine, target tokens -> walk).
//
// A kernel launched this way that skipped pdl_begin() could read its predecessor's output early;
// the simulator (cuda_sim.h) fails any such thread. PDL is used where the device's compute
// capability is 9 or more, unless JETSPEC_PDL=0 (read once): then launches are plain, and
// griddepcontrol.wait in a grid launched without the attribute returns at once.
#pragma once
#ifdef JETSPEC_CPU_SIM
#include "cuda_sim.h"
#else
#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <utility>
#endif

namespace jetspec {

#ifdef JETSPEC_CPU_SIM
__device__ __forceinline__ void pdl_begin() { ::jetspec_sim::griddepcontrol_wait(); }
#else
__device__ __forceinline__ void pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// True when launches on the current device may use PDL (compute capability >= 9, JETSPEC_PDL not
// "0"). The capability is cached per device.
inline bool pdl_enabled() {
  static const bool allowed = [] {
    const char* env = std::getenv("JETSPEC_PDL");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  if (!allowed) return false;
  constexpr int kMaxDevices = 64;
  static std::atomic<int> major[kMaxDevices];  // 0: not looked up yet
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return false;
  int m = major[dev].load(std::memory_order_relaxed);
  if (m == 0) {
    if (cudaDeviceGetAttribute(&m, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
    major[dev].store(m, std::memory_order_relaxed);
  }
  return m >= 9;
}

// kernel<<<grid, block, smem, stream>>>(args...), with PDL where pdl_enabled(). Returns the
// launch's error (also left for cudaGetLastError, as a <<<>>> launch leaves it).
template <typename... KArgs, typename... Args>
cudaError_t launch_kernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                          cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}
#endif

}  // namespace jetspec
