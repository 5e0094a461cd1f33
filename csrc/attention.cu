// tree_attention: mma.sync kernels for fp16 / bf16 and head dims 64, 128, 256.
#include "jetspec/api.h"
#include "jetspec/attention.cuh"

namespace jetspec {

namespace {
template <typename T>
cudaError_t attention_for_dim(const AttnParams& p, int head_dim, cudaStream_t stream) {
  switch (head_dim) {
    case 64: return tree_attention<T, 64>(p, stream);
    case 128: return tree_attention<T, 128>(p, stream);
    case 256: return tree_attention<T, 256>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}
}  // namespace

cudaError_t launch_tree_attention(const AttnParams& p, int dtype, int head_dim, cudaStream_t stream) {
  switch (dtype) {
    case kFloat16: return attention_for_dim<__half>(p, head_dim, stream);
    case kBFloat16: return attention_for_dim<__nv_bfloat16>(p, head_dim, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace jetspec
