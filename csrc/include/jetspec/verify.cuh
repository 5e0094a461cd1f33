// Tree verification: the target's token per node (greedy argmax or seeded Gumbel-max, the
// mix32 hash of CONTRIBUTING.md), then the acceptance walk, one warp per sequence.
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


// One CTA per (b, node): a strided pass over the vocabulary, then a block argmax.
template <typename T>
__global__ void __launch_bounds__(256) target_tokens_kernel(TargetTokenParams p) {
  const int row = blockIdx.x;
  const int b = row / p.n, i = row % p.n;
  if (i >= p.num_nodes[b]) {  // padding rows are never read by the walk
    if (threadIdx.x == 0) p.target[row] = -1;
    return;
  }
  const T* x = static_cast<const T*>(p.logits) + b * p.s0 + i * p.s1;
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
  for (int v = threadIdx.x; v < p.vocab; v += blockDim.x) {
    float val = to_float(x[v]);
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
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best_v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (argmax_better(ov, oi, best_v, best_i)) {
      best_v = ov;
      best_i = oi;
    }
  }
  __shared__ float sv[32];
  __shared__ int si[32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) {
    sv[warp] = best_v;
    si[warp] = best_i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w)
      if (argmax_better(sv[w], si[w], best_v, best_i)) {
        best_v = sv[w];
        best_i = si[w];
      }
    p.target[row] = best_i;
  }
}


// One warp per sequence: at node cur, the accepted child is the lowest-index valid node whose
// parent is cur and whose token is the target's token at cur (a ballot over 32 nodes at a time).
__global__ void __launch_bounds__(32) verify_walk_kernel(VerifyWalkParams p) {
  const int b = blockIdx.x;
  const int lane = threadIdx.x;
  const int32_t* tok = p.tokens + static_cast<int64_t>(b) * p.n;
  const int32_t* par = p.parents + static_cast<int64_t>(b) * p.n;
  const int32_t* tgt = p.target + b * p.target_stride;
  const int nn = min(p.num_nodes[b], p.n);
  int32_t* path = p.path + static_cast<int64_t>(b) * p.cols;
  int32_t* emitted = p.emitted + static_cast<int64_t>(b) * p.cols;

  int cur = 0, count = 1;
  if (lane == 0) path[0] = 0;
  while (count < p.cols) {
    const int t = tgt[cur];
    int next = -1;
    // Children come after their parent (parents[c] < c).
    for (int base = cur + 1; base < nn && next < 0; base += 32) {
      const int c = base + lane;
      const bool hit = c < nn && par[c] == cur && tok[c] == t;
      const unsigned m = __ballot_sync(0xffffffffu, hit);
      if (m) next = base + __ffs(m) - 1;
    }
    if (next < 0) break;
    if (lane == 0) {
      path[count] = next;
      emitted[count - 1] = tok[next];
    }
    cur = next;
    ++count;
  }
  const int a = count - 1;
  const int bonus = tgt[cur];
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
  if (rows > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
  JETSPEC_LAUNCH(target_tokens_kernel<T>, static_cast<unsigned>(rows), 256, 0, stream, p);
  return cudaGetLastError();
}

inline cudaError_t verify_walk(const VerifyWalkParams& p, cudaStream_t stream) {
  if (p.batch == 0) return cudaSuccess;
  JETSPEC_LAUNCH(verify_walk_kernel, p.batch, 32, 0, stream, p);
  return cudaGetLastError();
}

}  // namespace jetspec
