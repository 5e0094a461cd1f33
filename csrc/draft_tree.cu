// Draft tree expansion: vocab-parallel log-softmax top-K of the logits, then one CTA per sequence
// builds the tree.
#include "jetspec/api.h"
#include "jetspec/build_tree.cuh"
#include "jetspec/log_softmax_topk.cuh"

namespace jetspec {

size_t topk_workspace_bytes(long long rows, int vocab, int k) {
  return log_softmax_topk_workspace_bytes(rows, vocab, k);
}

Status launch_log_softmax_topk(const LogSoftmaxTopkParams& p, cudaStream_t stream) {
  switch (p.dtype) {
    case kFloat32: return log_softmax_topk<float>(p, stream);
    case kFloat16: return log_softmax_topk<__half>(p, stream);
    case kBFloat16: return log_softmax_topk<__nv_bfloat16>(p, stream);
    default: return bad_dtype("dtype", p.dtype, kAllDtypes);
  }
}

Status launch_build_tree(const BuildTreeParams& p, cudaStream_t stream) {
  return build_tree(p, stream);
}

}  // namespace jetspec
