// Plain parameter structs shared by the kernels (*.cuh) and the C++ bindings: no CUDA syntax,
// so bindings.cpp can fill them without nvcc. Pointers are device pointers; strides are in
// elements; index tensors are int32 unless noted.
#pragma once
#include <cstdint>

#include "jetspec/limits.h"

namespace jetspec {

// Strides (in elements) of a 4-d tensor such as q [B, N, H, D] or a cache [B|P, L|page, H, D];
// the last dimension is contiguous (checked by the ops layer).
struct Strides4 {
  int64_t s0, s1, s2;
};

// qk_norm_rope_append (rope.cuh).
struct RopeParams {
  const void* q;
  const void* k;
  const void* v;
  const float* q_norm_w;   // [Dh] fp32
  const float* k_norm_w;   // [Dh] fp32
  const int32_t* positions;  // [B, N] contiguous
  const int32_t* cache_start;  // [B] or null (then slot = position)
  void* q_out;             // [B, N, Hq, Dh] contiguous
  void* k_cache;
  void* v_cache;
  const int32_t* block_table;  // [B, max_pages] or null
  Strides4 sq, sk, sv;         // q, k, v
  Strides4 sc, svc;            // k_cache, v_cache (same shape, possibly different strides)
  int64_t bt_stride;
  int batch, n, hq, hkv, dh, page_size;
  double theta;  // as python_ref: inv_freq = theta ** (-2i/dh) in double, rounded to float once
  float eps;
};

// verify_tree, phase 0 (top-k / top-p only): per node, the last token the filters keep, as a
// threshold: token v is kept iff x > thr_x or (x == thr_x and v <= thr_id), x = logit / T (verify.cuh).
struct SampleFilterParams {
  const void* logits;         // [B, N, V]
  int64_t s0, s1;             // strides of dims 0 and 1 (dim 2 contiguous)
  const int32_t* num_nodes;   // [B]
  const float* temperature;   // [B]; <= 0: greedy sequence (kept: everything)
  const int32_t* top_k;       // [B] or null; 0 < k < V is on
  const float* top_p;         // [B] or null; < 1 is on
  float* thr_x;               // [B * N]
  int32_t* thr_id;            // [B * N]
  int batch, n, vocab;
  int vec;                    // 1: rows are 16-byte aligned (vector loads)
};

// verify_tree, phase 1: per (node, vocab split) the best target logit (verify.cuh).
struct TargetTokenParams {
  const void* logits;       // [B, N, V]
  int64_t s0, s1;           // strides of dims 0 and 1 (dim 2 contiguous)
  const int32_t* num_nodes; // [B]
  const int64_t* seed;      // [B] or null (greedy)
  const int64_t* offset;    // [B] or null
  float* part_v;            // [B * N, splits]: best (Gumbel-perturbed when sampling) value
  int32_t* part_i;          // [B * N, splits]: its token
  int batch, n, vocab;
  int splits, split_len;    // split s covers tokens [s * split_len, (s + 1) * split_len)
  int vec;                  // 1: rows and split starts are 16-byte aligned (vector loads)
  const float* temperature; // [B] or null (all greedy); <= 0: that sequence is greedy
  const float* thr_x;       // [B * N] or null (no filter): phase 0's thresholds
  const int32_t* thr_id;    // [B * N]
};

// verify_tree, phase 2: the acceptance walk (verify.cuh).
struct VerifyWalkParams {
  const int32_t* tokens;     // [B, N] contiguous
  const int32_t* parents;    // [B, N] contiguous
  const int32_t* num_nodes;  // [B]
  const int32_t* target;     // [B, N] target token per node (row stride target_stride), or null:
  int64_t target_stride;
  const float* part_v;       // then the node's target is the best of its phase-1 splits
  const int32_t* part_i;
  int splits;
  int32_t* accept_len;       // [B]
  int32_t* path;             // [B, C]
  int32_t* bonus;            // [B]
  int32_t* emitted;          // [B, C]
  int batch, n, cols;        // cols = max_depth + 1
};

// commit_kv (commit.cuh).
struct CommitParams {
  void* k_cache;
  void* v_cache;
  Strides4 sk, sv;
  const int32_t* block_table;  // [B, max_pages] or null
  int64_t bt_stride;
  const int32_t* prefix_lens;  // [B]
  const int32_t* path;         // [B, C] contiguous
  const int32_t* accept_len;   // [B]
  int32_t* new_prefix_lens;    // [B]
  const void* hidden;          // [B, N, Hh] or null
  int64_t sh0, sh1;            // hidden strides of dims 0, 1
  void* hidden_rows;           // [B, C, Hh] contiguous or null
  int batch, cols, hkv, dh, page_size, hidden_dim;
};

// log_softmax_topk (topk.cuh).
struct TopkParams {
  const void* logits;   // [B, D, V], dim 2 contiguous
  int64_t s0, s1;
  int32_t* tokens;      // [B, D, K] contiguous
  float* logprobs;      // [B, D, K] contiguous
  void* workspace;      // log_softmax_topk_workspace_bytes
  int batch, depth, vocab, k;
};

// hidden_topk (hidden_topk.cuh): top-K of log_softmax(hidden @ weight^T) per (b, d) row.
struct HiddenTopkParams {
  const void* hidden;   // [B, D, H], dim 2 contiguous
  int64_t sh0, sh1;
  const void* weight;   // [V, H], dim 1 contiguous
  int64_t sw0;
  int32_t* tokens;      // [B, D, K] contiguous
  float* logprobs;      // [B, D, K] contiguous
  void* workspace;      // hidden_topk_workspace_bytes
  int batch, depth, hidden_dim, vocab, k;
};

// build_tree (build_tree.cuh); algorithm: 0 topn, 1 accum_logp.
struct BuildTreeParams {
  const int32_t* topk_tokens;    // [B, D, K] contiguous
  const float* topk_logprobs;    // [B, D, K] contiguous, sorted descending along K
  const int32_t* root_tokens;    // [B]
  int32_t* tokens;               // [B, N]
  int32_t* parents;              // [B, N]
  int32_t* depths;               // [B, N]
  float* scores;                 // [B, N]
  int32_t* num_nodes;            // [B]
  int32_t* mask;                 // [B, N, W]
  int32_t* steps;                // [B] or null: selection steps taken (topn; tests)
  int batch, depth, k, budget, words, algorithm;
};

// tree_attention (attention.cuh); tail: 0 packed mask, 1 causal, 2 full.
struct AttnParams {
  const void* q;             // [B, N, Hq, D]
  Strides4 sq;
  const void* k_cache;       // [B, L, Hkv, D] or [P, page, Hkv, D]
  const void* v_cache;
  Strides4 sk, sv;
  const int32_t* block_table;  // [B, max_pages] or null
  int64_t bt_stride;
  int page_size;               // paged: rows per page; contiguous: L
  int cache_outer;             // extent of the cache's dim 0 (B, or the number of pages)
  const int32_t* prefix_lens;  // [B]
  const int32_t* tree_mask;    // [B, N, W] or null
  int64_t sm0, sm1;            // mask strides of dims 0, 1 (dim 2 contiguous)
  int tail;                    // AttnTail
  void* out;                   // [B, N, Hq, D]
  Strides4 so;
  float* lse;                  // [B, Hq, N] contiguous, or null
  float* part_o;               // [splits, B, Hq, N, D] when splits > 1
  float* part_lse;             // [splits, B, Hq, N]
  int batch, n, hq, hkv, group, splits;
  float scale_log2;            // softmax scale * log2(e)
  int kernel;                  // AttnKernel
};

}  // namespace jetspec
