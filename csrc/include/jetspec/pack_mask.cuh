// Packing of ancestor-or-self tree masks: mask[b, i, w] bit (j % 32) set iff node j (j // 32 == w)
// is node i or an ancestor of i. Rows i >= num_nodes[b] get only their own bit.
#pragma once
#include "jetspec/common.cuh"

namespace jetspec {

// One thread per (b, i, w) mask word; walks the ancestor chain of i (its length is the depth).
__global__ void pack_mask_kernel(const int32_t* __restrict__ parents,
                                 const int32_t* __restrict__ num_nodes,
                                 int32_t* __restrict__ mask, int batch, int n, int words) {
  pdl_begin();
  const long long total = static_cast<long long>(batch) * n * words;
  for (long long t = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<long long>(gridDim.x) * blockDim.x) {
    const int w = static_cast<int>(t % words);
    const int i = static_cast<int>((t / words) % n);
    const int b = static_cast<int>(t / (static_cast<long long>(words) * n));
    const int32_t* par = parents + static_cast<long long>(b) * n;
    uint32_t bits = 0;
    if (i >= num_nodes[b]) {
      if (i / 32 == w) bits = 1u << (i % 32);
    } else {
      // Bounded walk: a malformed parent array cannot loop forever.
      for (int j = i, steps = 0; j >= 0 && j < n && steps <= n; j = par[j], ++steps) {
        if (j / 32 == w) bits |= 1u << (j % 32);
        if (par[j] >= j) break;
      }
    }
    mask[t] = static_cast<int32_t>(bits);
  }
}

inline Status pack_mask(const int32_t* parents, const int32_t* num_nodes, int32_t* mask, int batch,
                        int n, int words, cudaStream_t stream) {
  JETSPEC_RETURN_IF_FAILED(check_range("batch", batch, 0));
  JETSPEC_RETURN_IF_FAILED(check_range("n", n, 0));
  const long long want = (static_cast<long long>(n) + 31) / 32;
  if (words != want) return bad_input("words ", words, " is not ceil(n / 32) = ", want);
  const long long total = static_cast<long long>(batch) * n * words;
  if (total == 0) return cudaSuccess;
  const int threads = 256;
  const int blocks = static_cast<int>(total / threads + 1 < 65535 ? total / threads + 1 : 65535);
  JETSPEC_LAUNCH(pack_mask_kernel, blocks, threads, 0, stream, parents, num_nodes, mask, batch, n,
                 words);
  return cudaGetLastError();
}

}  // namespace jetspec
