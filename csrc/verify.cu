// verify_tree: target tokens per node (fp32 / fp16 / bf16 logits) and the acceptance walk.
#include "jetspec/api.h"
#include "jetspec/verify.cuh"

namespace jetspec {

cudaError_t launch_target_tokens(const TargetTokenParams& p, int logits_dtype, cudaStream_t stream) {
  switch (logits_dtype) {
    case kFloat32: return target_tokens<float>(p, stream);
    case kFloat16: return target_tokens<__half>(p, stream);
    case kBFloat16: return target_tokens<__nv_bfloat16>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t launch_verify_walk(const VerifyWalkParams& p, cudaStream_t stream) {
  return verify_walk(p, stream);
}

}  // namespace jetspec
