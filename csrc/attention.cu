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
Status attention_pick(const AttnParams& p, cudaStream_t stream) {
  if constexpr (HD > 128) {
    if (p.kernel == kAttnWgmma || p.kernel == kAttnTma)
      return bad_input("head_dim ", HD, " is not supported by the wgmma kernels (64, 128)");
  }
  if (p.batch == 0 || p.n == 0 || p.hq == 0) return cudaSuccess;
  if constexpr (HD <= 128) {
    if (p.kernel != kAttnMma) {
      bool usable = false;
      JETSPEC_RETURN_IF_FAILED(cuda_context(wgmma_attention_usable<T, HD>(&usable),
                                            "asking which code the runtime picked"));
      if (usable && p.kernel == kAttnTma) return tree_attention_tma<T, HD>(p, stream);
      if (usable) {
        return attention_launch<T>(p, tree_attention_wgmma_kernel<T, HD>,
                                   attention_wgmma_smem_bytes<HD>(), HD, kAttnThreads, kAttnRows,
                                   stream);
      }
      if (p.kernel != kAttnAuto) {
        return unsupported("kernel ", p.kernel, p.kernel == kAttnTma ? " (tma)" : " (wgmma)",
                           " needs sm_90a code, which this device does not run (built for ",
                           JETSPEC_CUDA_ARCHS, ")");
      }
    }
  }
  return tree_attention<T, HD>(p, stream);
}

template <typename T>
Status attention_for_dim(const AttnParams& p, int head_dim, cudaStream_t stream) {
  switch (head_dim) {
    case 64: return attention_pick<T, 64>(p, stream);
    case 128: return attention_pick<T, 128>(p, stream);
    case 256: return attention_pick<T, 256>(p, stream);
    default: return bad_input("head_dim ", head_dim, " is not supported (64, 128, 256)");
  }
}
}  // namespace

Status launch_tree_attention(const AttnParams& args, cudaStream_t stream) {
  AttnParams p = args;
  p.group = p.hkv > 0 ? p.hq / p.hkv : 0;
  p.scale_log2 = p.scale * 1.4426950408889634f;
  if (p.dtype != kFloat16 && p.dtype != kBFloat16) return bad_dtype("dtype", p.dtype, kHalfDtypes);
  if (p.kernel < kAttnAuto || p.kernel > kAttnTma)
    return bad_input("kernel ", p.kernel, " is not 0 (auto), 1 (mma), 2 (wgmma) or 3 (tma)");
  if (p.tail < kTailMask || p.tail > kTailFull)
    return bad_input("tail ", p.tail, " is not 0 (mask), 1 (causal) or 2 (full)");
  if (p.tail == kTailMask && p.tree_mask == nullptr)
    return bad_input("tail 0 (mask) needs tree_mask");
  JETSPEC_RETURN_IF_FAILED(check_range("batch", p.batch, 0));
  JETSPEC_RETURN_IF_FAILED(check_range("n", p.n, 0));
  JETSPEC_RETURN_IF_FAILED(check_range("hq", p.hq, 0));
  return p.dtype == kFloat16 ? attention_for_dim<__half>(p, p.head_dim, stream)
                             : attention_for_dim<__nv_bfloat16>(p, p.head_dim, stream);
}

}  // namespace jetspec
