// Host-callable launchers compiled in the .cu files; bindings.cpp includes only this header.
// Every launcher checks its launch and returns the CUDA error (cudaSuccess on success).
#pragma once
#include <cuda_runtime.h>
#include <cstdint>

namespace jetspec {

cudaError_t launch_pack_mask(const int32_t* parents, const int32_t* num_nodes, int32_t* mask,
                             int batch, int n, int words, cudaStream_t stream);

}  // namespace jetspec
