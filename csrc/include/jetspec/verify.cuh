// Tree verification: with top-k / top-p, each node's filter threshold first (one CTA per node);
// then the target's token per node (greedy argmax or seeded Gumbel-max over the kept tokens, the
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
constexpr int kFilterRadixBits = 8;
constexpr int kFilterBins = 1 << kFilterRadixBits;
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
  unsigned int cnt[kFilterBins];         // this pass's histogram: tokens per digit
  unsigned long long mass[kFilterBins];  // and their mass
  float red[kFilterThreads / 32];
  int digit;                             // warp 0's choice, for every thread (the next
  unsigned long long above_cnt, above_mass, eq_cnt, eq_mass, target;  // pass zeroes cnt/mass)
};

struct Selected {
  uint32_t key;                                 // the selected key c
  unsigned long long above_cnt, above_mass;     // tokens with keys above c, and their mass
  unsigned long long eq_cnt, eq_mass;           // tokens with key c, and their mass
  unsigned long long target;                    // the weight the search reached
};

// Radix select, 8 bits a pass from the top of an nbits-bit key: the largest key c whose tokens
// at or above it weigh at least `target` (weight: count, or mass when by_mass). key_of(value, v,
// &key, &mass) says whether token v takes part and gives its key and mass. With budget_p >= 0
// the target is mass_budget(budget_p, total mass), the total taken from the first pass. Every
// sum is an integer, so the order of the atomics does not matter.
template <typename T, typename KeyOf>
__device__ __forceinline__ Selected radix_select(const T* x, int vocab, bool vec, KeyOf key_of, int nbits,
                                 bool by_mass, unsigned long long target, float budget_p,
                                 FilterSmem& sm) {
  const int npass = (nbits + kFilterRadixBits - 1) / kFilterRadixBits;
  Selected r{0u, 0ull, 0ull, 0ull, 0ull, target};
  for (int pass = 0; pass < npass; ++pass) {
    const int shift = (npass - 1 - pass) * kFilterRadixBits;
    for (int i = threadIdx.x; i < kFilterBins; i += kFilterThreads) {
      sm.cnt[i] = 0u;
      sm.mass[i] = 0ull;
    }
    __syncthreads();
    const uint64_t high = static_cast<uint64_t>(r.key) >> (shift + kFilterRadixBits);
    for_each_logit<T, kFilterThreads>(x, 0, vocab, vec, [&](float val, int v) {
      uint32_t key;
      unsigned long long q;
      if (!key_of(val, v, key, q) || (static_cast<uint64_t>(key) >> (shift + kFilterRadixBits)) != high)
        return;
      const int d = (key >> shift) & (kFilterBins - 1);
      atomicAdd(&sm.cnt[d], 1u);
      if (q) atomicAdd(&sm.mass[d], q);
    });
    __syncthreads();
    if (threadIdx.x < 32) {
      // Lane l holds bins 8 (31 - l) .. 8 (31 - l) + 7: lane 0 the highest keys.
      const int lane = threadIdx.x, top = 8 * (31 - lane) + 7;
      unsigned long long own_c = 0, own_m = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        own_c += sm.cnt[top - j];
        own_m += sm.mass[top - j];
      }
      unsigned long long inc_c = own_c, inc_m = own_m;  // lanes 0..l: the bins from the top
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long uc = __shfl_up_sync(0xffffffffu, inc_c, o);
        const unsigned long long um = __shfl_up_sync(0xffffffffu, inc_m, o);
        if (lane >= o) {
          inc_c += uc;
          inc_m += um;
        }
      }
      unsigned long long goal = r.target;
      if (pass == 0 && budget_p >= 0.f)
        goal = mass_budget(budget_p, __shfl_sync(0xffffffffu, inc_m, 31));
      const bool reach = (by_mass ? r.above_mass + inc_m : r.above_cnt + inc_c) >= goal;
      const unsigned hit = __ballot_sync(0xffffffffu, reach);
      if (lane == (hit ? __ffs(hit) - 1 : 31)) {
        unsigned long long rc = r.above_cnt + inc_c - own_c, rm = r.above_mass + inc_m - own_m;
        int d = top;
        for (; d > top - 7; --d) {
          if ((by_mass ? rm + sm.mass[d] : rc + sm.cnt[d]) >= goal) break;
          rc += sm.cnt[d];
          rm += sm.mass[d];
        }
        sm.digit = d;
        sm.above_cnt = rc;
        sm.above_mass = rm;
        sm.eq_cnt = sm.cnt[d];
        sm.eq_mass = sm.mass[d];
        sm.target = goal;
      }
    }
    __syncthreads();
    r.key |= static_cast<uint32_t>(sm.digit) << shift;
    r.above_cnt = sm.above_cnt;
    r.above_mass = sm.above_mass;
    r.eq_cnt = sm.eq_cnt;
    r.eq_mass = sm.eq_mass;
    r.target = sm.target;
  }
  return r;
}

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
    const T* x = static_cast<const T*>(p.logits) + b * p.s0 + i * p.s1;
    const bool vec = p.vec != 0;
    float m = -INFINITY;
    for_each_logit<T, kFilterThreads>(x, 0, p.vocab, vec,
                                      [&](float val, int) { m = fmaxf(m, __fdiv_rn(val, temp)); });
    m = warp_max(m);
    if ((threadIdx.x & 31) == 0) sm.red[threadIdx.x >> 5] = m;
    __syncthreads();
    m = sm.red[0];
    for (int w = 1; w < kFilterThreads / 32; ++w) m = fmaxf(m, sm.red[w]);
    auto by_value = [&](float val, int, uint32_t& key, unsigned long long& q) {
      const float xs = __fdiv_rn(val, temp);
      key = order_key(xs);
      q = token_mass(xs, m);
      return true;
    };
    unsigned long long ties = 0, keep = 0, z = 0;
    if (k_on) {
      const Selected s = radix_select<T>(x, p.vocab, vec, by_value, 32, false,
                                         static_cast<unsigned long long>(k), -1.f, sm);
      thr_key = s.key;
      ties = s.eq_cnt;
      keep = k - s.above_cnt;
      z = s.above_mass + keep * (s.eq_mass / max(s.eq_cnt, 1ull));  // the top-k set's mass
    }
    if (p_on) {
      const Selected s = radix_select<T>(x, p.vocab, vec, by_value, 32, true,
                                         k_on ? mass_budget(top_p, z) : 0ull,
                                         k_on ? -1.f : top_p, sm);
      // Tokens at the key are kept while the mass ranked before them is below the budget. (The
      // max()es only matter for NaN logits, which break the search's invariants: no trap.)
      const unsigned long long q = max(s.eq_mass / max(s.eq_cnt, 1ull), 1ull);
      const unsigned long long kept = min(s.eq_cnt, (s.target - s.above_mass - 1) / q + 1);
      keep = (k_on && s.key == thr_key) ? min(keep, kept) : kept;
      thr_key = s.key;
      ties = s.eq_cnt;
    }
    if (keep < ties) {  // the `keep` lowest token ids among the ties
      const uint32_t tie_key = thr_key;
      auto by_id = [&](float val, int v, uint32_t& key, unsigned long long& q) {
        key = static_cast<uint32_t>(p.vocab - 1 - v);
        q = 0;
        return order_key(__fdiv_rn(val, temp)) == tie_key;
      };
      const int nbits = 64 - __clzll(static_cast<long long>(p.vocab - 1));
      const Selected s = radix_select<T>(x, p.vocab, vec, by_id, nbits, false, keep, -1.f, sm);
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
  const T* x = static_cast<const T*>(p.logits) + b * p.s0 + i * p.s1;
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
cudaError_t sample_filter(const SampleFilterParams& p, cudaStream_t stream) {
  const long long rows = static_cast<long long>(p.batch) * p.n;
  if (rows == 0) return cudaSuccess;
  if (rows > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
  JETSPEC_LAUNCH(sample_filter_kernel<T>, dim3(static_cast<unsigned>(rows)), kFilterThreads, 0,
                 stream, p);
  return cudaGetLastError();
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
