// Shared helpers for the torch-free kernel layer: launchers return cudaError_t, never throw.
#pragma once
#include <cuda_runtime.h>
#include <cstdint>

namespace jetspec {

// Return the first failing CUDA call's error from a launcher.
#define JETSPEC_RETURN_IF_ERROR(expr)              \
  do {                                             \
    cudaError_t jetspec_err_ = (expr);             \
    if (jetspec_err_ != cudaSuccess) return jetspec_err_; \
  } while (0)

inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

}  // namespace jetspec
