// tree_attention: the wgmma kernels (sm_90a; fp16 / bf16, head dims 64, 128: cp.async loads, or
// warp-specialised with TMA loads) and the mma.sync kernel (fp16 / bf16, head dims 64, 128, 256;
// every arch, and the fallback).
#include "jetspec/api.h"
#include "jetspec/attention.cuh"
#include "jetspec/attention_tma.cuh"
#include "jetspec/attention_wgmma.cuh"

namespace jetspec {

namespace {
template <typename T, int HD>
cudaError_t attention_pick(const AttnParams& p, cudaStream_t stream) {
  if (p.batch == 0 || p.n == 0 || p.hq == 0) return cudaSuccess;
  if constexpr (HD <= 128) {
    if (p.kernel != kAttnMma) {
      bool usable = false;
      const cudaError_t err = wgmma_attention_usable<T, HD>(&usable);
      if (err != cudaSuccess) return err;
      if (usable && p.kernel == kAttnTma) return tree_attention_tma<T, HD>(p, stream);
      if (p.kernel == kAttnTma) return cudaErrorNotSupported;
      if (usable) {
        return attention_launch<T>(p, tree_attention_wgmma_kernel<T, HD>,
                                   attention_wgmma_smem_bytes<HD>(), HD, kAttnThreads, kAttnRows,
                                   stream);
      }
      if (p.kernel == kAttnWgmma) return cudaErrorNotSupported;
    }
  } else {
    if (p.kernel == kAttnWgmma || p.kernel == kAttnTma) return cudaErrorInvalidValue;
  }
  return tree_attention<T, HD>(p, stream);
}

template <typename T>
cudaError_t attention_for_dim(const AttnParams& p, int head_dim, cudaStream_t stream) {
  switch (head_dim) {
    case 64: return attention_pick<T, 64>(p, stream);
    case 128: return attention_pick<T, 128>(p, stream);
    case 256: return attention_pick<T, 256>(p, stream);
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
