// Tree-masked / block-causal attention over a KV cache with mma.sync (sm_80, also runs on sm_90).
//
// GQA packing: a CTA owns one (sequence, kv head) and 64 packed rows, row r = (tree row r / G,
// query head kvh * G + r % G), G = Hq / Hkv, so every K/V tile loaded serves all G query heads.
// 4 warps x 16 rows; K/V tiles of BN keys, double-buffered with cp.async (rows past the end are
// zero-filled so that 0 * garbage can never be NaN). Online softmax in the log2 domain, fp32
// accumulators. Split-KV: blockIdx.z takes an even share of the sequence's key blocks and
// writes fp32 partial outputs + LSE that attention_combine_kernel merges; with one split the
// kernel writes `out` and `lse` directly.
#pragma once
#include "jetspec/mma.cuh"

namespace jetspec {

constexpr int kAttnThreads = 128;

// This thread's index in its consumer warpgroup (the Hopper family runs one or two of them; the
// other kernels are one warpgroup, so this is threadIdx.x there).
__device__ __forceinline__ int attn_tid() { return static_cast<int>(threadIdx.x) % kAttnThreads; }

template <int HD> struct AttnBlockN { static constexpr int value = HD >= 256 ? 32 : 64; };

template <typename T, int HD>
constexpr size_t attention_smem_bytes() {
  return static_cast<size_t>(kAttnRows + 4 * AttnBlockN<HD>::value) * (HD + 8) * sizeof(T);
}

// May packed row pr see the key at logical position p? (pr's tree row is i)
__device__ __forceinline__ bool attn_visible(const AttnParams& p, int b, int prefix, int i,
                                             int pos) {
  if (pos < prefix) return true;
  const int j = pos - prefix;
  if (j >= p.n) return false;
  if (p.tail == kTailFull) return true;
  if (p.tail == kTailCausal) return j <= i;
  const uint32_t w = static_cast<uint32_t>(
      p.tree_mask[b * p.tree_mask_batch_stride + i * p.tree_mask_row_stride + (j >> 5)]);
  return (w >> (j & 31)) & 1u;
}

// ---- pieces shared by the mma.sync and wgmma kernels ------------------------------------------
// Both keep a thread's S and O accumulators in the m16n8 layout: warp w owns packed rows
// 16w + g and 16w + g + 8 (g = lane / 4); x[j][e] is column 8j + 2 (lane % 4) + (e & 1) of row
// 16w + g + 8 (e >> 1). (wgmma's m64nN accumulators are laid out the same way.)

// Copies the Q rows of this CTA's packed-row tile; dst(r, col) is where 8 elements of row r,
// starting at column col, go in shared memory (rows past the packed rows are zero-filled).
template <typename T, int HD, typename Dst>
__device__ __forceinline__ void attn_load_q(const AttnParams& p, int b, int kvh, int row0, Dst dst) {
  constexpr int CH = HD / 8;  // 16-byte chunks per row
  const T* q = static_cast<const T*>(p.q);
  const int rows_total = p.n * p.group;
  for (int c = attn_tid(); c < kAttnRows * CH; c += kAttnThreads) {
    const int r = c / CH, col = (c % CH) * 8;
    const int pr = row0 + r;
    const bool ok = pr < rows_total;
    const T* src = q;
    if (ok) {
      const int i = pr / p.group, h = kvh * p.group + pr % p.group;
      src = q + b * p.q_strides.batch + i * p.q_strides.row + h * p.q_strides.head + col;
    }
    cp_async_16(dst(r, col), src, ok);
  }
}

// Copies the BN keys of block blk (positions past len are zero-filled, so that 0 * garbage can
// never be NaN); dk(r, col) / dv(r, col) as dst above.
template <typename T, int HD, int BN, typename DstK, typename DstV>
__device__ __forceinline__ void attn_load_kv(const AttnParams& p, int b, int kvh, int len, int blk,
                                             DstK dk, DstV dv) {
  constexpr int CH = HD / 8;
  const T* kc = static_cast<const T*>(p.k_cache);
  const T* vc = static_cast<const T*>(p.v_cache);
  for (int c = threadIdx.x; c < BN * CH; c += kAttnThreads) {
    const int r = c / CH, col = (c % CH) * 8;
    const int pos = blk * BN + r;
    const bool ok = pos < len;
    const T* ks = kc;
    const T* vs = vc;
    if (ok) {
      ks = kc + cache_offset(p.k_cache_strides, p.block_table, p.block_table_batch_stride,
                             p.page_size, b, pos, kvh) + col;
      vs = vc + cache_offset(p.v_cache_strides, p.block_table, p.block_table_batch_stride,
                             p.page_size, b, pos, kvh) + col;
    }
    cp_async_16(dk(r, col), ks, ok);
    cp_async_16(dv(r, col), vs, ok);
  }
}

// Scales S into the log2 domain and masks the keys a row may not see; key0 = the block's first
// position, tree_row = the tree rows of this thread's two packed rows.
template <int BN>
__device__ __forceinline__ void attn_scale_mask(float (&s)[BN / 8][4], const AttnParams& p, int b,
                                                int prefix, const int (&tree_row)[2], int key0) {
  const int tq = threadIdx.x & 3;
  const bool need_mask = key0 + BN > prefix;
#pragma unroll
  for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float v = s[nt][e] * p.scale_log2;
      if (need_mask) {
        const int pos = key0 + nt * 8 + 2 * tq + (e & 1);
        if (!attn_visible(p, b, prefix, tree_row[e >> 1], pos)) v = -INFINITY;
      }
      s[nt][e] = v;
    }
  }
}

// Online softmax step (a row is spread over the 4 threads of a quad): S becomes P = exp2(S - m),
// the running max / sum are updated and O is rescaled.
template <int BN, int HD>
__device__ __forceinline__ void attn_online_softmax(float (&s)[BN / 8][4], float (&o)[HD / 8][4],
                                                    float (&m_run)[2], float (&l_run)[2]) {
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    float mx = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * h2], s[nt][2 * h2 + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m_run[h2], mx);
    const float m_use = m_new == -INFINITY ? 0.f : m_new;  // no visible key yet: no NaN
    const float alpha = exp2f(m_run[h2] - m_use);
    float sum = 0.f;
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
      s[nt][2 * h2] = exp2f(s[nt][2 * h2] - m_use);
      s[nt][2 * h2 + 1] = exp2f(s[nt][2 * h2 + 1] - m_use);
      sum += s[nt][2 * h2] + s[nt][2 * h2 + 1];
    }
    l_run[h2] = l_run[h2] * alpha + sum;
    m_run[h2] = m_new;
#pragma unroll
    for (int dt = 0; dt < HD / 8; ++dt) {
      o[dt][2 * h2] *= alpha;
      o[dt][2 * h2 + 1] *= alpha;
    }
  }
}

// The A fragment (m16k16, the m16n8 accumulators of key tiles 2kk and 2kk + 1) of P.
template <typename T, int BN>
__device__ __forceinline__ void attn_p_fragment(const float (&s)[BN / 8][4], int kk,
                                                uint32_t (&a)[4]) {
  a[0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
  a[1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
  a[2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  a[3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// Normalises O and writes out + lse (one split) or the fp32 partials (several).
template <typename T, int HD>
__device__ __forceinline__ void attn_store(const AttnParams& p, const float (&o)[HD / 8][4],
                                           const float (&m_run)[2], const float (&l_run)[2], int b,
                                           int kvh, int split, int row0) {
  const int warp = attn_tid() >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, tq = lane & 3;
  const int rows_total = p.n * p.group;
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    float l = l_run[h2];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int pr = row0 + warp * 16 + g + 8 * h2;
    if (pr >= rows_total) continue;
    const int i = pr / p.group, h = kvh * p.group + pr % p.group;
    // l == 0: no visible key (or only -inf scores): out 0 whatever V holds, lse -inf. A NaN or
    // +inf score left l NaN (exp2 of NaN or of inf - inf; fmaxf skips NaN): out and lse NaN.
    const bool no_key = l == 0.f;
    const float inv = no_key ? 0.f : 1.f / l;
    const float lse = no_key ? -INFINITY : (m_run[h2] + log2f(l)) * 0.69314718055994531f;
    const int64_t ridx = (static_cast<int64_t>(b) * p.hq + h) * p.n + i;
    if (p.splits == 1) {
      T* dst = static_cast<T*>(p.out) + b * p.out_strides.batch + i * p.out_strides.row +
               h * p.out_strides.head;
#pragma unroll
      for (int dt = 0; dt < HD / 8; ++dt) {
        const int d = dt * 8 + 2 * tq;
        *reinterpret_cast<uint32_t*>(dst + d) =
            pack2<T>(no_key ? 0.f : o[dt][2 * h2] * inv, no_key ? 0.f : o[dt][2 * h2 + 1] * inv);
      }
      if (p.lse != nullptr && tq == 0) p.lse[ridx] = lse;
    } else {
      const int64_t prow = static_cast<int64_t>(split) * p.batch * p.hq * p.n + ridx;
      float* dst = p.partial_o + prow * HD;
#pragma unroll
      for (int dt = 0; dt < HD / 8; ++dt) {
        const int d = dt * 8 + 2 * tq;
        *reinterpret_cast<float2*>(dst + d) =
            make_float2(no_key ? 0.f : o[dt][2 * h2] * inv, no_key ? 0.f : o[dt][2 * h2 + 1] * inv);
      }
      if (tq == 0) p.partial_lse[prow] = lse;
    }
  }
}

// A warpgroup's coordinates and key-block range (blockIdx: x = packed-row tile of `wgs`
// warpgroups' 64 rows, y = (b, kv head), z = split).
struct AttnTile {
  int b, kvh, split, row0, prefix, len, blk_begin, blk_end;
  int tree_row[2];  // tree rows of this thread's two packed rows (clamped past the end)
};

template <int BN>
__device__ __forceinline__ AttnTile attn_tile(const AttnParams& p, int wgs = 1) {
  AttnTile t;
  t.b = blockIdx.y / p.hkv;
  t.kvh = blockIdx.y % p.hkv;
  t.split = blockIdx.z;
  t.row0 = (blockIdx.x * wgs + static_cast<int>(threadIdx.x) / kAttnThreads) * kAttnRows;
  t.prefix = p.prefix_lens[t.b];
  t.len = t.prefix + p.n;
  const int nblocks = (t.len + BN - 1) / BN;
  t.blk_begin = static_cast<int>(static_cast<long long>(t.split) * nblocks / p.splits);
  t.blk_end = static_cast<int>(static_cast<long long>(t.split + 1) * nblocks / p.splits);
  const int rows_total = p.n * p.group;
  const int warp = attn_tid() >> 5, g = (threadIdx.x & 31) >> 2;
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    const int pr = t.row0 + warp * 16 + g + 8 * h2;
    t.tree_row[h2] = min(pr, rows_total - 1) / p.group;
  }
  return t;
}

// Starts copying block blk + 1 (if any) into the other stage, then waits for block blk's copy;
// returns blk's stage. load_kv(blk, stage) issues a block's cp.async copies.
template <typename LoadKV>
__device__ __forceinline__ int attn_wait_block(const AttnTile& t, int blk, LoadKV& load_kv) {
  const int stage = (blk - t.blk_begin) & 1;
  if (blk + 1 < t.blk_end) {
    load_kv(blk + 1, stage ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  return stage;
}

// ---- the mma.sync kernel ---------------------------------------------------------------------
template <typename T, int HD>
__global__ void __launch_bounds__(kAttnThreads) tree_attention_kernel(AttnParams p) {
  pdl_begin();
  constexpr int BN = AttnBlockN<HD>::value;
  constexpr int LD = HD + 8;  // padded row: 8 ldmatrix rows hit distinct bank groups
  JETSPEC_DYNAMIC_SMEM(smem_raw);
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + kAttnRows * LD;  // [2][BN][LD]
  T* sV = sK + 2 * BN * LD;     // [2][BN][LD]

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const AttnTile t = attn_tile<BN>(p);

  attn_load_q<T, HD>(p, t.b, t.kvh, t.row0, [&](int r, int col) { return sQ + r * LD + col; });
  auto load_kv = [&](int blk, int stage) {
    T* dk = sK + stage * BN * LD;
    T* dv = sV + stage * BN * LD;
    attn_load_kv<T, HD, BN>(p, t.b, t.kvh, t.len, blk,
                            [&](int r, int col) { return dk + r * LD + col; },
                            [&](int r, int col) { return dv + r * LD + col; });
  };
  if (t.blk_begin < t.blk_end) load_kv(t.blk_begin, 0);
  cp_async_commit();

  float o[HD / 8][4];
#pragma unroll
  for (int dt = 0; dt < HD / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.f, 0.f};

  for (int blk = t.blk_begin; blk < t.blk_end; ++blk) {
    const int stage = attn_wait_block(t, blk, load_kv);
    __syncthreads();
    const T* tK = sK + stage * BN * LD;
    const T* tV = sV + stage * BN * LD;

    // S = Q K^T for this warp's 16 rows x BN keys.
    float s[BN / 8][4];
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      uint32_t a[4];
      ldmatrix_x4(a, sQ + (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + kk * 16 +
                         (lane >> 4) * 8);
#pragma unroll
      for (int nt = 0; nt < BN / 8; nt += 2) {
        uint32_t bk[4];
        const int mi = lane >> 3;
        ldmatrix_x4(bk, tK + (nt * 8 + (mi >> 1) * 8 + (lane & 7)) * LD + kk * 16 + (mi & 1) * 8);
        mma_16816<T>(s[nt], a, bk[0], bk[1]);
        mma_16816<T>(s[nt + 1], a, bk[2], bk[3]);
      }
    }
    attn_scale_mask<BN>(s, p, t.b, t.prefix, t.tree_row, blk * BN);
    attn_online_softmax<BN, HD>(s, o, m_run, l_run);

    // O += P V.
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t a[4];
      attn_p_fragment<T, BN>(s, kk, a);
#pragma unroll
      for (int dt = 0; dt < HD / 8; dt += 2) {
        uint32_t bv[4];
        const int mi = lane >> 3;
        ldmatrix_x4_trans(bv, tV + (kk * 16 + (mi & 1) * 8 + (lane & 7)) * LD + dt * 8 +
                                  (mi >> 1) * 8);
        mma_16816<T>(o[dt], a, bv[0], bv[1]);
        mma_16816<T>(o[dt + 1], a, bv[2], bv[3]);
      }
    }
    __syncthreads();  // the next prefetch overwrites this stage
  }
  cp_async_wait<0>();
  attn_store<T, HD>(p, o, m_run, l_run, t.b, t.kvh, t.split, t.row0);
}

// Merges split partials: one warp per (b, h, i) row; out = sum_s w_s O_s / sum_s w_s with
// w_s = exp(lse_s - max lse); lse = max + log(sum w). Empty splits have lse -inf (w = 0, O = 0);
// a split's NaN lse (fmaxf skips it) makes its w, the sum, out and lse NaN.
// Launch bounds (256, 4): at (256) alone ptxas aimed at 8 CTAs an SM (32 registers) and spilled on
// sm_80; 4 leaves it about 44, and 5 CTAs still fit an SM.
template <typename T>
__global__ void __launch_bounds__(256, 4) attention_combine_kernel(AttnParams p, int hd) {
  pdl_begin();
  // Grid (rows of a sequence / 8, batch): the indices stay 32-bit (a 64-bit division is a
  // subroutine call whose frame spilled); a sequence's hq * n rows fit an int, the batch is grid y.
  const int in_b = static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) >> 5);
  const int lane = threadIdx.x & 31;
  if (in_b >= p.hq * p.n) return;
  const int i = in_b % p.n;
  const int h = in_b / p.n;
  const int b = static_cast<int>(blockIdx.y);
  const long long rows = static_cast<long long>(p.batch) * p.hq * p.n;
  const long long row = static_cast<long long>(b) * p.hq * p.n + in_b;
  float m = -INFINITY;
  for (int s = lane; s < p.splits; s += 32) m = fmaxf(m, p.partial_lse[s * rows + row]);
  m = warp_max(m);
  const float m_use = m == -INFINITY ? 0.f : m;  // no split saw a key: every w is exp(-inf) = 0
  float sum = 0.f;
  for (int s = lane; s < p.splits; s += 32) sum += expf(p.partial_lse[s * rows + row] - m_use);
  sum = warp_sum(sum);
  const bool no_key = sum == 0.f;
  const float inv = no_key ? 0.f : 1.f / sum;
  T* dst = static_cast<T*>(p.out) + b * p.out_strides.batch + i * p.out_strides.row +
           h * p.out_strides.head;
  for (int d = lane; d < hd; d += 32) {
    float acc = 0.f;
    if (!no_key) {
      for (int s = 0; s < p.splits; ++s) {
        const float ls = p.partial_lse[s * rows + row];
        if (ls != -INFINITY) acc += expf(ls - m_use) * p.partial_o[(s * rows + row) * hd + d];
      }
    }
    dst[d] = from_float<T>(acc * inv);
  }
  if (p.lse != nullptr && lane == 0) p.lse[row] = no_key ? -INFINITY : m + logf(sum);
}

// Launches `kernel(p, extra...)` (one of the attention kernels, with `threads` threads and `smem`
// bytes of dynamic shared memory) over (tiles of `cta_rows` packed rows, B * Hkv, splits), then
// the combine when there are several splits.
template <typename T, typename Kernel, typename... Extra>
Status attention_launch(const AttnParams& p, Kernel kernel, size_t smem, int hd, int threads,
                        int cta_rows, cudaStream_t stream, const Extra&... extra) {
  if (p.batch == 0 || p.n == 0 || p.hq == 0) return cudaSuccess;
  JETSPEC_RETURN_IF_FAILED(check_range("splits", p.splits, 1, 65535));  // grid z
  JETSPEC_RETURN_IF_FAILED(check_range("hkv", p.hkv, 1));
  if (p.group < 1 || p.hq != p.hkv * p.group)
    return bad_input("hq ", p.hq, " is not a multiple of hkv ", p.hkv);
  if (p.splits > 1 && (p.partial_o == nullptr || p.partial_lse == nullptr))
    return bad_input("splits ", p.splits, " needs partial_o and partial_lse");
  const long long rows = static_cast<long long>(p.n) * p.group;
  const long long tiles = (rows + cta_rows - 1) / cta_rows;
  const long long bh = static_cast<long long>(p.batch) * p.hkv;
  if (tiles > 0x7fffffffLL) {
    return bad_input("n * hq / hkv = ", rows, " rows need ", tiles, " tiles of ", cta_rows,
                     ", over 2147483647");
  }
  if (bh > 65535) return bad_input("batch * hkv = ", bh, " exceeds 65535");  // grid y
  if (smem > 48 * 1024) {
    JETSPEC_RETURN_IF_FAILED(cuda_context(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)),
        cat("cudaFuncSetAttribute(max dynamic shared memory ", smem, " bytes)")));
  }
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(bh), p.splits);
  JETSPEC_LAUNCH(kernel, grid, threads, smem, stream, p, extra...);
  JETSPEC_RETURN_IF_ERROR(cudaGetLastError());
  if (p.splits == 1) return cudaSuccess;
  // a warp per row: a sequence's hq * n rows in x (the main grid's checks bound them), batch in y
  const long long seq_rows = static_cast<long long>(p.hq) * p.n;
  if (seq_rows > 0x7fffffffLL) return bad_input("hq * n = ", seq_rows, " exceeds 2147483647");
  const dim3 combine_grid(static_cast<unsigned>((seq_rows * 32 + 255) / 256),
                          static_cast<unsigned>(p.batch));
  JETSPEC_LAUNCH(attention_combine_kernel<T>, combine_grid, 256, 0, stream, p, hd);
  return cudaGetLastError();
}

template <typename T, int HD>
Status tree_attention(const AttnParams& p, cudaStream_t stream) {
  return attention_launch<T>(p, tree_attention_kernel<T, HD>, attention_smem_bytes<T, HD>(), HD,
                             kAttnThreads, kAttnRows, stream);
}

}  // namespace jetspec
