// Today's cuda attention kernels (bf16), registered for the sweep next to the Hopper variants:
// mma.sync (attention.cuh; also the reference the variants are checked against) and the cp.async
// wgmma kernel (auto's choice on sm_90a today). Their split counts follow
// jetspec_kernels/cuda/tree_attention.py (choose_splits).
#include <algorithm>

#include "sweep.h"

namespace jetspec_sweep {
namespace {
using T = __nv_bfloat16;

// choose_splits of jetspec_kernels/cuda/tree_attention.py: one wave of `per_sm` CTAs of `rows` rows.
jetspec::Status python_splits(int batch, int n, int group, int hkv, int capacity, int rows,
                              int per_sm, int* out) {
  int dev = 0, sms = 0;
  JETSPEC_RETURN_IF_ERROR(cudaGetDevice(&dev));
  JETSPEC_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const long long tiles = (static_cast<long long>(n) * group + rows - 1) / rows;
  const long long base = tiles * batch * hkv;
  *out = 1;
  if (base == 0 || base >= per_sm * sms / 2) return jetspec::Status();
  const long long want = per_sm * sms / base;
  *out = static_cast<int>(std::max(1LL, std::min({want, capacity / 256LL, 32LL})));
  return jetspec::Status();
}

template <typename K>
jetspec::Status occupancy(int* ctas, K kernel, int threads, size_t smem) {
  if (smem > 48 * 1024) {
    JETSPEC_RETURN_IF_ERROR(cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  }
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas, kernel, threads, smem);
}

template <int HD>
jetspec::Status mma_launch(const jetspec::AttnParams& p, cudaStream_t s) {
  return jetspec::tree_attention<T, HD>(p, s);
}
template <int HD>
jetspec::Status mma_splits(int b, int n, int g, int hkv, int cap, int* out) {
  return python_splits(b, n, g, hkv, cap, jetspec::kAttnRows, 2, out);
}
template <int HD>
jetspec::Status mma_resident(int* ctas) {
  return occupancy(ctas, jetspec::tree_attention_kernel<T, HD>, jetspec::kAttnThreads,
                   jetspec::attention_smem_bytes<T, HD>());
}

jetspec::Status wgmma_launch(const jetspec::AttnParams& p, cudaStream_t s) {
  return jetspec::attention_launch<T>(p, jetspec::tree_attention_wgmma_kernel<T, 128>,
                                      jetspec::attention_wgmma_smem_bytes<128>(), 128,
                                      jetspec::kAttnThreads, jetspec::kAttnRows, s);
}
jetspec::Status wgmma_resident(int* ctas) {
  return occupancy(ctas, jetspec::tree_attention_wgmma_kernel<T, 128>, jetspec::kAttnThreads,
                   jetspec::attention_wgmma_smem_bytes<128>());
}

SweepKernel today(const char* name, const char* what, int hd, int rows, int threads, size_t smem,
                  decltype(SweepKernel::launch) launch, decltype(SweepKernel::splits) splits,
                  decltype(SweepKernel::resident) resident) {
  return SweepKernel{name, what, hd, false, 1, 64, 2, 0, 0, rows, threads, false, false, smem,
                     launch, splits, resident};
}

const Register mma128(today("mma", "today: mma.sync (the reference)", 128, 64, 128,
                            jetspec::attention_smem_bytes<T, 128>(), &mma_launch<128>,
                            &mma_splits<128>, &mma_resident<128>));
const Register mma64(today("mma_d64", "today: mma.sync, Dh 64", 64, 64, 128,
                           jetspec::attention_smem_bytes<T, 64>(), &mma_launch<64>,
                           &mma_splits<64>, &mma_resident<64>));
const Register wgmma(today("wgmma", "today: cp.async wgmma (auto on sm_90a)", 128, 64, 128,
                           jetspec::attention_wgmma_smem_bytes<128>(), &wgmma_launch,
                           &mma_splits<128>, &wgmma_resident));
}  // namespace
}  // namespace jetspec_sweep
