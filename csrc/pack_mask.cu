// Explicit entry point for the mask-packing launcher (kept out of bindings.cpp, which is C++).
#include "jetspec/pack_mask.cuh"
#include "jetspec/api.h"

namespace jetspec {

Status launch_pack_mask(const PackMaskParams& p, cudaStream_t stream) {
  return pack_mask(p.parents, p.num_nodes, p.mask, p.batch, p.n, p.words, stream);
}

}  // namespace jetspec
