// Tree verification: with top-k / top-p, each node's filter threshold first (one CTA per node);
// then the target's token per node (greedy argmax or seeded Gumbel-max over the kept tokens, the
// mix32 hash of CONTRIBUTING.md) in vocab splits, then the acceptance walk, one CTA per sequence.
#pragma once
#include "jetspec/common.cuh"
#include "jetspec/primitives/block_reduce.cuh"
#include "jetspec/primitives/radix_select.cuh"

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


// Every logit of x[v0, v1) as fn(float value, int token), spread over a block of Threads threads,
// with 16-byte loads when `vec` (x + v0 16-byte aligned).
template <typename T, int Threads, typename Fn>
__device__ __forceinline__ void for_each_logit(const T* x, int v0, int v1, bool vec, Fn fn) {
  int scalar_from = v0;
  if (vec) {
    constexpr int E = 16 / sizeof(T);
    const int nvec = (v1 - v0) / E;
#pragma unroll 4
    for (int c = threadIdx.x; c < nvec; c += Threads) {
      const uint4 raw = *reinterpret_cast<const uint4*>(x + v0 + c * E);
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int j = 0; j < E; ++j) fn(to_float(e[j]), v0 + c * E + j);
    }
    scalar_from = v0 + nvec * E;
  }
  for (int v = scalar_from + threadIdx.x; v < v1; v += Threads) fn(to_float(x[v]), v);
}

// ---- phase 0: top-k / top-p thresholds (python_ref.filter_keep) ------------------------------

constexpr int kFilterThreads = 512;
constexpr uint32_t kKeepAllKey = 0x007fffffu;  // order_key(-inf)

// A uint32 with the order of x (-0.0 keyed as +0.0, so float == and key == agree).
__device__ __forceinline__ uint32_t order_key(float x) {
  uint32_t b = static_cast<uint32_t>(__float_as_int(x));
  if (b == 0x80000000u) b = 0;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float key_value(uint32_t key) {
  return __int_as_float(static_cast<int>((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key));
}

// python_ref.token_masses: floor(exp(x - m) * 2**32), exactly 2**32 at the maximum.
__device__ __forceinline__ unsigned long long token_mass(float x, float m) {
  const float e = x == m ? 1.f : expf(__fsub_rn(x, m));
  return static_cast<unsigned long long>(__fmul_rn(e, 4294967296.f));
}

// ceil(float64(top_p) * float64(z)), at least 1: the mass the kept tokens must reach. z < 2**53,
// so the product rounds once, the same on every backend.
__device__ __forceinline__ unsigned long long mass_budget(float top_p, unsigned long long z) {
  const double budget = static_cast<double>(top_p) * static_cast<double>(z);
  if (!(budget >= 1.0)) return 1;
  unsigned long long need = static_cast<unsigned long long>(budget);
  if (static_cast<double>(need) < budget) ++need;
  return need;
}

struct FilterSmem {
  RadixSelectSmem<true> select;
  float red[kFilterThreads / 32];
};

// One CTA per node (b, i): the threshold of python_ref.filter_keep's kept set. Stages: the row
// maximum of x = logit / T (for the masses); with top-k, the k-th key (count select), its ties
// kept and the top-k set's mass Z_k; with top-p, the last key whose mass budget is not yet spent
// (mass select; the first pass gives the total when top-k is off); and when only some tokens at
// the threshold value are kept, the lowest ids among them (count select on V - 1 - id).
template <typename T>
__global__ void __launch_bounds__(kFilterThreads, 1) sample_filter_kernel(SampleFilterParams p) {
  pdl_begin();
  __shared__ FilterSmem sm;
  const int row = blockIdx.x;
  const int b = row / p.n, i = row % p.n;
  const float temp = p.temperature[b];
  const int k = p.top_k != nullptr ? p.top_k[b] : 0;
  const float top_p = p.top_p != nullptr ? p.top_p[b] : 1.f;
  const bool k_on = k > 0 && k < p.vocab;
  const bool p_on = !(top_p >= 1.f);  // NaN: on (keeps the top token)
  const bool real = i == 0 || i < p.num_nodes[b];
  uint32_t thr_key = kKeepAllKey;
  int thr_id = 0x7fffffff;
  if (temp > 0.f && real && (k_on || p_on)) {  // the same for the whole block
    const T* x =
        static_cast<const T*>(p.logits) + b * p.logits_batch_stride + i * p.logits_row_stride;
    const bool vec = p.vec != 0;
    float m = -INFINITY;
    for_each_logit<T, kFilterThreads>(x, 0, p.vocab, vec,
                                      [&](float val, int) { m = fmaxf(m, __fdiv_rn(val, temp)); });
    m = block_reduce<kFilterThreads>(m, [](float a, float b) { return fmaxf(a, b); }, sm.red);
    // Every token, keyed by x = logit / T, with its mass.
    auto by_value = [&](auto add) {
      for_each_logit<T, kFilterThreads>(x, 0, p.vocab, vec, [&](float val, int) {
        const float xs = __fdiv_rn(val, temp);
        add(order_key(xs), token_mass(xs, m));
      });
    };
    unsigned long long ties = 0, keep = 0, z = 0;
    if (k_on) {
      const auto s = radix_select<kFilterThreads, true, uint32_t>(
          by_value, 32, false, static_cast<unsigned long long>(k), sm.select);
      thr_key = s.key;
      ties = s.equal_count;
      keep = k - s.above_count;
      z = s.above_mass + keep * (s.equal_mass / max(s.equal_count, 1ull));  // the top-k set's mass
    }
    if (p_on) {
      // The mass budget: of the top-k set's mass, or (top-k off) of the total.
      const auto s = radix_select<kFilterThreads, true, uint32_t>(
          by_value, 32, true, k_on ? mass_budget(top_p, z) : 0ull, sm.select,
          [=](unsigned long long total) { return mass_budget(top_p, total); });
      // Tokens at the key are kept while the mass ranked before them is below the budget. (The
      // max()es only matter for NaN logits, which break the search's invariants: no trap.)
      const unsigned long long q = max(s.equal_mass / max(s.equal_count, 1ull), 1ull);
      const unsigned long long kept = min(s.equal_count, (s.target - s.above_mass - 1) / q + 1);
      keep = (k_on && s.key == thr_key) ? min(keep, kept) : kept;
      thr_key = s.key;
      ties = s.equal_count;
    }
    if (keep < ties) {  // the `keep` lowest token ids among the ties
      const uint32_t tie_key = thr_key;
      auto by_id = [&](auto add) {  // the tied tokens; a lower id is a larger key
        for_each_logit<T, kFilterThreads>(x, 0, p.vocab, vec, [&](float val, int v) {
          if (order_key(__fdiv_rn(val, temp)) == tie_key)
            add(static_cast<uint32_t>(p.vocab - 1 - v), 0ull);
        });
      };
      const int nbits = 64 - __clzll(static_cast<long long>(p.vocab - 1));
      const auto s = radix_select<kFilterThreads, true, uint32_t>(
          by_id, nbits, false, keep, sm.select);
      thr_id = p.vocab - 1 - static_cast<int>(s.key);
    }
  }
  if (threadIdx.x == 0) {
    p.thr_x[row] = key_value(thr_key);
    p.thr_id[row] = thr_id;
  }
}

// ---- phase 1: the target token per node ------------------------------------------------------

constexpr int kTargetThreads = 256;

// One CTA per (node, vocab split): the split's best value with 16-byte loads (when aligned),
// then a block argmax. argmax_better is a total order, so the splits can be combined in any
// order. Splits give a B = 1 verify enough CTAs to fill the GPU; padding nodes are skipped, but
// never the root: it is verified even when num_nodes is 0 (the walk's bonus is then its target).
// Sampling (temperature[b] > 0) considers only the tokens phase 0 kept, when it ran.
template <typename T>
__global__ void __launch_bounds__(kTargetThreads) target_partial_kernel(TargetTokenParams p) {
  pdl_begin();
  const int row = blockIdx.x, split = blockIdx.y;
  const int b = row / p.n, i = row % p.n;
  if (i > 0 && i >= p.num_nodes[b]) return;  // never read by the walk
  const T* x =
      static_cast<const T*>(p.logits) + b * p.logits_batch_stride + i * p.logits_row_stride;
  const int v0 = split * p.split_len;
  const int v1 = min(p.vocab, v0 + p.split_len);
  const float temp = p.temperature != nullptr ? p.temperature[b] : 0.f;
  const bool sample = temp > 0.f;
  const bool filter = sample && p.thr_x != nullptr;
  const float thr_x = filter ? p.thr_x[row] : 0.f;
  const int thr_id = filter ? p.thr_id[row] : 0;
  uint32_t hrow = 0;
  if (sample) {
    hrow = mix32(static_cast<uint32_t>(static_cast<uint64_t>(p.seed[b]) & 0xffffffffu));
    hrow = mix32(hrow ^ static_cast<uint32_t>(static_cast<uint64_t>(p.offset[b]) & 0xffffffffu));
    hrow = mix32(hrow ^ static_cast<uint32_t>(b));
    hrow = mix32(hrow ^ static_cast<uint32_t>(i));
  }
  float best_v = -INFINITY;
  int best_i = 0x7fffffff;
  for_each_logit<T, kTargetThreads>(x, v0, v1, p.vec != 0, [&](float val, int v) {
    if (sample) {
      const float xs = __fdiv_rn(val, temp);
      // A NaN is kept whatever the filters say: it is the maximum (argmax_better).
      if (filter && xs == xs && !(xs > thr_x || (xs == thr_x && v <= thr_id))) return;
      const uint32_t h = mix32(hrow ^ static_cast<uint32_t>(v));
      // One rounding of the exact value to float32; the largest value clamps below 1.
      float u = static_cast<float>((static_cast<double>(h >> 8) + 0.5) / 16777216.0);
      u = fminf(u, 1.0f - 5.9604644775390625e-08f);
      const float g = -logf(-logf(u));
      val = __fadd_rn(xs, g);
    }
    if (argmax_better(val, v, best_v, best_i)) {
      best_v = val;
      best_i = v;
    }
  });

  __shared__ float sv[2 * kTargetThreads / 32];
  __shared__ int si[2 * kTargetThreads / 32];
  block_best<kTargetThreads>(best_v, best_i, argmax_better, sv, si, 0);
  if (threadIdx.x == 0) {
    const int64_t slot = static_cast<int64_t>(row) * p.splits + split;
    p.partial_value[slot] = best_v;
    p.partial_token[slot] = best_i;
  }
}

constexpr int kWalkThreads = 256;

// Greedy rows: the longest chain of agreeing nodes (a node agrees when its token is the target's
// token at its parent), ending at the lowest index among the longest. s_tok becomes each node's
// depth on an agreeing chain (-1: none; its token is no longer needed: an agreeing node's token
// is its parent's target), filled one depth a round by the whole CTA; warp 0 then finds the
// deepest node and climbs back to the root. Returns that node; writes path and emitted (not the
// bonus) and leaves the chain's length in *len.
__device__ __forceinline__ int verify_longest_chain(const VerifyWalkParams& p, int32_t* s_tok,
                                                    const int32_t* s_par, const int32_t* s_tgt,
                                                    int nn, int32_t* path, int32_t* emitted,
                                                    int* len) {
  int32_t* s_lvl = s_tok;
  for (int c = threadIdx.x; c < max(nn, 1); c += kWalkThreads) {
    const int par = s_par[c];
    const bool agree = c > 0 && par >= 0 && par < c && s_tok[c] == s_tgt[par];
    s_lvl[c] = c == 0 ? 0 : (agree ? -2 : -1);  // -2: agrees, depth not known yet
  }
  __syncthreads();
  // Round d gives depth d + 1 to the agreeing children of depth-d nodes; a node written in this
  // round had -2 before, never d, so reading it mid-round changes nothing.
  for (int d = 0; d < p.cols - 1; ++d) {
    for (int c = threadIdx.x; c < nn; c += kWalkThreads)
      if (s_lvl[c] == -2 && s_lvl[s_par[c]] == d) s_lvl[c] = d + 1;
    __syncthreads();
  }
  if (threadIdx.x >= 32) return 0;
  const int lane = threadIdx.x;
  float best = 0.f;  // the root: depth 0
  int end = 0;
  for (int c = lane; c < nn; c += 32) {
    const float v = static_cast<float>(s_lvl[c]);
    if (v > best || (v == best && c < end)) {
      best = v;
      end = c;
    }
  }
  warp_best(best, end, [](float av, int ai, float bv, int bi) {
    return av > bv || (av == bv && ai < bi);
  });
  const int a = static_cast<int>(best);
  if (lane == 0) {
    path[0] = 0;
    int cur = end;
    for (int d = a; d >= 1; --d) {
      path[d] = cur;
      emitted[d - 1] = s_tgt[s_par[cur]];  // the agreeing node's token
      cur = s_par[cur];
    }
  }
  *len = a + 1;
  return end;
}

// One CTA per sequence. All threads stage the valid nodes' tokens, parents and targets (the best
// of each node's splits, or the given target tokens) in shared memory; then greedy rows take the
// longest agreeing chain (verify_longest_chain) and sampled rows (temperature[b] > 0) walk with
// warp 0: at node cur, the accepted child is the lowest-index valid node whose parent is cur and
// whose token is the target's token at cur (a ballot over 32 nodes at a time).
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
      s_tgt[c] = p.target[b * p.target_batch_stride + c];
    } else {
      const int64_t row = static_cast<int64_t>(b) * p.n + c;
      float bv = -INFINITY;
      int bi = 0x7fffffff;
      for (int s = 0; s < p.splits; ++s) {
        const float v = p.partial_value[row * p.splits + s];
        const int i = p.partial_token[row * p.splits + s];
        if (argmax_better(v, i, bv, bi)) {
          bv = v;
          bi = i;
        }
      }
      s_tgt[c] = bi;
    }
  }
  __syncthreads();
  int32_t* path = p.path + static_cast<int64_t>(b) * p.cols;
  int32_t* emitted = p.emitted + static_cast<int64_t>(b) * p.cols;
  const bool sampled = p.temperature != nullptr && p.temperature[b] > 0.f;  // same for the CTA
  int cur = 0, count = 1;
  if (!sampled) cur = verify_longest_chain(p, s_tok, s_par, s_tgt, nn, path, emitted, &count);
  if (threadIdx.x >= 32) return;
  const int lane = threadIdx.x;
  if (lane == 0 && sampled) path[0] = 0;
  while (sampled && count < p.cols) {
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
cudaError_t sample_filter(const SampleFilterParams& p, cudaStream_t stream) {
  const long long rows = static_cast<long long>(p.batch) * p.n;
  if (rows == 0) return cudaSuccess;
  if (rows > kMaxGridX) return cudaErrorInvalidConfiguration;
  JETSPEC_LAUNCH(sample_filter_kernel<T>, dim3(static_cast<unsigned>(rows)), kFilterThreads, 0,
                 stream, p);
  return cudaGetLastError();
}

template <typename T>
cudaError_t target_tokens(const TargetTokenParams& p, cudaStream_t stream) {
  const long long rows = static_cast<long long>(p.batch) * p.n;
  if (rows == 0) return cudaSuccess;
  if (rows > kMaxGridX || p.splits < 1 || p.splits > kMaxGridYZ)
    return cudaErrorInvalidConfiguration;
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
  if (p.target == nullptr &&
      (p.partial_value == nullptr || p.partial_token == nullptr || p.splits < 1))
    return cudaErrorInvalidValue;
  // n <= kWalkMaxNodes (the Python layer sends larger trees to another backend).
  const size_t smem = 3 * sizeof(int32_t) * static_cast<size_t>(p.n);
  if (p.n > kWalkMaxNodes) return cudaErrorInvalidConfiguration;
  JETSPEC_LAUNCH(verify_walk_kernel, p.batch, kWalkThreads, smem, stream, p);
  return cudaGetLastError();
}

}  // namespace jetspec
