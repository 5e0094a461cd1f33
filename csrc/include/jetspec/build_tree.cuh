// Draft tree selection from per-depth top-K, one CTA per sequence, bit-exact with
// python_ref/build_tree.py (float32 scores summed left to right, the same tie rules).
//
// topn (kTopnThreads): the best-first order taken in batches, the algorithm of
// jetspec_kernels/triton/build_tree.py (its docstring has the argument). Nodes live at their
// output (breadth-first) positions, so a child's spec-order key (TopnKey) is
//   q(score) << 30 | depth << 18 | parent position << 6 | rank
// with q = the 31-bit magnitude of the (<= 0) score: one int64 comparison applies the whole
// tie rule. A step looks at a window of the next kTopnWindow children of every node and takes
// every entry that provably precedes anything not yet seen (the heap minimum always), then
// re-lays the tree out in shared memory (one block scan). Far fewer steps than nodes (measured
// counts: docs/perf/build_tree.md); many when a deeper level costs almost
// nothing (a top log-prob near 0), since a step then takes about one generation.
// A step is one iteration of the `while (n < target)` loop, the last (partial) one included;
// when p.steps is not null, thread 0 writes the count to p.steps[b] (0 when the
// root alone fills the tree). A bound made stricter only costs steps, never parity, so
// tests/test_cuda_build_tree_steps.py checks the count against a model of the rule.
//
// accum_logp (one warp): JetSpec's heap, simulated. Slots are insertion order (= output order);
// each lane caches the best of its own slots (slot s belongs to lane s % 32) and rescans only
// when one of them is popped. It leaves p.steps unwritten.
#pragma once
#include "jetspec/common.cuh"
#include "jetspec/primitives/block_reduce.cuh"
#include "jetspec/primitives/block_scan.cuh"
#include "jetspec/primitives/radix_select.cuh"

namespace jetspec {

constexpr int kTopnThreads = 256;
constexpr int kTopnWindow = 8;  // children per node examined per step
constexpr long long kNoKey = 0x7fffffffffffffffLL;

// Nodes of the implicit tree that fit the budget: min(budget, 1 + K + ... + K^D).
__device__ __forceinline__ int tree_node_target(int budget, int depth, int k) {
  long long total = 1, level = 1;
  for (int d = 0; d < depth && total < budget; ++d) {
    level *= k;
    total += level;
  }
  return static_cast<int>(total < budget ? total : budget);
}

// One tree's output rows (tokens, parents, depths, scores; padding past `count`) and its
// ancestor mask, written by `nthreads` threads. Parents precede children (parent[j] < j).
__device__ __forceinline__ void write_tree(const BuildTreeParams& p, int b, int count,
                                           const float* score, const int16_t* parent,
                                           const int16_t* depth, const uint8_t* rank,
                                           int nthreads) {
  const int cap = p.budget, K = p.k;
  const int32_t* tk = p.topk_tokens + static_cast<int64_t>(b) * p.depth * K;
  const int64_t row0 = static_cast<int64_t>(b) * cap;
  for (int j = threadIdx.x; j < cap; j += nthreads) {
    const bool real = j < count;
    const int d = real ? depth[j] : -1;
    p.tokens[row0 + j] = !real ? 0 : d == 0 ? p.root_tokens[b] : tk[(d - 1) * K + rank[j]];
    p.parents[row0 + j] = real ? parent[j] : -1;
    p.depths[row0 + j] = d;
    p.scores[row0 + j] = real ? score[j] : -INFINITY;
  }
  if (threadIdx.x == 0) p.num_nodes[b] = count;
  // One ancestor walk per row: ancestors have smaller indices, so the walk visits the row's
  // words from its own down to word 0, each once.
  const int words = p.words;
  for (int j = threadIdx.x; j < cap; j += nthreads) {
    int32_t* row = p.mask + (row0 + j) * words;
    const int own = j / 32;
    for (int w = words - 1; w > own; --w) row[w] = 0;
    if (j >= count) {  // padding row: its own bit only
      row[own] = static_cast<int32_t>(1u << (j % 32));
      for (int w = own - 1; w >= 0; --w) row[w] = 0;
      continue;
    }
    uint32_t bits = 0;
    int cur = own;
    for (int a = j; a >= 0; a = parent[a]) {
      for (; cur > a / 32; --cur) {
        row[cur] = static_cast<int32_t>(bits);
        bits = 0;
      }
      bits |= 1u << (a % 32);
    }
    for (; cur >= 0; --cur) {  // the walk ends at the root (word 0)
      row[cur] = static_cast<int32_t>(bits);
      bits = 0;
    }
  }
}

// ---- topn -------------------------------------------------------------------------------------

struct TopnNodes {
  float* score;
  int16_t *depth, *parent;
  uint8_t *rank, *taken;
};

// topn's dynamic shared memory for a budget of `cap` nodes: two node layouts (score, depth,
// parent, rank, children taken so far) plus the per-step scratch (exclusive count of new
// children, new position of the first child, new position, children taken this step). Carved
// floats, then int32, int16, bytes, so each group stays aligned.
struct TopnSmem {
  TopnNodes a, b;        // two layouts (no array: a dynamic index would put them on the stack)
  int32_t* excl;         // new children before slot s
  int16_t *child0;       // new position of slot s's first child
  int16_t *newpos;       // new position of the node at slot s
  uint8_t* cnt;          // children taken from slot s's window this step

  static constexpr size_t kNodeBytes = 2 * sizeof(float) + sizeof(int32_t) + 6 * sizeof(int16_t) +
                                       5 * sizeof(uint8_t);
  static size_t bytes(int cap) { return static_cast<size_t>(cap) * kNodeBytes + 16; }

  __device__ __forceinline__ static TopnSmem carve(unsigned char* raw, int cap) {
    TopnSmem m;
    float* f32 = reinterpret_cast<float*>(raw);
    m.a.score = f32;
    m.b.score = f32 + cap;
    m.excl = reinterpret_cast<int32_t*>(f32 + 2 * cap);
    int16_t* i16 = reinterpret_cast<int16_t*>(m.excl + cap);
    m.a.depth = i16;
    m.a.parent = i16 + cap;
    m.b.depth = i16 + 2 * cap;
    m.b.parent = i16 + 3 * cap;
    m.child0 = i16 + 4 * cap;
    m.newpos = i16 + 5 * cap;
    uint8_t* u8 = reinterpret_cast<uint8_t*>(i16 + 6 * cap);
    m.a.rank = u8;
    m.a.taken = u8 + cap;
    m.b.rank = u8 + 2 * cap;
    m.b.taken = u8 + 3 * cap;
    m.cnt = u8 + 4 * cap;
    return m;
  }
};

// The topn key of a candidate child (DESIGN.md 4a; triton/build_tree.py: _q, _topn_key,
// _topn_key_q_depth, _q_depth_key):
//   q(score) << 30 | depth << 18 | parent position << 6 | rank
// q is the 31-bit magnitude of the (<= 0) score; depth and position take 12 bits (budget <=
// kMaxBudget), the rank 6 (K <= kMaxTopk). The smallest key is the spec's next node. Its top
// part (q, depth) compares with q_depth(), a bound on any child of a node.
struct TopnKey {
  static constexpr int kQShift = 30, kDepthShift = 18, kPosShift = 6, kDepthBits = 12;
  static constexpr int kMaxDepthField = (1 << kDepthBits) - 1;
  static_assert(kMaxBudget <= (1 << kDepthBits) && kMaxTopk <= (1 << kPosShift),
                "the topn key's position and rank fields");

  __device__ __forceinline__ static long long q(float score) {
    return static_cast<long long>(__float_as_int(score) & 0x7fffffff);
  }
  __device__ __forceinline__ static long long encode(float score, int depth, int pos, int rank) {
    return (q(score) << kQShift) | (static_cast<long long>(depth) << kDepthShift) |
           (static_cast<long long>(pos) << kPosShift) | rank;
  }
  // The (q, depth) part of a key, comparable with q_depth(score, depth).
  __device__ __forceinline__ static long long q_depth_of(long long key) {
    return key >> kDepthShift;
  }
  // Depth clamped to its 12 bits: d reaches 4096 only for a 4095-deep chain, where clamping
  // keeps the bound a lower bound (and nothing deeper fits the 4096-node cap anyway).
  __device__ __forceinline__ static long long q_depth(float score, int depth) {
    return (q(score) << kDepthBits) | min(depth, kMaxDepthField);
  }
};

// The k-th smallest (1-based) of the keys `key_at(s, i)`, i < cnt[s], over slots s < n (distinct,
// non-negative): a radix select over the bits below the highest one in which the smallest and
// largest key differ (as the k-th largest of those bits complemented). About 7 passes for keys
// that differ in the score, instead of the ~25-55 rounds of a bisection.
template <typename KeyAt>
__device__ __forceinline__ long long kth_key(KeyAt key_at, const uint8_t* cnt, int n, long long k,
                                             long long* red, RadixSelectSmem<false>& select) {
  auto visit = [&](auto fn) {
    for (int s = threadIdx.x; s < n; s += kTopnThreads)
      for (int i = 0; i < cnt[s]; ++i) fn(key_at(s, i));
  };
  long long lo = kNoKey, hi = -1;
  visit([&](long long v) {
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  });
  lo = block_reduce<kTopnThreads>(lo, MinOp(), red);
  hi = block_reduce<kTopnThreads>(hi, MaxOp(), red);
  if (lo == hi) return lo;
  const int nbits = 64 - __clzll(lo ^ hi);  // every key shares the bits above these
  const unsigned long long low = (1ull << nbits) - 1;
  const RadixSelected<unsigned long long> c = radix_select<kTopnThreads, false, unsigned long long>(
      [&](auto add) { visit([&](long long v) { add(~static_cast<unsigned long long>(v) & low, 0ull); }); },
      nbits, false, static_cast<unsigned long long>(k), select);
  return (lo & ~static_cast<long long>(low)) | static_cast<long long>(~c.key & low);
}

__global__ void __launch_bounds__(kTopnThreads) build_tree_topn_kernel(BuildTreeParams p) {
  pdl_begin();
  JETSPEC_DYNAMIC_SMEM(smem_raw);
  __shared__ long long red[kTopnThreads / 32];
  __shared__ long long red3[3 * kTopnThreads / 32];
  __shared__ RadixSelectSmem<false> select;  // kth_key
  const int cap = p.budget, D = p.depth, K = p.k, b = blockIdx.x, tid = threadIdx.x;
  const float* lp = p.topk_logprobs + static_cast<int64_t>(b) * D * K;

  const TopnSmem sm = TopnSmem::carve(smem_raw, cap);
  const TopnNodes na = sm.a, nb = sm.b;
  int32_t* excl = sm.excl;
  int16_t *child0 = sm.child0, *newpos = sm.newpos;
  uint8_t* cnt = sm.cnt;

  const int target = tree_node_target(cap, D, K);
  const int window = K < kTopnWindow ? K : kTopnWindow;
  if (tid == 0) {
    na.score[0] = 0.f;
    na.depth[0] = 0;
    na.parent[0] = -1;
    na.rank[0] = 0;
    na.taken[0] = 0;
  }
  __syncthreads();

  int cur = 0, n = 1, steps = 0;
  while (n < target) {
    ++steps;
    const TopnNodes t = cur ? nb : na, u = cur ? na : nb;
    // The window of slot s: children taken[s] .. taken[s] + window - 1 (ranks < K). Its keys
    // increase with the rank, so its first entry is its minimum.
    auto key_at = [=](int s, int i) {
      const int r = t.taken[s] + i;
      return TopnKey::encode(__fadd_rn(t.score[s], lp[t.depth[s] * K + r]), t.depth[s] + 1, s, r);
    };
    long long heap_min = kNoKey, best_child = kNoKey, hidden = kNoKey;
    for (int s = tid; s < n; s += kTopnThreads) {
      const int d = t.depth[s], c = t.taken[s];
      if (d >= D || c >= K) continue;
      const long long k0 = key_at(s, 0);
      heap_min = k0 < heap_min ? k0 : heap_min;
      if (d + 1 < D) {  // bound 1: the best child any window entry can have (q | depth only)
        const float c0 = __fadd_rn(t.score[s], lp[d * K + c]);
        const long long bk = TopnKey::q_depth(__fadd_rn(c0, lp[(d + 1) * K]), d + 2);
        best_child = bk < best_child ? bk : best_child;
      }
      if (c + window < K) {  // bound 2: the first child hidden behind the window (full key)
        const long long hk = key_at(s, window);
        hidden = hk < hidden ? hk : hidden;
      }
    }
    long long bounds[3] = {heap_min, best_child, hidden};
    block_reduce_n<kTopnThreads>(bounds, MinOp(), red3);
    heap_min = bounds[0];
    best_child = bounds[1];
    hidden = bounds[2];

    // Taken entries form a prefix of every window (the test is monotone in the key). The heap
    // minimum passes both bounds anyway (tests/tree_steps_model.py asserts it); naming it keeps
    // every step's progress independent of that argument.
    long long m = 0;
    for (int s = tid; s < n; s += kTopnThreads) {
      const int d = t.depth[s], c = t.taken[s];
      int take = 0;
      if (d < D) {
        for (int i = 0; i < window && c + i < K; ++i) {
          const long long key = key_at(s, i);
          if (!(key == heap_min || (TopnKey::q_depth_of(key) < best_child && key < hidden))) break;
          ++take;
        }
      }
      cnt[s] = static_cast<uint8_t>(take);
      m += take;
    }
    m = block_reduce<kTopnThreads>(m, SumOp(), red);
    if (m > target - n) {  // the last step: keep the (target - n) smallest
      m = target - n;
      const long long last = kth_key(key_at, cnt, n, m, red, select);
      for (int s = tid; s < n; s += kTopnThreads) {
        int take = 0;
        while (take < cnt[s] && key_at(s, take) <= last) ++take;
        cnt[s] = static_cast<uint8_t>(take);
      }
      __syncthreads();
    }

    // New layout. Slot s's first child moves to 1 + (children of the slots before s, old and
    // new); an old node moves by the new children of the slots before its parent.
    const int per = (n + kTopnThreads - 1) / kTopnThreads;
    const int s0 = tid * per < n ? tid * per : n, s1 = s0 + per < n ? s0 + per : n;
    long long local = 0;
    for (int s = s0; s < s1; ++s)
      local += (static_cast<long long>(t.taken[s] + cnt[s]) << 32) | cnt[s];
    long long run = block_exclusive_scan(local, red);
    for (int s = s0; s < s1; ++s) {
      excl[s] = static_cast<int32_t>(run & 0xffffffff);
      child0[s] = static_cast<int16_t>(1 + (run >> 32));
      run += (static_cast<long long>(t.taken[s] + cnt[s]) << 32) | cnt[s];
    }
    __syncthreads();
    for (int s = tid; s < n; s += kTopnThreads)
      newpos[s] = static_cast<int16_t>(s == 0 ? 0 : s + excl[t.parent[s]]);
    __syncthreads();
    for (int s = tid; s < n; s += kTopnThreads) {
      const int np = newpos[s], d = t.depth[s], c = t.taken[s];
      u.score[np] = t.score[s];
      u.depth[np] = static_cast<int16_t>(d);
      u.parent[np] = t.parent[s] < 0 ? static_cast<int16_t>(-1) : newpos[t.parent[s]];
      u.rank[np] = t.rank[s];
      u.taken[np] = static_cast<uint8_t>(c + cnt[s]);
      for (int i = 0; i < cnt[s]; ++i) {
        const int r = c + i, dst = child0[s] + r;
        u.score[dst] = __fadd_rn(t.score[s], lp[d * K + r]);
        u.depth[dst] = static_cast<int16_t>(d + 1);
        u.parent[dst] = static_cast<int16_t>(np);
        u.rank[dst] = static_cast<uint8_t>(r);
        u.taken[dst] = 0;
      }
    }
    __syncthreads();
    cur ^= 1;
    n += static_cast<int>(m);
  }
  // Before write_tree: a count kept live across it made sm_80 ptxas spill (32 registers).
  if (tid == 0 && p.steps != nullptr) p.steps[b] = steps;
  const TopnNodes t = cur ? nb : na;
  write_tree(p, b, n, t.score, t.parent, t.depth, t.rank, kTopnThreads);
}

// ---- accum_logp -------------------------------------------------------------------------------

// Shared memory per node: score, parent, depth (int16), rank and "still in the heap" (uint8).
inline size_t accum_smem_bytes(int budget) { return static_cast<size_t>(budget) * 10 + 16; }

// A heap entry: higher score first, ties to the earlier inserted slot; slot -1 is "none".
struct HeapEntry {
  float score;
  int slot;
};

__device__ __forceinline__ bool heap_before(const HeapEntry& x, const HeapEntry& y) {
  if (y.slot < 0) return x.slot >= 0;
  if (x.slot < 0) return false;
  if (x.score != y.score) return x.score > y.score;
  return x.slot < y.slot;
}

__global__ void __launch_bounds__(32) build_tree_accum_kernel(BuildTreeParams p) {
  pdl_begin();
  JETSPEC_DYNAMIC_SMEM(smem_raw);
  const int cap = p.budget, D = p.depth, K = p.k, b = blockIdx.x, lane = threadIdx.x;
  float* score = reinterpret_cast<float*>(smem_raw);
  int16_t* parent = reinterpret_cast<int16_t*>(score + cap);
  int16_t* depth = parent + cap;
  uint8_t* rank = reinterpret_cast<uint8_t*>(depth + cap);
  uint8_t* in_heap = rank + cap;
  const float* lp = p.topk_logprobs + static_cast<int64_t>(b) * D * K;

  if (lane == 0) {
    score[0] = 0.f;
    parent[0] = -1;
    depth[0] = 0;
    rank[0] = 0;
    in_heap[0] = 1;
  }
  __syncwarp();

  int count = 1;
  auto entry = [&](int s) {
    return s < count && in_heap[s] ? HeapEntry{score[s], s} : HeapEntry{-INFINITY, -1};
  };
  auto rescan = [&]() {  // the best of this lane's slots (s % 32 == lane)
    HeapEntry best{-INFINITY, -1};
    for (int s = lane; s < count; s += 32)
      if (heap_before(entry(s), best)) best = entry(s);
    return best;
  };

  HeapEntry mine = rescan();
  while (count < cap) {
    __syncwarp();  // the last step's writes before anyone reads them
    HeapEntry win = mine;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const HeapEntry other{__shfl_xor_sync(0xffffffffu, win.score, o),
                            __shfl_xor_sync(0xffffffffu, win.slot, o)};
      if (heap_before(other, win)) win = other;
    }
    if (win.slot < 0) break;  // heap exhausted
    const int ps = win.slot;
    if (lane == 0) in_heap[ps] = 0;  // popped
    __syncwarp();
    if ((ps & 31) == lane) mine = rescan();
    const int d = depth[ps];
    if (d == D) continue;  // a leaf at the maximum depth has no children
    const int m = min(K, cap - count);
    const float base = score[ps];
    for (int r = lane; r < m; r += 32) {
      const int n = count + r;
      score[n] = __fadd_rn(base, lp[d * K + r]);
      parent[n] = static_cast<int16_t>(ps);
      depth[n] = static_cast<int16_t>(d + 1);
      rank[n] = static_cast<uint8_t>(r);
      in_heap[n] = 1;
    }
    __syncwarp();
    const int first = count;
    count += m;
    // Node n belongs to lane n % 32 (the lane that rescans it once it is popped).
    for (int n = first + ((lane - first) & 31); n < count; n += 32)
      if (heap_before(entry(n), mine)) mine = entry(n);
  }
  __syncwarp();
  write_tree(p, b, count, score, parent, depth, rank, 32);
}

inline Status build_tree(const BuildTreeParams& p, cudaStream_t stream) {
  JETSPEC_RETURN_IF_FAILED(check_range("batch", p.batch, 0));
  if (p.batch == 0) return cudaSuccess;
  // Keys pack the parent position in 12 bits and the rank in 6: budget <= 4096, K <= 64.
  JETSPEC_RETURN_IF_FAILED(check_range("budget", p.budget, 1, kMaxBudget));
  JETSPEC_RETURN_IF_FAILED(check_range("k", p.k, 1, kMaxTopk));
  JETSPEC_RETURN_IF_FAILED(check_range("depth", p.depth, 1));
  if (p.words != ceil_div(p.budget, 32))
    return bad_input("words ", p.words, " is not ceil(budget / 32) = ", ceil_div(p.budget, 32));
  if (p.algorithm != kTreeTopn && p.algorithm != kTreeAccumLogp)
    return bad_input("algorithm ", p.algorithm, " is not 0 (topn) or 1 (accum_logp)");
  const bool topn = p.algorithm == kTreeTopn;
  const size_t smem = topn ? TopnSmem::bytes(p.budget) : accum_smem_bytes(p.budget);
  if (smem > kSmemWithoutOptIn) {
    JETSPEC_RETURN_IF_FAILED(cuda_context(
        cudaFuncSetAttribute(topn ? build_tree_topn_kernel : build_tree_accum_kernel,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
        cat("cudaFuncSetAttribute(max dynamic shared memory ", smem, " bytes)")));
  }
  if (topn) {
    JETSPEC_LAUNCH(build_tree_topn_kernel, p.batch, kTopnThreads, smem, stream, p);
  } else {
    JETSPEC_LAUNCH(build_tree_accum_kernel, p.batch, 32, smem, stream, p);
  }
  return cudaGetLastError();
}

}  // namespace jetspec
