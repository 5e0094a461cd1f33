// KV commit: slot prefix + path[i] -> slot prefix + i for i = 0..accept_len, in place, and the
// gather of the path's hidden rows. Each thread owns fixed (head, dim) elements of a row and
// walks i in increasing order, so the overlap is safe: a later source path[j] >= j > i is never
// a slot already written, and no other thread touches the same elements.
#pragma once
#include "jetspec/common.cuh"

namespace jetspec {


// Raw element copies: E is an unsigned integer of the element's size (2 or 4 bytes).
template <typename E>
__global__ void __launch_bounds__(256) commit_kv_kernel(CommitParams p) {
  const int b = blockIdx.x;
  const int pre = p.prefix_lens[b];
  const int acc = p.accept_len[b];
  const int32_t* path = p.path + static_cast<int64_t>(b) * p.cols;
  if (blockIdx.y == 0 && threadIdx.x == 0) p.new_prefix_lens[b] = pre + acc + 1;
  E* kc = static_cast<E*>(p.k_cache);
  E* vc = static_cast<E*>(p.v_cache);
  const int row = p.hkv * p.dh;
  for (int e = blockIdx.y * blockDim.x + threadIdx.x; e < row; e += gridDim.y * blockDim.x) {
    const int h = e / p.dh, d = e % p.dh;
    for (int i = 0; i <= acc; ++i) {
      const int src = pre + path[i], dst = pre + i;
      if (src == dst) continue;
      kc[cache_offset(p.sk, p.block_table, p.bt_stride, p.page_size, b, dst, h) + d] =
          kc[cache_offset(p.sk, p.block_table, p.bt_stride, p.page_size, b, src, h) + d];
      vc[cache_offset(p.sv, p.block_table, p.bt_stride, p.page_size, b, dst, h) + d] =
          vc[cache_offset(p.sv, p.block_table, p.bt_stride, p.page_size, b, src, h) + d];
    }
  }
}

// One CTA per (b, i): hidden_rows[b, i] = hidden[b, path[b, i]] for i <= accept_len, else 0.
template <typename E>
__global__ void __launch_bounds__(256) gather_hidden_kernel(CommitParams p) {
  const int b = blockIdx.x, i = blockIdx.y;
  E* dst = static_cast<E*>(p.hidden_rows) + (static_cast<int64_t>(b) * p.cols + i) * p.hidden_dim;
  const bool on_path = i <= p.accept_len[b];
  const E* src = nullptr;
  if (on_path) src = static_cast<const E*>(p.hidden) + b * p.sh0 + p.path[b * p.cols + i] * p.sh1;
  for (int e = threadIdx.x; e < p.hidden_dim; e += blockDim.x) dst[e] = on_path ? src[e] : E(0);
}

template <typename E>
cudaError_t commit_kv(const CommitParams& p, int hidden_elem_bytes, cudaStream_t stream) {
  if (p.batch == 0) return cudaSuccess;
  const int row = p.hkv * p.dh;
  const int chunks = row > 0 ? min(ceil_div(row, 256), 64) : 1;
  JETSPEC_LAUNCH(commit_kv_kernel<E>, dim3(p.batch, chunks), 256, 0, stream, p);
  JETSPEC_RETURN_IF_ERROR(cudaGetLastError());
  if (p.hidden_rows == nullptr || p.hidden_dim == 0 || p.cols == 0) return cudaSuccess;
  if (p.cols > 65535) return cudaErrorInvalidConfiguration;
  const dim3 grid(p.batch, p.cols);
  if (hidden_elem_bytes == 2) {
    JETSPEC_LAUNCH(gather_hidden_kernel<uint16_t>, grid, 256, 0, stream, p);
  } else if (hidden_elem_bytes == 4) {
    JETSPEC_LAUNCH(gather_hidden_kernel<uint32_t>, grid, 256, 0, stream, p);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace jetspec
