// Tree verification: the target's token per node (greedy argmax or seeded Gumbel-max, the
// mix32 hash of CONTRIBUTING.md) in vocab splits, then the acceptance walk, one CTA per sequence.
#pragma once
#include "jetspec/common.cuh"

namespace jetspec {

__device__ __forceinline__ uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// (value, index) order of torch.argmax: NaN is the maximum, ties go to the lower index.
__device__ __forceinline__ bool argmax_better(float av, int ai, float bv, int bi) {
  const bool an = av != av, bn = bv != bv;
  if (an || bn) return an && (!bn || ai < bi);
  return av > bv || (av == bv && ai < bi);
}


constexpr int kTargetThreads = 256;

// One CTA per (node, vocab split): the split's best value with 16-byte loads (when aligned),
// then a block argmax. argmax_better is a total order, so the splits can be combined in any
// order. Splits give a B = 1 verify enough CTAs to fill the GPU; padding nodes are skipped, but
// never the root: it is verified even when num_nodes is 0 (the walk's bonus is then its target).
template <typename T>
__global__ void __launch_bounds__(kTargetThreads) target_partial_kernel(TargetTokenParams p) {
  pdl_begin();
  const int row = blockIdx.x, split = blockIdx.y;
  const int b = row / p.n, i = row % p.n;
  if (i > 0 && i >= p.num_nodes[b]) return;  // never read by the walk
  const T* x = static_cast<const T*>(p.logits) + b * p.s0 + i * p.s1;
  const int v0 = split * p.split_len;
  const int v1 = min(p.vocab, v0 + p.split_len);
  const bool sample = p.temperature > 0.f;
  uint32_t hrow = 0;
  if (sample) {
    hrow = mix32(static_cast<uint32_t>(static_cast<uint64_t>(p.seed[b]) & 0xffffffffu));
    hrow = mix32(hrow ^ static_cast<uint32_t>(static_cast<uint64_t>(p.offset[b]) & 0xffffffffu));
    hrow = mix32(hrow ^ static_cast<uint32_t>(b));
    hrow = mix32(hrow ^ static_cast<uint32_t>(i));
  }
  float best_v = -INFINITY;
  int best_i = 0x7fffffff;
  auto consider = [&](float val, int v) {
    if (sample) {
      const uint32_t h = mix32(hrow ^ static_cast<uint32_t>(v));
      // One rounding of the exact value to float32; the largest value clamps below 1.
      float u = static_cast<float>((static_cast<double>(h >> 8) + 0.5) / 16777216.0);
      u = fminf(u, 1.0f - 5.9604644775390625e-08f);
      const float g = -logf(-logf(u));
      val = __fadd_rn(__fdiv_rn(val, p.temperature), g);
    }
    if (argmax_better(val, v, best_v, best_i)) {
      best_v = val;
      best_i = v;
    }
  };
  int scalar_from = v0;
  if (p.vec) {
    constexpr int E = 16 / sizeof(T);
    const int nvec = (v1 - v0) / E;
#pragma unroll 4
    for (int c = threadIdx.x; c < nvec; c += kTargetThreads) {
      const uint4 raw = *reinterpret_cast<const uint4*>(x + v0 + c * E);
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int j = 0; j < E; ++j) consider(to_float(e[j]), v0 + c * E + j);
    }
    scalar_from = v0 + nvec * E;
  }
  for (int v = scalar_from + threadIdx.x; v < v1; v += kTargetThreads) consider(to_float(x[v]), v);

  warp_best(best_v, best_i, argmax_better);
  __shared__ float sv[kTargetThreads / 32];
  __shared__ int si[kTargetThreads / 32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) {
    sv[warp] = best_v;
    si[warp] = best_i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kTargetThreads / 32; ++w)
      if (argmax_better(sv[w], si[w], best_v, best_i)) {
        best_v = sv[w];
        best_i = si[w];
      }
    const int64_t slot = static_cast<int64_t>(row) * p.splits + split;
    p.part_v[slot] = best_v;
    p.part_i[slot] = best_i;
  }
}

constexpr int kWalkThreads = 256;
constexpr int kWalkMaxNodes = 4096;  // tokens, parents and targets staged in 48 KB

// One CTA per sequence. All threads stage the valid nodes' tokens, parents and targets (the best
// of each node's splits, or the given target tokens) in shared memory; then warp 0 walks: at node
// cur, the accepted child is the lowest-index valid node whose parent is cur and whose token is
// the target's token at cur (a ballot over 32 nodes at a time).
__global__ void __launch_bounds__(kWalkThreads) verify_walk_kernel(VerifyWalkParams p) {
  pdl_begin();
  JETSPEC_DYNAMIC_SMEM(smem_raw);
  int32_t* s_tok = reinterpret_cast<int32_t*>(smem_raw);  // [n]
  int32_t* s_par = s_tok + p.n;                            // [n]
  int32_t* s_tgt = s_par + p.n;                            // [n]
  const int b = blockIdx.x;
  const int nn = min(p.num_nodes[b], p.n);
  // The root is staged even when num_nodes is 0: the bonus is then the target's token at node 0.
  for (int c = threadIdx.x; c < max(nn, 1); c += kWalkThreads) {
    s_tok[c] = p.tokens[static_cast<int64_t>(b) * p.n + c];
    s_par[c] = p.parents[static_cast<int64_t>(b) * p.n + c];
    if (p.target != nullptr) {
      s_tgt[c] = p.target[b * p.target_stride + c];
    } else {
      const int64_t row = static_cast<int64_t>(b) * p.n + c;
      float bv = -INFINITY;
      int bi = 0x7fffffff;
      for (int s = 0; s < p.splits; ++s) {
        const float v = p.part_v[row * p.splits + s];
        const int i = p.part_i[row * p.splits + s];
        if (argmax_better(v, i, bv, bi)) {
          bv = v;
          bi = i;
        }
      }
      s_tgt[c] = bi;
    }
  }
  __syncthreads();
  if (threadIdx.x >= 32) return;
  const int lane = threadIdx.x;
  int32_t* path = p.path + static_cast<int64_t>(b) * p.cols;
  int32_t* emitted = p.emitted + static_cast<int64_t>(b) * p.cols;

  int cur = 0, count = 1;
  if (lane == 0) path[0] = 0;
  while (count < p.cols) {
    const int t = s_tgt[cur];
    int next = -1;
    // Children come after their parent (parents[c] < c).
    for (int base = cur + 1; base < nn && next < 0; base += 32) {
      const int c = base + lane;
      const bool hit = c < nn && s_par[c] == cur && s_tok[c] == t;
      const unsigned m = __ballot_sync(0xffffffffu, hit);
      if (m) next = base + __ffs(m) - 1;
    }
    if (next < 0) break;
    if (lane == 0) {
      path[count] = next;
      emitted[count - 1] = s_tok[next];
    }
    cur = next;
    ++count;
  }
  const int a = count - 1;
  const int bonus = s_tgt[cur];
  if (lane == 0) {
    p.accept_len[b] = a;
    p.bonus[b] = bonus;
    emitted[a] = bonus;
  }
  for (int c = count + lane; c < p.cols; c += 32) {
    path[c] = -1;
    emitted[c] = -1;
  }
}

template <typename T>
cudaError_t target_tokens(const TargetTokenParams& p, cudaStream_t stream) {
  const long long rows = static_cast<long long>(p.batch) * p.n;
  if (rows == 0) return cudaSuccess;
  if (rows > 0x7fffffffLL || p.splits < 1 || p.splits > 65535) return cudaErrorInvalidConfiguration;
  if (p.split_len < 1 || static_cast<long long>(p.splits) * p.split_len < p.vocab ||
      (p.vec && p.split_len % 8 != 0))
    return cudaErrorInvalidValue;
  JETSPEC_LAUNCH(target_partial_kernel<T>, dim3(static_cast<unsigned>(rows), p.splits),
                 kTargetThreads, 0, stream, p);
  return cudaGetLastError();
}

inline cudaError_t verify_walk(const VerifyWalkParams& p, cudaStream_t stream) {
  if (p.batch == 0) return cudaSuccess;
  if (p.n < 1) return cudaErrorInvalidValue;  // a tree holds at least its root
  if (p.target == nullptr && (p.part_v == nullptr || p.part_i == nullptr || p.splits < 1))
    return cudaErrorInvalidValue;
  // n <= kWalkMaxNodes: 48 KB (the Python layer sends larger trees to another backend).
  const size_t smem = 3 * sizeof(int32_t) * static_cast<size_t>(p.n);
  if (p.n > kWalkMaxNodes) return cudaErrorInvalidConfiguration;
  JETSPEC_LAUNCH(verify_walk_kernel, p.batch, kWalkThreads, smem, stream, p);
  return cudaGetLastError();
}

}  // namespace jetspec
