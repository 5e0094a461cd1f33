// Per-depth log-softmax + top-K over the full vocabulary in two phases.
// Phase 1 (vocab-parallel): one CTA per (row, 4096-entry chunk) computes the chunk's max, its
// sum of exp(x - max) and its own top-K. Phase 2: one CTA per row merges the partials into the
// log-sum-exp and the row's top-K. Order: larger logit first, ties to the lower token id. That is
// python_ref's order (a stable descending sort of the log-probs) except where two different
// logits round to the same float32 log-prob, which the tests' eps-aware checker accepts.
#pragma once
#include "jetspec/common.cuh"
#include "jetspec/primitives/block_reduce.cuh"

namespace jetspec {

constexpr int kTopkThreads = 256;
constexpr int kTopkPerThread = 16;
constexpr int kTopkChunk = kTopkThreads * kTopkPerThread;
constexpr int kTopkNone = 0x7fffffff;  // index of the "no candidate" key (-inf, INT_MAX)

// Is (av, ai) strictly before (bv, bi)? Keys are unique because token ids are.
__device__ __forceinline__ bool topk_before(float av, int ai, float bv, int bi) {
  return av > bv || (av == bv && ai < bi);
}

// Bytes of workspace for `rows` rows of `vocab` entries and top-k.
inline size_t log_softmax_topk_workspace_bytes(long long rows, int vocab, int k) {
  const long long chunks = (vocab + kTopkChunk - 1) / kTopkChunk;
  return static_cast<size_t>(rows * chunks * (2 + 2 * static_cast<long long>(k)) * 4);
}

template <typename T>
__global__ void __launch_bounds__(kTopkThreads) topk_partial_kernel(LogSoftmaxTopkParams p) {
  pdl_begin();
  __shared__ float buf_v[2 * kTopkThreads / 32];
  __shared__ int buf_i[2 * kTopkThreads / 32];
  const int chunk = blockIdx.y, chunks = gridDim.y;
  const int row = blockIdx.x;
  const int b = row / p.depth, d = row % p.depth;
  const T* x =
      static_cast<const T*>(p.logits) + b * p.logits_batch_stride + d * p.logits_row_stride;
  const int base = chunk * kTopkChunk;

  float val[kTopkPerThread];
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < kTopkPerThread; ++j) {
    const int v = base + j * kTopkThreads + threadIdx.x;
    val[j] = v < p.vocab ? to_float(x[v]) : -INFINITY;
    m = fmaxf(m, val[j]);
  }
  // Chunk max (all threads), then the chunk's sum of exp relative to it.
  int dummy = 0;
  block_best<kTopkThreads>(m, dummy, topk_before, buf_v, buf_i, 0);
  float s = 0.f;
  if (m != -INFINITY) {
#pragma unroll
    for (int j = 0; j < kTopkPerThread; ++j) s += expf(val[j] - m);
  }
  s = warp_sum(s);

  float* stats = static_cast<float*>(p.workspace);
  const long long slot = static_cast<long long>(row) * chunks + chunk;
  const long long rows = static_cast<long long>(p.batch) * p.depth;
  float* cand_v = stats + 2 * rows * chunks + slot * p.k;
  int* cand_i = reinterpret_cast<int*>(stats + 2 * rows * chunks + rows * chunks * p.k) + slot * p.k;

  // Local best strictly after the last key this thread gave away.
  float last_v = INFINITY;
  int last_i = -1;
  auto local_best = [&](float& bv, int& bi) {
    bv = -INFINITY;
    bi = kTopkNone;
#pragma unroll
    for (int j = 0; j < kTopkPerThread; ++j) {
      const int v = base + j * kTopkThreads + threadIdx.x;
      if (v < p.vocab && topk_before(last_v, last_i, val[j], v) && topk_before(val[j], v, bv, bi)) {
        bv = val[j];
        bi = v;
      }
    }
  };
  float bv;
  int bi;
  local_best(bv, bi);
  // Warp sums go to their own array; thread 0 reads them after the selection rounds' barriers.
  __shared__ float sums[kTopkThreads / 32];
  if ((threadIdx.x & 31) == 0) sums[threadIdx.x >> 5] = s;
  for (int r = 0; r < p.k; ++r) {
    float wv = bv;
    int wi = bi;
    block_best<kTopkThreads>(wv, wi, topk_before, buf_v, buf_i, (r + 1) & 1);
    if (threadIdx.x == 0) {
      cand_v[r] = wv;
      cand_i[r] = wi;
    }
    if (wi == bi && wi != kTopkNone) {  // this thread owned the winner
      last_v = wv;
      last_i = wi;
      local_best(bv, bi);
    }
  }
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int w = 0; w < kTopkThreads / 32; ++w) total += sums[w];
    stats[2 * slot] = m;
    stats[2 * slot + 1] = total;
  }
}

// staged: the row's candidates (chunks * k, 8 bytes each) are copied to dynamic shared memory
// first, so that the K selection rounds, each waiting for one thread's rescan, rescan shared
// memory instead of L2 (topk_merge decides).
__global__ void __launch_bounds__(kTopkThreads) topk_merge_kernel(LogSoftmaxTopkParams p,
                                                                  int chunks, bool staged) {
  pdl_begin();
  __shared__ float buf_v[2 * kTopkThreads / 32];
  __shared__ int buf_i[2 * kTopkThreads / 32];
  __shared__ float red[kTopkThreads / 32];
  JETSPEC_DYNAMIC_SMEM(smem_raw);
  const int row = blockIdx.x;
  const long long rows = static_cast<long long>(p.batch) * p.depth;
  const float* stats = static_cast<const float*>(p.workspace) + 2LL * row * chunks;
  const float* cand_v = static_cast<const float*>(p.workspace) + 2 * rows * chunks +
                        static_cast<long long>(row) * chunks * p.k;
  const int* cand_i = reinterpret_cast<const int*>(static_cast<const float*>(p.workspace) +
                                                   2 * rows * chunks + rows * chunks * p.k) +
                      static_cast<long long>(row) * chunks * p.k;
  const int ncand = chunks * p.k;
  if (staged) {
    float* sv = reinterpret_cast<float*>(smem_raw);
    int* si = reinterpret_cast<int*>(sv + ncand);
    for (int c = threadIdx.x; c < ncand; c += kTopkThreads) {
      sv[c] = cand_v[c];
      si[c] = cand_i[c];
    }
    cand_v = sv;
    cand_i = si;  // visible to every thread after the barrier in the first block_best
  }

  // Global max and sum of exp: combine the chunk partials.
  float m = -INFINITY;
  for (int c = threadIdx.x; c < chunks; c += kTopkThreads) m = fmaxf(m, stats[2 * c]);
  int dummy = 0;
  block_best<kTopkThreads>(m, dummy, topk_before, buf_v, buf_i, 0);
  float s = 0.f;
  if (m != -INFINITY) {
    for (int c = threadIdx.x; c < chunks; c += kTopkThreads) {
      const float mc = stats[2 * c];
      if (mc != -INFINITY) s += stats[2 * c + 1] * expf(mc - m);
    }
  }
  const float log_sum = logf(block_reduce<kTopkThreads>(s, SumOp(), red));

  float last_v = INFINITY;
  int last_i = -1;
  auto local_best = [&](float& bv, int& bi) {
    bv = -INFINITY;
    bi = kTopkNone;
    for (int c = threadIdx.x; c < ncand; c += kTopkThreads) {
      const float v = cand_v[c];
      const int i = cand_i[c];
      if (topk_before(last_v, last_i, v, i) && topk_before(v, i, bv, bi)) {
        bv = v;
        bi = i;
      }
    }
  };
  float bv;
  int bi;
  local_best(bv, bi);
  int32_t* out_t = p.tokens + static_cast<long long>(row) * p.k;
  float* out_l = p.logprobs + static_cast<long long>(row) * p.k;
  for (int r = 0; r < p.k; ++r) {
    float wv = bv;
    int wi = bi;
    block_best<kTopkThreads>(wv, wi, topk_before, buf_v, buf_i, (r + 1) & 1);
    if (threadIdx.x == 0) {
      out_t[r] = wi;
      // As torch's log_softmax: (x - max) - log(sum exp(x - max)).
      out_l[r] = __fsub_rn(__fsub_rn(wv, m), log_sum);
    }
    if (wi == bi && wi != kTopkNone) {
      last_v = wv;
      last_i = wi;
      local_best(bv, bi);
    }
  }
}

// Launches the merge of `chunks` partials per row (p.batch * p.depth rows, validated by the
// caller). The candidates are staged when they fit the default shared memory per block (48 KB
// on sm_80 / sm_90, no opt-in) next to the kernel's static arrays.
inline cudaError_t topk_merge(const LogSoftmaxTopkParams& p, int chunks, cudaStream_t stream) {
  const long long rows = static_cast<long long>(p.batch) * p.depth;
  const long long ncand = static_cast<long long>(chunks) * p.k;
  int dev = 0, per_block = 0;
  JETSPEC_RETURN_IF_ERROR(cudaGetDevice(&dev));
  JETSPEC_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlock, dev));
  constexpr long long kStaticBytes = 256;  // buf_v, buf_i, red (160 B), rounded up
  const bool staged = ncand * 8 + kStaticBytes <= per_block;
  const size_t smem = staged ? static_cast<size_t>(ncand) * 8 : 0;
  JETSPEC_LAUNCH(topk_merge_kernel, static_cast<unsigned>(rows), kTopkThreads, smem, stream, p,
                 chunks, staged);
  return cudaGetLastError();
}

template <typename T>
Status log_softmax_topk(const LogSoftmaxTopkParams& p, cudaStream_t stream) {
  JETSPEC_RETURN_IF_FAILED(check_range("batch", p.batch, 0));
  JETSPEC_RETURN_IF_FAILED(check_range("depth", p.depth, 0));
  const long long rows = static_cast<long long>(p.batch) * p.depth;
  if (rows == 0) return cudaSuccess;
  if (rows > kMaxGridX) return bad_input("batch * depth = ", rows, " exceeds ", kMaxGridX);
  JETSPEC_RETURN_IF_FAILED(check_range("k", p.k, 1));
  if (p.k > p.vocab) return bad_input("k ", p.k, " exceeds vocab ", p.vocab);
  constexpr long long kMaxVocab = static_cast<long long>(kMaxGridYZ) * kTopkChunk;  // grid y
  if (p.vocab > kMaxVocab)
    return bad_input("vocab ", p.vocab, " exceeds ", kMaxVocab, " (", kMaxGridYZ, " chunks of ",
                     kTopkChunk, ")");
  const int chunks = ceil_div(p.vocab, kTopkChunk);
  // Rows on grid x, vocabulary chunks on y.
  JETSPEC_LAUNCH(topk_partial_kernel<T>, dim3(static_cast<unsigned>(rows), chunks), kTopkThreads, 0,
                 stream, p);
  JETSPEC_RETURN_IF_ERROR(cudaGetLastError());
  return topk_merge(p, chunks, stream);
}

}  // namespace jetspec
