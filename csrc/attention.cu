// tree_attention: the wgmma kernels (sm_90a; fp16 / bf16, head dims 64, 128: cp.async loads, or
// the Hopper family: TMA loads, ping-pong consumers) and the mma.sync kernel (fp16 / bf16, head
// dims 64, 128, 256; every arch, and the fallback).
#include "jetspec/api.h"
#include "jetspec/attention.cuh"
#include "jetspec/attention_hopper.cuh"
#include "jetspec/attention_wgmma.cuh"

namespace jetspec {

namespace {
template <typename T, int HD>
Status attention_pick(const AttnParams& p, cudaStream_t stream) {
  if constexpr (HD > 128) {  // the hopper kernel's other head dims run mma.sync
    if (p.kernel == kAttnWgmma)
      return bad_input("head_dim ", HD, " is not supported by the wgmma kernel (64, 128)");
  }
  if (p.batch == 0 || p.n == 0 || p.hq == 0) return cudaSuccess;
  if constexpr (HD <= 128) {
    if (p.kernel != kAttnMma) {
      bool usable = false;
      JETSPEC_RETURN_IF_FAILED(cuda_context(wgmma_attention_usable<T, HD>(&usable),
                                            "asking which code the runtime picked"));
      if (usable && p.kernel == kAttnHopper) return tree_attention_hopper<T, HD>(p, stream);
      if (usable) {
        return attention_launch<T>(p, tree_attention_wgmma_kernel<T, HD>,
                                   attention_wgmma_smem_bytes<HD>(), HD, kAttnThreads, kAttnRows,
                                   stream);
      }
      if (p.kernel != kAttnAuto) {
        const char* name = p.kernel == kAttnHopper ? " (hopper)" : " (wgmma)";
        return unsupported("kernel ", p.kernel, name,
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
  if (p.kernel != kAttnAuto && p.kernel != kAttnMma && p.kernel != kAttnWgmma &&
      p.kernel != kAttnHopper) {
    return bad_input("kernel ", p.kernel, " is not 0 (auto), 1 (mma), 2 (wgmma) or 4 (hopper)");
  }
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

Status tree_attention_hopper_splits(int batch, int n, int hq, int hkv, int capacity, int dtype,
                                    int head_dim, int sms, int* splits) {
  *splits = 1;
  if (dtype != kFloat16 && dtype != kBFloat16) return bad_dtype("dtype", dtype, kHalfDtypes);
  JETSPEC_RETURN_IF_FAILED(check_range("hkv", hkv, 1));
  JETSPEC_RETURN_IF_FAILED(check_range("sms", sms, 1));
  if (batch <= 0 || n <= 0 || hq <= 0 || capacity <= 0) return Status();
  if (hq % hkv != 0) return bad_input("hq ", hq, " is not a multiple of hkv ", hkv);
  const int group = hq / hkv;
  const bool bf16 = dtype == kBFloat16;
  switch (head_dim) {
    case 64:
      return bf16 ? tree_attention_hopper_splits<__nv_bfloat16, 64>(batch, n, group, hkv, capacity, sms, splits)
                  : tree_attention_hopper_splits<__half, 64>(batch, n, group, hkv, capacity, sms, splits);
    case 128:
      return bf16 ? tree_attention_hopper_splits<__nv_bfloat16, 128>(batch, n, group, hkv, capacity, sms, splits)
                  : tree_attention_hopper_splits<__half, 128>(batch, n, group, hkv, capacity, sms, splits);
    default: return Status();  // mma.sync runs it (the caller's split heuristic)
  }
}

}  // namespace jetspec
