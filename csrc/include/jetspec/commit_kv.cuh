// KV commit: slot prefix + path[i] -> slot prefix + i for i = 0..accept_len, in place, and the
// gather of the path's hidden rows. Each thread owns fixed (head, dim) elements of a row and
// walks i in increasing order, so the overlap is safe: a later source path[j] >= j > i is never
// a slot already written, and no other thread touches the same elements.
#pragma once
#include "jetspec/common.cuh"

namespace jetspec {

constexpr int kCommitThreads = 256;

// Copies in units U (uint4 when every row is 16-byte aligned, else the raw element type) of
// elements of elem_bytes bytes.
template <typename U>
__global__ void __launch_bounds__(kCommitThreads) commit_kv_kernel(CommitKvParams p,
                                                                int elem_bytes) {
  pdl_begin();
  const int b = blockIdx.x;
  const int pre = p.prefix_lens[b];
  const int acc = p.accept_len[b];
  const int32_t* path = p.path + static_cast<int64_t>(b) * p.cols;
  if (blockIdx.y == 0 && threadIdx.x == 0) p.new_prefix_lens[b] = pre + acc + 1;
  char* kc = static_cast<char*>(p.k_cache);
  char* vc = static_cast<char*>(p.v_cache);
  const int per_head = p.head_dim * elem_bytes / static_cast<int>(sizeof(U));
  const int row = p.hkv * per_head;
  auto unit = [&](char* base, const Strides4& st, int pos, int h, int d) {
    return reinterpret_cast<U*>(
               base + cache_offset(st, p.block_table, p.block_table_batch_stride, p.page_size, b,
                                   pos, h) *
                          elem_bytes) + d;
  };
  for (int e = blockIdx.y * blockDim.x + threadIdx.x; e < row; e += gridDim.y * blockDim.x) {
    const int h = e / per_head, d = e % per_head;
    for (int i = 0; i <= acc; ++i) {
      const int src = pre + path[i], dst = pre + i;
      if (src == dst) continue;
      *unit(kc, p.k_cache_strides, dst, h, d) = *unit(kc, p.k_cache_strides, src, h, d);
      *unit(vc, p.v_cache_strides, dst, h, d) = *unit(vc, p.v_cache_strides, src, h, d);
    }
  }
}

// One CTA per (b, i): hidden_rows[b, i] = hidden[b, path[b, i]] for i <= accept_len, else 0;
// units U of elem_bytes-byte elements as above.
template <typename U>
__global__ void __launch_bounds__(kCommitThreads) gather_hidden_kernel(CommitKvParams p,
                                                                    int elem_bytes) {
  pdl_begin();
  const int b = blockIdx.x, i = blockIdx.y;
  const int units = p.hidden_dim * elem_bytes / static_cast<int>(sizeof(U));
  U* dst = reinterpret_cast<U*>(static_cast<char*>(p.hidden_rows) +
                                (static_cast<int64_t>(b) * p.cols + i) * p.hidden_dim * elem_bytes);
  const bool on_path = i <= p.accept_len[b];
  const U* src = nullptr;
  if (on_path) {
    const int64_t off = b * p.hidden_batch_stride + p.path[b * p.cols + i] * p.hidden_row_stride;
    src = reinterpret_cast<const U*>(static_cast<const char*>(p.hidden) + off * elem_bytes);
  }
  for (int e = threadIdx.x; e < units; e += blockDim.x) dst[e] = on_path ? src[e] : U{};
}

template <typename E>
Status commit_kv(const CommitKvParams& p, cudaStream_t stream) {
  // Every check comes before the first launch: the K/V moves are in place.
  JETSPEC_RETURN_IF_FAILED(check_range("batch", p.batch, 0));
  JETSPEC_RETURN_IF_FAILED(check_range("cols", p.cols, 1, kMaxGridYZ));  // grid y of the gather
  const bool gather = p.hidden_rows != nullptr && p.hidden_dim != 0;
  const int hb = p.hidden_elem_bytes;
  if (gather && hb != 2 && hb != 4)
    return bad_input("hidden_elem_bytes ", hb, " is not 2 or 4");
  if (p.batch == 0) return cudaSuccess;
  const int eb = static_cast<int>(sizeof(E));
  const Strides4 &ks = p.k_cache_strides, &vs = p.v_cache_strides;
  const bool vec = rows_aligned16(p.k_cache, eb, p.head_dim, {ks.batch, ks.row, ks.head}) &&
                   rows_aligned16(p.v_cache, eb, p.head_dim, {vs.batch, vs.row, vs.head});
  const int units = p.hkv * p.head_dim * eb / (vec ? 16 : eb);
  const int chunks = units > 0 ? min(ceil_div(units, kCommitThreads), 64) : 1;
  const dim3 moves(p.batch, chunks);
  if (vec) {
    JETSPEC_LAUNCH(commit_kv_kernel<uint4>, moves, kCommitThreads, 0, stream, p, eb);
  } else {
    JETSPEC_LAUNCH(commit_kv_kernel<E>, moves, kCommitThreads, 0, stream, p, eb);
  }
  JETSPEC_RETURN_IF_ERROR(cudaGetLastError());
  if (!gather) return cudaSuccess;
  const dim3 grid(p.batch, p.cols);
  if (rows_aligned16(p.hidden, hb, p.hidden_dim, {p.hidden_batch_stride, p.hidden_row_stride}) &&
      rows_aligned16(p.hidden_rows, hb, p.hidden_dim, {})) {
    JETSPEC_LAUNCH(gather_hidden_kernel<uint4>, grid, kCommitThreads, 0, stream, p, hb);
  } else if (hb == 2) {
    JETSPEC_LAUNCH(gather_hidden_kernel<uint16_t>, grid, kCommitThreads, 0, stream, p, hb);
  } else {
    JETSPEC_LAUNCH(gather_hidden_kernel<uint32_t>, grid, kCommitThreads, 0, stream, p, hb);
  }
  return cudaGetLastError();
}

}  // namespace jetspec
