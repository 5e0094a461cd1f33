// Explicit entry point for the mask-packing launcher (kept out of bindings.cpp, which is C++).
#include "jetspec/pack_mask.cuh"
#include "jetspec/api.h"

namespace jetspec {

Status launch_pack_mask(const int32_t* parents, const int32_t* num_nodes, int32_t* mask, int batch,
                        int n, int words, cudaStream_t stream) {
  return pack_mask(parents, num_nodes, mask, batch, n, words, stream);
}

}  // namespace jetspec
