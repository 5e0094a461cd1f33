// Each launcher's arguments, declared once. JETSPEC_<OP>_FIELDS(X) calls X(type, name) for every
// argument of _C.<op> in the order of the Python call; the <Op>Params struct below is generated
// from it (JETSPEC_MEMBER), and bindings.cpp generates the Python argument parser from the same
// list (the C++ type says how a Python value converts: a pointer from an int, int from an int
// that fits int32, Flag from a bool, Strides4 from a list of three ints). Every launcher also takes
// `stream` (after the fields; optional fields come last). No CUDA syntax here, so bindings.cpp
// can fill the structs without nvcc. Pointers are device pointers (0 = absent where allowed);
// strides are in elements; index tensors are int32 unless noted; dtype codes are DType values.
#pragma once
#include <cstdint>

#include "jetspec/limits.h"

namespace jetspec {

// Strides (in elements) of dims 0..2 of a 4-d tensor such as q [B, N, H, D] or a cache
// [B|P, L|page, H, D]: batch (or page of a paged cache), row (token, or slot in the page), head;
// the last dimension is contiguous (checked by the ops layer).
struct Strides4 {
  int64_t batch, row, head;
};

// A Python bool, kept as a 32-bit int in the structs (a bool member costs sample_filter_kernel
// registers on sm_90a; docs/kernels.md, "Shared CUDA primitives").
enum Flag : int32_t { kFalse = 0, kTrue = 1 };

#define JETSPEC_MEMBER(type, name) type name;

// pack_mask (pack_mask.cuh).
#define JETSPEC_PACK_MASK_FIELDS(X)                                                         \
  X(const int32_t*, parents)      /* [B, N] contiguous */                                   \
  X(const int32_t*, num_nodes)    /* [B] */                                                 \
  X(int32_t*, mask)               /* [B, N, W] contiguous */                                \
  X(int, batch)                                                                             \
  X(int, n)                                                                                 \
  X(int, words)                   /* W = ceil(N / 32) */
struct PackMaskParams {
  JETSPEC_PACK_MASK_FIELDS(JETSPEC_MEMBER)
};

// qk_norm_rope_append (qk_norm_rope_append.cuh). A null q (with q_out and q_norm_w null) appends
// K/V only.
#define JETSPEC_QK_NORM_ROPE_APPEND_FIELDS(X)                                               \
  X(const void*, q)                                                                         \
  X(const void*, k)                                                                         \
  X(const void*, v)                                                                         \
  X(const float*, q_norm_w)       /* [Dh] fp32; null with k_norm_w null: no norm */         \
  X(const float*, k_norm_w)       /* [Dh] fp32 or null (no QK-norm) */                      \
  X(const int32_t*, positions)    /* [B, N] contiguous */                                   \
  X(const int32_t*, cache_start)  /* [B] or null (then slot = position) */                  \
  X(void*, q_out)                 /* [B, N, Hq, Dh] contiguous */                           \
  X(void*, k_cache)                                                                         \
  X(void*, v_cache)                                                                         \
  X(const int32_t*, block_table)  /* [B, max_pages] or null */                              \
  X(Strides4, q_strides)                                                                    \
  X(Strides4, k_strides)                                                                    \
  X(Strides4, v_strides)                                                                    \
  X(Strides4, k_cache_strides)                                                              \
  X(Strides4, v_cache_strides)    /* k_cache's shape, its own strides */                    \
  X(int64_t, block_table_batch_stride)                                                      \
  X(int, batch)                                                                             \
  X(int, n)                                                                                 \
  X(int, hq)                                                                                \
  X(int, hkv)                                                                               \
  X(int, head_dim)                                                                          \
  X(int, page_size)                                                                         \
  X(double, theta)                /* inv_freq = theta ** (-2i/rotary dims), to float */     \
  X(float, eps)                                                                             \
  X(int, dtype)                   /* q, k, v and q_out */                                   \
  X(int, cache_dtype)             /* k_cache and v_cache */                                 \
  X(int, rotary_dim)              /* optional; 0: head_dim, else even < head_dim (partial) */
struct QkNormRopeAppendParams {
  JETSPEC_QK_NORM_ROPE_APPEND_FIELDS(JETSPEC_MEMBER)
};

// verify_tree, phase 0 (top-k / top-p only): per node, the last token the filters keep, as a
// threshold: token v is kept iff x > thr_x or (x == thr_x and v <= thr_id), x = logit / T
// (verify_tree.cuh).
#define JETSPEC_SAMPLE_FILTER_FIELDS(X)                                                     \
  X(const void*, logits)          /* [B, N, V] */                                           \
  X(int64_t, logits_batch_stride) /* dims 0 and 1 (dim 2 contiguous) */                     \
  X(int64_t, logits_row_stride)                                                             \
  X(const int32_t*, num_nodes)    /* [B] */                                                 \
  X(const float*, temperature)    /* [B]; <= 0: greedy sequence (kept: everything) */       \
  X(const int32_t*, top_k)        /* [B] or null; 0 < k < V is on */                        \
  X(const float*, top_p)          /* [B] or null; < 1 is on */                              \
  X(float*, thr_x)                /* [B * N] */                                             \
  X(int32_t*, thr_id)             /* [B * N] */                                             \
  X(int, batch)                                                                             \
  X(int, n)                                                                                 \
  X(int, vocab)                                                                             \
  X(Flag, vec)                    /* rows are 16-byte aligned (vector loads) */             \
  X(int, dtype)                   /* logits */
struct SampleFilterParams {
  JETSPEC_SAMPLE_FILTER_FIELDS(JETSPEC_MEMBER)
};

// verify_tree, phase 1: per (node, vocab split) the best target logit (verify_tree.cuh).
#define JETSPEC_TARGET_TOKEN_FIELDS(X)                                                      \
  X(const void*, logits)          /* [B, N, V] */                                           \
  X(int64_t, logits_batch_stride) /* dims 0 and 1 (dim 2 contiguous) */                     \
  X(int64_t, logits_row_stride)                                                             \
  X(const int32_t*, num_nodes)    /* [B] */                                                 \
  X(const int64_t*, seed)         /* [B] or null (greedy) */                                \
  X(const int64_t*, offset)       /* [B] or null */                                         \
  X(float*, partial_value)        /* [B * N, splits]: best (Gumbel-perturbed) value */      \
  X(int32_t*, partial_token)      /* [B * N, splits]: its token */                          \
  X(int, batch)                                                                             \
  X(int, n)                                                                                 \
  X(int, vocab)                                                                             \
  X(int, splits)                                                                            \
  X(int, split_len)               /* split s: tokens [s * split_len, (s + 1) * split_len) */\
  X(Flag, vec)                    /* rows and split starts are 16-byte aligned */           \
  X(const float*, temperature)    /* [B] or null (all greedy); <= 0: that row is greedy */  \
  X(const float*, thr_x)          /* [B * N] or null (no filter): phase 0's thresholds */   \
  X(const int32_t*, thr_id)       /* [B * N] */                                             \
  X(int, dtype)                   /* logits */
struct TargetTokenParams {
  JETSPEC_TARGET_TOKEN_FIELDS(JETSPEC_MEMBER)
};

// verify_tree, phase 2: the acceptance walk (verify_tree.cuh). The node's target is target[b, i],
// or when target is null the best of its phase-1 splits. temperature is optional: a row with
// temperature[b] > 0 follows the first agreeing sibling, the others (every row when it is null)
// the longest agreeing chain.
#define JETSPEC_VERIFY_WALK_FIELDS(X)                                                       \
  X(const int32_t*, tokens)       /* [B, N] contiguous */                                   \
  X(const int32_t*, parents)      /* [B, N] contiguous */                                   \
  X(const int32_t*, num_nodes)    /* [B] */                                                 \
  X(const int32_t*, target)       /* [B, N] (dim 1 contiguous) or null */                   \
  X(int64_t, target_batch_stride)                                                           \
  X(const float*, partial_value)  /* [B * N, splits] (target null) */                       \
  X(const int32_t*, partial_token)                                                          \
  X(int, splits)                                                                            \
  X(int32_t*, accept_len)         /* [B] */                                                 \
  X(int32_t*, path)               /* [B, C] */                                              \
  X(int32_t*, bonus)              /* [B] */                                                 \
  X(int32_t*, emitted)            /* [B, C] */                                              \
  X(int, batch)                                                                             \
  X(int, n)                                                                                 \
  X(int, cols)                    /* C = max_depth + 1 */                                   \
  X(const float*, temperature)    /* [B] or null (every row greedy); optional */
struct VerifyWalkParams {
  JETSPEC_VERIFY_WALK_FIELDS(JETSPEC_MEMBER)
};

// commit_kv (commit_kv.cuh). Element sizes in bytes (2 or 4): the copies are raw.
#define JETSPEC_COMMIT_KV_FIELDS(X)                                                         \
  X(void*, k_cache)                                                                         \
  X(void*, v_cache)                                                                         \
  X(Strides4, k_cache_strides)                                                              \
  X(Strides4, v_cache_strides)                                                              \
  X(const int32_t*, block_table)  /* [B, max_pages] or null */                              \
  X(int64_t, block_table_batch_stride)                                                      \
  X(const int32_t*, prefix_lens)  /* [B] */                                                 \
  X(const int32_t*, path)         /* [B, C] contiguous */                                   \
  X(const int32_t*, accept_len)   /* [B] */                                                 \
  X(int32_t*, new_prefix_lens)    /* [B] */                                                 \
  X(const void*, hidden)          /* [B, N, Hh] or null */                                  \
  X(int64_t, hidden_batch_stride) /* dims 0 and 1 of hidden */                              \
  X(int64_t, hidden_row_stride)                                                             \
  X(void*, hidden_rows)           /* [B, C, Hh] contiguous or null */                       \
  X(int, batch)                                                                             \
  X(int, cols)                                                                              \
  X(int, hkv)                                                                               \
  X(int, head_dim)                                                                          \
  X(int, page_size)                                                                         \
  X(int, hidden_dim)                                                                        \
  X(int, cache_elem_bytes)                                                                  \
  X(int, hidden_elem_bytes)
struct CommitKvParams {
  JETSPEC_COMMIT_KV_FIELDS(JETSPEC_MEMBER)
};

// rms_norm (rms_norm.cuh), per row: h = rnd(x + residual) (h = x without residual; total = h),
// r = 1 / sqrt(sum(h^2) / hidden + eps) in fp32, out = rnd(weight * rnd(h * r)); rnd rounds to
// dtype. Rows may overlap in x and residual (any non-negative row stride).
#define JETSPEC_RMS_NORM_FIELDS(X)                                                          \
  X(const void*, x)               /* [R, H], dim 1 contiguous */                            \
  X(int64_t, x_row_stride)                                                                  \
  X(const void*, residual)        /* [R, H], dim 1 contiguous, or null (h = x) */           \
  X(int64_t, residual_row_stride)                                                           \
  X(const void*, weight)          /* [H] */                                                 \
  X(void*, out)                   /* [R, H] contiguous */                                   \
  X(void*, total)                 /* [R, H] contiguous, or null (not written) */            \
  X(int, rows)                                                                              \
  X(int, hidden)                                                                            \
  X(float, eps)                                                                             \
  X(int, dtype)                   /* x, residual, weight, out and total */
struct RmsNormParams {
  JETSPEC_RMS_NORM_FIELDS(JETSPEC_MEMBER)
};

// silu_mul (silu_mul.cuh), per row of x [R, 2I] (gate = x[:, :I], up = x[:, I:]):
// out = rnd(float(rnd(g / (1 + exp(-g)))) * float(u)), computed in fp32; rnd rounds to dtype.
// Rows may overlap in x (any non-negative row stride).
#define JETSPEC_SILU_MUL_FIELDS(X)                                                          \
  X(const void*, x)               /* [R, 2 * inner], dim 1 contiguous */                    \
  X(int64_t, x_row_stride)                                                                  \
  X(void*, out)                   /* [R, inner] contiguous */                               \
  X(int, rows)                                                                              \
  X(int, inner)                   /* I */                                                   \
  X(int, dtype)                   /* x and out */
struct SiluMulParams {
  JETSPEC_SILU_MUL_FIELDS(JETSPEC_MEMBER)
};

// log_softmax_topk (log_softmax_topk.cuh).
#define JETSPEC_LOG_SOFTMAX_TOPK_FIELDS(X)                                                  \
  X(const void*, logits)          /* [B, D, V], dim 2 contiguous */                         \
  X(int64_t, logits_batch_stride) /* dims 0 and 1 (dim 2 contiguous) */                     \
  X(int64_t, logits_row_stride)                                                             \
  X(int32_t*, tokens)             /* [B, D, K] contiguous */                                \
  X(float*, logprobs)             /* [B, D, K] contiguous */                                \
  X(void*, workspace)             /* topk_workspace_bytes */                                \
  X(int, batch)                                                                             \
  X(int, depth)                                                                             \
  X(int, vocab)                                                                             \
  X(int, k)                                                                                 \
  X(int, dtype)                   /* logits */
struct LogSoftmaxTopkParams {
  JETSPEC_LOG_SOFTMAX_TOPK_FIELDS(JETSPEC_MEMBER)
};

// build_tree (build_tree.cuh); algorithm: TreeAlgorithm. steps is optional (tests).
#define JETSPEC_BUILD_TREE_FIELDS(X)                                                        \
  X(const int32_t*, topk_tokens)  /* [B, D, K] contiguous */                                \
  X(const float*, topk_logprobs)  /* [B, D, K] contiguous, sorted descending along K */     \
  X(const int32_t*, root_tokens)  /* [B] */                                                 \
  X(int32_t*, tokens)             /* [B, N] */                                              \
  X(int32_t*, parents)            /* [B, N] */                                              \
  X(int32_t*, depths)             /* [B, N] */                                              \
  X(float*, scores)               /* [B, N] */                                              \
  X(int32_t*, num_nodes)          /* [B] */                                                 \
  X(int32_t*, mask)               /* [B, N, W] */                                           \
  X(int, batch)                                                                             \
  X(int, depth)                                                                             \
  X(int, k)                                                                                 \
  X(int, budget)                                                                            \
  X(int, words)                                                                             \
  X(int, algorithm)                                                                         \
  X(int32_t*, steps)              /* [B] or null: selection steps taken (topn; tests) */
struct BuildTreeParams {
  JETSPEC_BUILD_TREE_FIELDS(JETSPEC_MEMBER)
};

// tree_attention (attention.cuh); tail: AttnTail, kernel: AttnKernel. group and scale_log2 are
// computed by the launcher, not passed.
#define JETSPEC_ATTN_FIELDS(X)                                                              \
  X(const void*, q)               /* [B, N, Hq, D] */                                       \
  X(Strides4, q_strides)                                                                    \
  X(const void*, k_cache)         /* [B, L, Hkv, D] or [P, page, Hkv, D] */                 \
  X(const void*, v_cache)                                                                   \
  X(Strides4, k_cache_strides)                                                              \
  X(Strides4, v_cache_strides)                                                              \
  X(const int32_t*, block_table)  /* [B, max_pages] or null */                              \
  X(int64_t, block_table_batch_stride)                                                      \
  X(int, page_size)               /* paged: rows per page; contiguous: L */                 \
  X(int, cache_outer)             /* extent of the cache's dim 0 (B, or pages) */           \
  X(const int32_t*, prefix_lens)  /* [B] */                                                 \
  X(const int32_t*, tree_mask)    /* [B, N, W] or null */                                   \
  X(int64_t, tree_mask_batch_stride) /* dims 0 and 1 of tree_mask */                       \
  X(int64_t, tree_mask_row_stride)                                                          \
  X(int, tail)                                                                              \
  X(void*, out)                   /* [B, N, Hq, D] */                                       \
  X(Strides4, out_strides)                                                                  \
  X(float*, lse)                  /* [B, Hq, N] contiguous, or null */                      \
  X(float*, partial_o)            /* [splits, B, Hq, N, D] when splits > 1 */               \
  X(float*, partial_lse)          /* [splits, B, Hq, N] */                                  \
  X(int, batch)                                                                             \
  X(int, n)                                                                                 \
  X(int, hq)                                                                                \
  X(int, hkv)                                                                               \
  X(int, splits)                                                                            \
  X(float, scale)                 /* softmax scale */                                       \
  X(int, dtype)                   /* q, caches and out: float16 or bfloat16 */              \
  X(int, head_dim)                /* 64, 128 or 256 */                                      \
  X(int, kernel)
struct AttnParams {
  JETSPEC_ATTN_FIELDS(JETSPEC_MEMBER)
  int group;         // hq / hkv
  float scale_log2;  // scale * log2(e)
};

}  // namespace jetspec
