// Draft tree selection from per-depth top-K, one warp-sized CTA per sequence, bit-exact with
// python_ref/tree.py (float32 scores summed left to right, the same tie rules).
//
// Every selected node owns one "slot". topn: the slot holds the node's best unselected child,
// which is the child of rank next[s], because log-probs are sorted descending and equal scores
// go to the smaller rank; so the best candidate of the whole frontier is the best slot, and one
// warp argmax per new node reproduces python_ref's best-first search. accum_logp: the slot is
// the node itself while it is still in JetSpec's heap. Each lane caches the best of its own
// slots and rescans only when one of them gets worse.
#pragma once
#include "jetspec/common.cuh"

namespace jetspec {

constexpr int kTreeTopn = 0;
constexpr int kTreeAccumLogp = 1;


// Shared memory per node: score, parent, depth, first child, next sibling, last child,
// new->old and old->new order (int16 each, budget <= 32767), rank and next (uint8, K <= 255).
inline size_t build_tree_smem_bytes(int budget) { return static_cast<size_t>(budget) * 20; }

struct TreeSmem {
  float* score;
  int16_t *parent, *depth, *first_child, *next_sib, *last_child, *new2old, *old2new;
  uint8_t *rank, *next;
};

// A candidate: the child of rank next[slot] (topn) or the node `slot` itself (accum_logp).
struct Cand {
  float score;
  int depth;
  int slot;  // -1: none
};

// topn order: higher score, then lower depth, then the smaller rank sequence. Both candidates
// are children at the same depth of distinct parents a, b: compare the parents' rank sequences
// where their ancestor chains meet.
__device__ __forceinline__ bool topn_before(const Cand& x, const Cand& y, const TreeSmem& t) {
  if (y.slot < 0) return x.slot >= 0;
  if (x.slot < 0) return false;
  if (x.score != y.score) return x.score > y.score;
  if (x.depth != y.depth) return x.depth < y.depth;
  int a = x.slot, b = y.slot;
  while (t.parent[a] != t.parent[b]) {
    a = t.parent[a];
    b = t.parent[b];
  }
  return t.rank[a] < t.rank[b];
}

// accum_logp order (JetSpec's heap): higher score, ties to the earlier inserted node.
__device__ __forceinline__ bool heap_before(const Cand& x, const Cand& y) {
  if (y.slot < 0) return x.slot >= 0;
  if (x.slot < 0) return false;
  if (x.score != y.score) return x.score > y.score;
  return x.slot < y.slot;
}

__device__ __forceinline__ Cand shfl_cand(const Cand& c, int o) {
  return Cand{__shfl_xor_sync(0xffffffffu, c.score, o), __shfl_xor_sync(0xffffffffu, c.depth, o),
              __shfl_xor_sync(0xffffffffu, c.slot, o)};
}

__global__ void __launch_bounds__(32) build_tree_kernel(BuildTreeParams p) {
  JETSPEC_DYNAMIC_SMEM(smem_raw);
  const int cap = p.budget;
  TreeSmem t;
  t.score = reinterpret_cast<float*>(smem_raw);
  int16_t* s16 = reinterpret_cast<int16_t*>(t.score + cap);
  t.parent = s16;
  t.depth = s16 + cap;
  t.first_child = s16 + 2 * cap;
  t.next_sib = s16 + 3 * cap;
  t.last_child = s16 + 4 * cap;
  t.new2old = s16 + 5 * cap;
  t.old2new = s16 + 6 * cap;
  t.rank = reinterpret_cast<uint8_t*>(s16 + 7 * cap);
  t.next = t.rank + cap;

  const int b = blockIdx.x, lane = threadIdx.x;
  const int D = p.depth, K = p.k;
  const float* lp = p.topk_logprobs + static_cast<int64_t>(b) * D * K;
  const int32_t* tk = p.topk_tokens + static_cast<int64_t>(b) * D * K;
  const bool topn = p.algorithm == kTreeTopn;

  if (lane == 0) {
    t.score[0] = 0.f;
    t.parent[0] = -1;
    t.depth[0] = 0;
    t.rank[0] = 0;
    t.next[0] = topn ? 0 : 1;  // accum_logp: 1 = still in the heap
    t.first_child[0] = t.next_sib[0] = t.last_child[0] = -1;
  }
  __syncwarp();

  int count = 1;
  auto cand_of = [&](int s) -> Cand {
    if (topn) {
      if (s >= count || t.depth[s] >= D || t.next[s] >= K) return Cand{-INFINITY, 0, -1};
      const int d = t.depth[s];
      return Cand{__fadd_rn(t.score[s], lp[d * K + t.next[s]]), d + 1, s};
    }
    if (s >= count || t.next[s] == 0) return Cand{-INFINITY, 0, -1};
    return Cand{t.score[s], t.depth[s], s};
  };
  auto before = [&](const Cand& x, const Cand& y) {
    return topn ? topn_before(x, y, t) : heap_before(x, y);
  };
  auto rescan = [&]() {
    Cand best{-INFINITY, 0, -1};
    for (int s = lane; s < count; s += 32) {
      const Cand c = cand_of(s);
      if (before(c, best)) best = c;
    }
    return best;
  };

  Cand mine = rescan();
  while (count < cap) {
    __syncwarp();  // lane 0's writes of the last step before anyone reads them
    Cand win = mine;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const Cand other = shfl_cand(win, o);
      if (before(other, win)) win = other;
    }
    if (win.slot < 0) break;  // frontier (or heap) exhausted
    const int ps = win.slot;
    if (topn) {
      const int n = count;
      if (lane == 0) {
        const int r = t.next[ps];
        t.score[n] = win.score;
        t.parent[n] = static_cast<int16_t>(ps);
        t.depth[n] = static_cast<int16_t>(win.depth);
        t.rank[n] = static_cast<uint8_t>(r);
        t.next[n] = 0;
        t.first_child[n] = t.next_sib[n] = t.last_child[n] = -1;
        if (t.first_child[ps] < 0) {
          t.first_child[ps] = static_cast<int16_t>(n);
        } else {
          t.next_sib[t.last_child[ps]] = static_cast<int16_t>(n);
        }
        t.last_child[ps] = static_cast<int16_t>(n);
        t.next[ps] = static_cast<uint8_t>(r + 1);
      }
      __syncwarp();
      count = n + 1;
      if ((ps & 31) == lane) {
        mine = rescan();  // the parent's slot moved on to its next child
      }
      if ((n & 31) == lane) {
        const Cand c = cand_of(n);
        if (before(c, mine)) mine = c;
      }
    } else {
      if (lane == 0) t.next[ps] = 0;  // popped
      __syncwarp();
      if ((ps & 31) == lane) mine = rescan();
      const int d = t.depth[ps];
      if (d == D) continue;  // a leaf at the maximum depth has no children
      const int m = min(K, cap - count);
      const float base = t.score[ps];
      for (int r = lane; r < m; r += 32) {
        const int n = count + r;
        t.score[n] = __fadd_rn(base, lp[d * K + r]);
        t.parent[n] = static_cast<int16_t>(ps);
        t.depth[n] = static_cast<int16_t>(d + 1);
        t.rank[n] = static_cast<uint8_t>(r);
        t.next[n] = 1;
      }
      __syncwarp();
      const int first = count;
      count += m;
      // Node n belongs to lane n % 32 (the lane that rescans it once it is popped).
      for (int n = first + ((lane - first) & 31); n < count; n += 32) {
        const Cand c = cand_of(n);
        if (before(c, mine)) mine = c;
      }
    }
  }

  // Output order. topn: breadth first, children in rank order, i.e. (depth, parent, rank);
  // accum_logp: insertion order.
  if (topn) {
    if (lane == 0) {
      t.new2old[0] = 0;
      int tail = 1;
      for (int head = 0; head < tail; ++head) {
        for (int c = t.first_child[t.new2old[head]]; c >= 0; c = t.next_sib[c]) {
          t.new2old[tail++] = static_cast<int16_t>(c);
        }
      }
    }
    __syncwarp();
  } else {
    for (int j = lane; j < count; j += 32) t.new2old[j] = static_cast<int16_t>(j);
    __syncwarp();
  }
  for (int j = lane; j < count; j += 32) t.old2new[t.new2old[j]] = static_cast<int16_t>(j);
  __syncwarp();
  // Parent in output order, kept in first_child (no longer needed).
  for (int j = lane; j < count; j += 32) {
    const int o = t.new2old[j];
    t.first_child[j] = t.parent[o] < 0 ? static_cast<int16_t>(-1) : t.old2new[t.parent[o]];
  }
  __syncwarp();

  const int64_t row0 = static_cast<int64_t>(b) * cap;
  for (int j = lane; j < cap; j += 32) {
    if (j < count) {
      const int o = t.new2old[j];
      const int d = t.depth[o];
      p.tokens[row0 + j] = d == 0 ? p.root_tokens[b] : tk[(d - 1) * K + t.rank[o]];
      p.parents[row0 + j] = t.first_child[j];
      p.depths[row0 + j] = d;
      p.scores[row0 + j] = t.score[o];
    } else {
      p.tokens[row0 + j] = 0;
      p.parents[row0 + j] = -1;
      p.depths[row0 + j] = -1;
      p.scores[row0 + j] = -INFINITY;
    }
  }
  if (lane == 0) p.num_nodes[b] = count;
  // Mask words: one ancestor walk per row (a lane per row). Ancestors have smaller output
  // indices, so the walk visits the row's words from its own down to word 0, each once.
  const int words = p.words;
  for (int j = lane; j < cap; j += 32) {
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
    for (int a = j; a >= 0; a = t.first_child[a]) {
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

inline cudaError_t build_tree(const BuildTreeParams& p, cudaStream_t stream) {
  if (p.batch == 0) return cudaSuccess;
  if (p.budget < 1 || p.budget > 32767 || p.k < 1 || p.k > 255 || p.depth < 1)
    return cudaErrorInvalidValue;
  const size_t smem = build_tree_smem_bytes(p.budget);
  if (smem > 48 * 1024) {
    JETSPEC_RETURN_IF_ERROR(cudaFuncSetAttribute(
        build_tree_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  }
  JETSPEC_LAUNCH(build_tree_kernel, p.batch, 32, smem, stream, p);
  return cudaGetLastError();
}

}  // namespace jetspec
