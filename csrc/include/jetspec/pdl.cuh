// Programmatic dependent launch (PDL, sm_90 and later) for every kernel of the package.
//
// launch_kernel() launches with programmatic stream serialisation allowed, so the GPU may launch a
// grid (place its CTAs, run their first instructions) while the previous kernel in the stream is
// still finishing. Every kernel's first statement is pdl_begin(): griddepcontrol.wait blocks until
// the previous grid has completed and its memory is visible, then griddepcontrol.launch_dependents
// lets the next grid start launching. So no kernel touches global memory before its predecessor is
// done (the result is what plain stream order gives); what overlaps is the next grid's launch with
// this one's tail (docs/kernels.md, "Programmatic dependent launch"), which matters for the short
// kernel chains of a round (top-K partial -> merge -> tree build, attention -> split combine,
// target tokens -> walk).
//
// A kernel launched this way that skipped pdl_begin() could read its predecessor's output early;
// the simulator (cuda_sim.h) fails any such thread. PDL is used for kernels whose code on the
// device was compiled for sm_90 or later (pdl_enabled), unless JETSPEC_PDL=0 (read once): then
// launches are plain, and griddepcontrol.wait in a grid launched without the attribute returns
// at once.
#pragma once
#ifdef JETSPEC_CPU_SIM
#include "cuda_sim.h"
#else
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
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

// Whether `kernel` may be launched with PDL on the current device: JETSPEC_PDL is not "0" (read
// once) and the code the device runs was compiled for sm_90 or later (cudaFuncAttributes::
// ptxVersion >= 90), so it has griddepcontrol.wait. Gating on the device alone would be wrong: a
// newer GPU JIT-compiles the build's compute_80 PTX, whose pdl_begin() is empty, and a kernel
// that does not wait may run before its predecessor's last writes are visible. Cached per
// (kernel, device).
inline std::mutex pdl_mutex;
inline std::map<std::pair<const void*, int>, bool> pdl_known;

inline bool pdl_enabled(const void* kernel) {
  static const bool allowed = [] {
    const char* env = std::getenv("JETSPEC_PDL");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  if (!allowed) return false;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  std::lock_guard<std::mutex> lock(pdl_mutex);
  const auto key = std::make_pair(kernel, dev);
  const auto it = pdl_known.find(key);
  if (it != pdl_known.end()) return it->second;
  cudaFuncAttributes attr{};
  const bool ok = cudaFuncGetAttributes(&attr, kernel) == cudaSuccess && attr.ptxVersion >= 90;
  pdl_known.emplace(key, ok);
  return ok;
}

// kernel<<<grid, block, smem, stream>>>(args...), with PDL where pdl_enabled(kernel). Returns the
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
  cfg.numAttrs = pdl_enabled(reinterpret_cast<const void*>(kernel)) ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}
#endif

}  // namespace jetspec
