// Fused per-head RMSNorm of q and k, Neox RoPE, and the K/V cache append.
// Numerics follow python_ref/qk_norm_rope_append.py exactly where a float32 kernel can: RMSNorm
// in fp32, inv_freq = float32(theta ** (-2i/Dh)) from double, angle = one float32 multiply,
// cos/sin of that float32 angle in double then rounded to float32, the rotation without FMA
// contraction.
// A null q (K/V-only append, e.g. the draft head's context rows) launches no q warps at all:
// q, q_out and q_norm_w are then never touched and may be null too. Null norm weights (both):
// no norm (targets without QK-norm). rotary_dim R < head_dim (partial rotary): the pairs
// (i, i + R/2), i < R/2, rotate with inv_freq = theta ** (-2i/R); dims R.. pass (normed).
#pragma once
#include "jetspec/common.cuh"

namespace jetspec {

constexpr int kRopeMaxPairsPerLane = 8;
static_assert(2 * 32 * kRopeMaxPairsPerLane == kRopeMaxHeadDim, "head dims up to 2 * 32 * 8");


// Query heads processed by the kernel: none when q is null.
__host__ __device__ inline int rope_q_heads(const QkNormRopeAppendParams& p) {
  return p.q == nullptr ? 0 : p.hq;
}

constexpr int kRopeHeadsPerWarp = 8;  // heads that share one warp's cos/sin of a token
constexpr int kRopeThreads = 256;

// RMSNorm + rotation of one head of token (b, n) with the token's cos/sin, then its stores (the
// rotated q row, or the rotated k row and the v row into the cache).
__host__ __device__ inline int rope_rotary_dim(const QkNormRopeAppendParams& p) {
  return p.rotary_dim == 0 ? p.head_dim : p.rotary_dim;
}

template <typename T, typename TC>
__device__ __forceinline__ void rope_one_head(const QkNormRopeAppendParams& p, int b, int n,
                                              int head, int hq, int pos, const float* c,
                                              const float* s) {
  const int lane = threadIdx.x & 31;
  const bool is_q = head < hq;
  const int h = is_q ? head : head - hq;
  const int half = p.head_dim / 2;
  const int rhalf = rope_rotary_dim(p) / 2;  // rotated pairs (i, i + rhalf)
  const Strides4& st = is_q ? p.q_strides : p.k_strides;
  const T* src = static_cast<const T*>(is_q ? p.q : p.k) + b * st.batch + n * st.row + h * st.head;
  const float* w = is_q ? p.q_norm_w : p.k_norm_w;

  float x1[kRopeMaxPairsPerLane], x2[kRopeMaxPairsPerLane];
  float ss = 0.f;
#pragma unroll
  for (int t = 0; t < kRopeMaxPairsPerLane; ++t) {
    const int i = lane + 32 * t;
    x1[t] = x2[t] = 0.f;
    if (i < half) {
      x1[t] = to_float(src[i]);
      x2[t] = to_float(src[i + half]);
      ss += x1[t] * x1[t] + x2[t] * x2[t];
    }
  }
  ss = warp_sum(ss);
  const bool norm = w != nullptr;
  // Correctly rounded sqrt and division (no fast-math): close to torch.rsqrt in fp32.
  const float r = norm ? 1.0f / sqrtf(ss / static_cast<float>(p.head_dim) + p.eps) : 1.f;
  const int slot = p.cache_start == nullptr ? pos : p.cache_start[b] + n;
  const int64_t dst_off =
      is_q ? ((static_cast<int64_t>(b) * p.n + n) * hq + h) * p.head_dim
           : cache_offset(p.k_cache_strides, p.block_table, p.block_table_batch_stride, p.page_size,
                          b, slot, h);
  // The normed value of dim i (x = its raw value).
  auto normed = [&](float x, int i) { return norm ? __fmul_rn(__fmul_rn(x, r), w[i]) : x; };
  auto store = [&](int i, float o) {
    if (is_q) {
      static_cast<T*>(p.q_out)[dst_off + i] = from_float<T>(o);
    } else {
      static_cast<TC*>(p.k_cache)[dst_off + i] = from_float<TC>(o);
    }
  };
#pragma unroll
  for (int t = 0; t < kRopeMaxPairsPerLane; ++t) {
    const int i = lane + 32 * t;
    if (i >= rhalf) break;
    // Whole heads rotate the pairs loaded above; partial rotary pairs (i, i + rhalf).
    const float a = rhalf == half ? x1[t] : to_float(src[i]);
    const float z = rhalf == half ? x2[t] : to_float(src[i + rhalf]);
    const float n1 = normed(a, i);
    const float n2 = normed(z, i + rhalf);
    const float ct = c[t * 32 + lane], st = s[t * 32 + lane];
    store(i, __fsub_rn(__fmul_rn(n1, ct), __fmul_rn(n2, st)));
    store(i + rhalf, __fadd_rn(__fmul_rn(n2, ct), __fmul_rn(n1, st)));
  }
  for (int i = 2 * rhalf + lane; i < p.head_dim; i += 32) store(i, normed(to_float(src[i]), i));
  if (!is_q) {
    const T* vs = static_cast<const T*>(p.v) + b * p.v_strides.batch + n * p.v_strides.row +
                  h * p.v_strides.head;
    // v_cache shares k_cache's shape but may have its own strides.
    TC* vd = static_cast<TC*>(p.v_cache) +
             cache_offset(p.v_cache_strides, p.block_table, p.block_table_batch_stride, p.page_size,
                          b, slot, h);
    for (int i = lane; i < p.head_dim; i += 32) vd[i] = from_float<TC>(to_float(vs[i]));
  }
}

// One warp per (b, n, group of up to kRopeHeadsPerWarp heads): the token's cos/sin (double
// pow and sincos, the costly part) once, then each head. Heads 0..Hq'-1 are q heads,
// Hq'..Hq'+Hkv-1 are k heads (+ their v), with Hq' = rope_q_heads(p).
template <typename T, typename TC>
__global__ void __launch_bounds__(kRopeThreads)
    qk_norm_rope_append_kernel(QkNormRopeAppendParams p) {
  pdl_begin();
  const int lane = threadIdx.x & 31;
  const long long wid = (blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x) >> 5;
  const int hq = rope_q_heads(p);
  const int heads = hq + p.hkv;
  const int groups = (heads + kRopeHeadsPerWarp - 1) / kRopeHeadsPerWarp;
  const long long total = static_cast<long long>(p.batch) * p.n * groups;
  if (wid >= total) return;
  const int group = static_cast<int>(wid % groups);
  const int n = static_cast<int>((wid / groups) % p.n);
  const int b = static_cast<int>(wid / (static_cast<long long>(groups) * p.n));
  const int pos = p.positions[static_cast<long long>(b) * p.n + n];

  // The warp's cos/sin live in shared memory (entry t * 32 + lane is this lane's pair t), not
  // in registers that would have to survive the double sincos slow-path calls.
  __shared__ float cs_all[kRopeThreads / 32][2][kRopeMaxPairsPerLane * 32];
  float* c = cs_all[threadIdx.x >> 5][0];
  float* s = cs_all[threadIdx.x >> 5][1];
  const int rot = rope_rotary_dim(p);
#pragma unroll
  for (int t = 0; t < kRopeMaxPairsPerLane; ++t) {
    const int i = lane + 32 * t;
    if (2 * i >= rot) break;
    const float inv = static_cast<float>(pow(p.theta, (-2.0 * i) / static_cast<double>(rot)));
    const float angle = __fmul_rn(static_cast<float>(pos), inv);
    double sd, cd;
    sincos(static_cast<double>(angle), &sd, &cd);
    c[t * 32 + lane] = static_cast<float>(cd);
    s[t * 32 + lane] = static_cast<float>(sd);
  }
  const int h_end = min(heads, (group + 1) * kRopeHeadsPerWarp);
  for (int head = group * kRopeHeadsPerWarp; head < h_end; ++head)
    rope_one_head<T, TC>(p, b, n, head, hq, pos, c, s);
}

template <typename T, typename TC>
Status qk_norm_rope_append(const QkNormRopeAppendParams& p, cudaStream_t stream) {
  JETSPEC_RETURN_IF_FAILED(check_range("head_dim", p.head_dim, 0, kRopeMaxHeadDim));
  if (p.head_dim % 2 != 0)
    return bad_input("head_dim ", p.head_dim, " is not even (RoPE rotates halves)");
  if ((p.q == nullptr) != (p.q_out == nullptr))
    return bad_input("q and q_out must both be set or both be 0");
  if (p.q != nullptr && (p.q_norm_w == nullptr) != (p.k_norm_w == nullptr))
    return bad_input(p.q_norm_w == nullptr ? "q needs q_norm_w"
                                           : "q_norm_w needs k_norm_w (both norms or neither)");
  if (p.rotary_dim != 0 &&
      (p.rotary_dim < 2 || p.rotary_dim > p.head_dim || p.rotary_dim % 2 != 0))
    return bad_input("rotary_dim ", p.rotary_dim, " is not 0 or an even number in [2, head_dim ",
                     p.head_dim, "]");
  JETSPEC_RETURN_IF_FAILED(check_range("batch", p.batch, 0));
  JETSPEC_RETURN_IF_FAILED(check_range("n", p.n, 0));
  JETSPEC_RETURN_IF_FAILED(check_range("hq", p.hq, 0));
  JETSPEC_RETURN_IF_FAILED(check_range("hkv", p.hkv, 0));
  const int groups = (rope_q_heads(p) + p.hkv + kRopeHeadsPerWarp - 1) / kRopeHeadsPerWarp;
  const long long warps = static_cast<long long>(p.batch) * p.n * groups;
  if (warps == 0) return cudaSuccess;
  const long long blocks = (warps * 32 + kRopeThreads - 1) / kRopeThreads;
  if (blocks > kMaxGridX)
    return bad_input("batch * n * head groups = ", warps, " warps need ", blocks,
                     " blocks, over ", kMaxGridX);
  const auto kernel = qk_norm_rope_append_kernel<T, TC>;
  JETSPEC_LAUNCH(kernel, static_cast<unsigned>(blocks), kRopeThreads, 0, stream, p);
  return cudaGetLastError();
}

}  // namespace jetspec
