// Top-K of log_softmax(hidden @ lm_head_weight^T) without materialising the [B, D, V] logits.
//
// Phase 1 (vocab-parallel, memory-bound on the weight): CTA (chunk, m-tile) streams its vocabulary
// span of the weight, 128 vocab rows x 64 hidden columns per stage through a 4-stage cp.async
// pipeline, and multiplies it with the m-tile's hidden rows on mma.sync (fp32 accumulators; warp w
// owns vocab rows 32w..32w+31 of a tile). After each 128-row tile the logits go through shared
// memory, and one warp per hidden row folds them into the row's online max / sum of exp and its
// running top-K (a sorted list in shared memory; a candidate is inserted only when it beats the
// current k-th, so after the first tiles a row does a ballot and little else). The CTA then writes
// the same per-chunk partials as topk_partial_kernel, and topk_merge_kernel (topk.cuh) finishes.
// The span per CTA is chosen so that the whole grid is resident at once (one wave).
#pragma once
#include <algorithm>

#include "jetspec/mma.cuh"
#include "jetspec/topk.cuh"

namespace jetspec {

constexpr int kHtThreads = 128;
constexpr int kHtTileV = 128;   // vocab rows per tile (4 warps x 32)
constexpr int kHtTileH = 64;    // hidden columns per pipeline stage
constexpr int kHtStages = 4;
constexpr int kHtLd = kHtTileH + 8;        // padded smem row (conflict-free ldmatrix)
constexpr int kHtLogitLd = kHtTileV + 4;   // fp32 logits staging row

inline size_t hidden_topk_smem_bytes(int mtiles, int k) {
  const size_t bm = 16 * static_cast<size_t>(mtiles);
  return kHtStages * (kHtTileV + bm) * kHtLd * 2 + bm * kHtLogitLd * 4 + bm * k * 8 + bm * 8;
}

// Launch shape: 64 hidden rows per CTA (4 m16 tiles) when there are more than 16 rows and the
// device has the shared memory for it, else 16; vocabulary tiles per CTA such that the whole grid
// is resident at once on the current device.
struct HiddenTopkPlan {
  int mtiles, tiles_per_cta, chunks, m_blocks;
  size_t smem;
};

inline Status hidden_topk_plan(long long rows, int vocab, int k, HiddenTopkPlan* plan) {
  JETSPEC_RETURN_IF_FAILED(check_range("rows", rows, 0));
  JETSPEC_RETURN_IF_FAILED(check_range("vocab", vocab, 1));
  JETSPEC_RETURN_IF_FAILED(check_range("k", k, 1, kMaxTopk));
  int dev = 0, sms = 0, per_block = 0, per_sm = 0;
  JETSPEC_RETURN_IF_ERROR(cudaGetDevice(&dev));
  JETSPEC_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  JETSPEC_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  JETSPEC_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  plan->mtiles = rows > 16 && hidden_topk_smem_bytes(4, k) <= static_cast<size_t>(per_block) ? 4 : 1;
  plan->smem = hidden_topk_smem_bytes(plan->mtiles, k);
  if (plan->smem > static_cast<size_t>(per_block))
    return unsupported("the plan for k ", k, " needs ", plan->smem, " bytes of shared memory per ",
                       "block; the device allows ", per_block);
  const long long bm = 16LL * plan->mtiles;
  plan->m_blocks = static_cast<int>(std::min<long long>((rows + bm - 1) / bm, 0x7fffffffLL));
  const long long ctas_per_sm = std::max<long long>(1, per_sm / static_cast<long long>(plan->smem + 1024));
  const long long chunks = std::max<long long>(1, sms * ctas_per_sm / std::max(plan->m_blocks, 1));
  const long long tiles = (vocab + kHtTileV - 1) / kHtTileV;
  plan->tiles_per_cta = static_cast<int>((tiles + chunks - 1) / chunks);
  const long long per_cta = static_cast<long long>(kHtTileV) * plan->tiles_per_cta;
  plan->chunks = static_cast<int>((vocab + per_cta - 1) / per_cta);
  return cudaSuccess;
}

// Folds one 128-entry logits row (vocab ids v0..v0+127, valid below v_end) into hidden row r's
// running max / sum of exp and sorted top-k list. Called by one whole warp.
__device__ __forceinline__ void hidden_topk_fold_row(const float* x, int v0, int v_end, int k,
                                                     float& m_run, float& s_run, float* lv,
                                                     int* li) {
  const int lane = threadIdx.x & 31;
  float val[4];
  bool ok[4];
  float mx = -INFINITY;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    ok[j] = v0 + lane + 32 * j < v_end;
    val[j] = ok[j] ? x[lane + 32 * j] : -INFINITY;
    mx = fmaxf(mx, val[j]);
  }
  mx = warp_max(mx);
  const float m_new = fmaxf(m_run, mx);
  float s = 0.f;
  if (m_new != -INFINITY) {
#pragma unroll
    for (int j = 0; j < 4; ++j) s += ok[j] ? expf(val[j] - m_new) : 0.f;
  }
  s = warp_sum(s);
  s_run = (m_run == -INFINITY ? 0.f : s_run * expf(m_run - m_new)) + s;
  m_run = m_new;

  // Candidates that beat the current k-th entry, inserted one at a time (lowest lane first).
  float tv = lv[k - 1];
  int ti = li[k - 1];
  unsigned pend = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (ok[j] && topk_before(val[j], v0 + lane + 32 * j, tv, ti)) pend |= 1u << j;
  for (unsigned who = __ballot_sync(0xffffffffu, pend != 0); who != 0;
       who = __ballot_sync(0xffffffffu, pend != 0)) {
    const int src = __ffs(who) - 1;
    const int j = __ffs(pend) - 1;  // meaningful on src
    const float mine = j == 0 ? val[0] : j == 1 ? val[1] : j == 2 ? val[2] : val[3];
    const float cv = __shfl_sync(0xffffffffu, mine, src);
    const int ci = v0 + src + 32 * __shfl_sync(0xffffffffu, j, src);
    if (lane == src) pend &= pend - 1;
    // Slots lane and lane + 32 (k <= 64): position of the new key, then shift the tail down.
    float old_v[2], prev_v[2];
    int old_i[2], prev_i[2];
    int pos = 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int e = lane + 32 * h;
      old_v[h] = e < k ? lv[e] : -INFINITY;
      old_i[h] = e < k ? li[e] : kTopkNone;
      prev_v[h] = (e > 0 && e < k) ? lv[e - 1] : -INFINITY;
      prev_i[h] = (e > 0 && e < k) ? li[e - 1] : kTopkNone;
      pos += __popc(__ballot_sync(0xffffffffu, e < k && topk_before(old_v[h], old_i[h], cv, ci)));
    }
    __syncwarp();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int e = lane + 32 * h;
      if (e < k && e >= pos) {
        lv[e] = e == pos ? cv : prev_v[h];
        li[e] = e == pos ? ci : prev_i[h];
      }
    }
    __syncwarp();
    tv = lv[k - 1];
    ti = li[k - 1];
#pragma unroll
    for (int jj = 0; jj < 4; ++jj)
      if (((pend >> jj) & 1u) && !topk_before(val[jj], v0 + lane + 32 * jj, tv, ti))
        pend &= ~(1u << jj);
  }
}

template <typename T, int MT>
__global__ void __launch_bounds__(kHtThreads) hidden_topk_partial_kernel(HiddenTopkParams p,
                                                                         int tiles_per_cta) {
  pdl_begin();
  constexpr int BM = 16 * MT;
  constexpr int CH = kHtTileH / 8;  // 16-byte chunks per smem row
  JETSPEC_DYNAMIC_SMEM(smem_raw);
  T* sW = reinterpret_cast<T*>(smem_raw);                      // [S][128][kHtLd]
  T* sX = sW + kHtStages * kHtTileV * kHtLd;                   // [S][BM][kHtLd]
  float* sL = reinterpret_cast<float*>(sX + kHtStages * BM * kHtLd);  // [BM][kHtLogitLd]
  float* list_v = sL + BM * kHtLogitLd;                        // [BM][k]
  int* list_i = reinterpret_cast<int*>(list_v + BM * p.k);     // [BM][k]
  float* row_m = reinterpret_cast<float*>(list_i + BM * p.k);  // [BM]
  float* row_s = row_m + BM;                                   // [BM]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, tq = lane & 3;
  const int rows = p.batch * p.depth;
  const int m0 = blockIdx.y * BM;
  const int chunk = blockIdx.x, chunks = gridDim.x;
  const int v_begin = chunk * tiles_per_cta * kHtTileV;
  const int v_end = min(p.vocab, v_begin + tiles_per_cta * kHtTileV);
  const int hsteps = (p.hidden_dim + kHtTileH - 1) / kHtTileH;
  const int steps = ((v_end - v_begin + kHtTileV - 1) / kHtTileV) * hsteps;

  for (int e = tid; e < BM * p.k; e += kHtThreads) {
    list_v[e] = -INFINITY;
    list_i[e] = kTopkNone;
  }
  for (int r = tid; r < BM; r += kHtThreads) {
    row_m[r] = -INFINITY;
    row_s[r] = 0.f;
  }

  const T* w = static_cast<const T*>(p.weight);
  const T* x = static_cast<const T*>(p.hidden);
  auto load = [&](int step) {
    const int stage = step % kHtStages;
    const int v0 = v_begin + (step / hsteps) * kHtTileV, h0 = (step % hsteps) * kHtTileH;
    T* dw = sW + stage * kHtTileV * kHtLd;
    T* dx = sX + stage * BM * kHtLd;
    for (int c = tid; c < kHtTileV * CH; c += kHtThreads) {
      const int r = c / CH, col = (c % CH) * 8;
      const bool ok = v0 + r < v_end && h0 + col < p.hidden_dim;
      cp_async_16(dw + r * kHtLd + col, ok ? w + (v0 + r) * p.weight_row_stride + h0 + col : w, ok);
    }
    for (int c = tid; c < BM * CH; c += kHtThreads) {
      const int r = c / CH, col = (c % CH) * 8;
      const int m = m0 + r;
      const bool ok = m < rows && h0 + col < p.hidden_dim;
      const T* src = ok ? x + (m / p.depth) * p.hidden_batch_stride +
                              (m % p.depth) * p.hidden_row_stride + h0 + col
                        : x;
      cp_async_16(dx + r * kHtLd + col, src, ok);
    }
  };
#pragma unroll
  for (int s = 0; s < kHtStages - 1; ++s) {
    if (s < steps) load(s);
    cp_async_commit();  // empty groups keep the wait count uniform
  }

  float acc[MT][4][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.f;

  for (int step = 0; step < steps; ++step) {
    cp_async_wait<kHtStages - 2>();
    __syncthreads();  // stage `step` landed for all threads; stage step - 1 is free to refill
    if (step + kHtStages - 1 < steps) load(step + kHtStages - 1);
    cp_async_commit();
    const T* tW = sW + (step % kHtStages) * kHtTileV * kHtLd;
    const T* tX = sX + (step % kHtStages) * BM * kHtLd;
#pragma unroll
    for (int kk = 0; kk < kHtTileH / 16; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        ldmatrix_x4(a[mt], tX + (mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kHtLd + kk * 16 +
                               (lane >> 4) * 8);
#pragma unroll
      for (int nt = 0; nt < 4; nt += 2) {
        uint32_t bw[4];
        const int mi = lane >> 3;
        ldmatrix_x4(bw, tW + (warp * 32 + nt * 8 + (mi >> 1) * 8 + (lane & 7)) * kHtLd + kk * 16 +
                           (mi & 1) * 8);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<T>(acc[mt][nt], a[mt], bw[0], bw[1]);
          mma_16816<T>(acc[mt][nt + 1], a[mt], bw[2], bw[3]);
        }
      }
    }
    if (step % hsteps != hsteps - 1) continue;

    // Tile done: stage its logits, then fold them row by row (one warp per row).
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = mt * 16 + g + 8 * (e >> 1), c = warp * 32 + nt * 8 + 2 * tq + (e & 1);
          sL[r * kHtLogitLd + c] = acc[mt][nt][e];
          acc[mt][nt][e] = 0.f;
        }
    __syncthreads();
    const int v0 = v_begin + (step / hsteps) * kHtTileV;
    for (int r = warp; r < BM && m0 + r < rows; r += kHtThreads / 32) {
      float m_run = row_m[r], s_run = row_s[r];
      hidden_topk_fold_row(sL + r * kHtLogitLd, v0, v_end, p.k, m_run, s_run, list_v + r * p.k,
                           list_i + r * p.k);
      if (lane == 0) {
        row_m[r] = m_run;
        row_s[r] = s_run;
      }
    }
    // The next write of sL follows at least one more top-of-loop barrier.
  }
  cp_async_wait<0>();
  __syncwarp();

  // Partials in topk_partial_kernel's layout; each row is written by the warp that folded it.
  float* stats = static_cast<float*>(p.workspace);
  const long long total = static_cast<long long>(rows) * chunks;
  float* cand_v = stats + 2 * total;
  int* cand_i = reinterpret_cast<int*>(cand_v + total * p.k);
  for (int r = warp; r < BM && m0 + r < rows; r += kHtThreads / 32) {
    const long long slot = static_cast<long long>(m0 + r) * chunks + chunk;
    if (lane == 0) {
      stats[2 * slot] = row_m[r];
      stats[2 * slot + 1] = row_s[r];
    }
    for (int e = lane; e < p.k; e += 32) {
      cand_v[slot * p.k + e] = list_v[r * p.k + e];
      cand_i[slot * p.k + e] = list_i[r * p.k + e];
    }
  }
}

// Bytes of workspace hidden_topk needs on the current device (its plan's partials).
inline Status hidden_topk_workspace(long long rows, int vocab, int k, size_t* bytes) {
  HiddenTopkPlan plan;
  JETSPEC_RETURN_IF_FAILED(hidden_topk_plan(rows, vocab, k, &plan));
  *bytes = static_cast<size_t>(rows * plan.chunks * (2 + 2 * static_cast<long long>(k)) * 4);
  return cudaSuccess;
}

template <typename T, int MT>
cudaError_t hidden_topk_partials(const HiddenTopkParams& p, const HiddenTopkPlan& plan,
                                 cudaStream_t stream) {
  const auto kernel = hidden_topk_partial_kernel<T, MT>;
  JETSPEC_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(plan.smem)));
  JETSPEC_LAUNCH(kernel, dim3(plan.chunks, plan.m_blocks), kHtThreads, plan.smem, stream, p,
                 plan.tiles_per_cta);
  return cudaGetLastError();
}

// hidden [B, D, H] and weight [V, H] (fp16 / bf16, rows 16-byte aligned, H % 8 == 0); the
// workspace has hidden_topk_workspace bytes.
template <typename T>
Status hidden_topk(const HiddenTopkParams& p, cudaStream_t stream) {
  JETSPEC_RETURN_IF_FAILED(check_range("batch", p.batch, 0));
  JETSPEC_RETURN_IF_FAILED(check_range("depth", p.depth, 0));
  const long long rows = static_cast<long long>(p.batch) * p.depth;
  if (rows == 0) return cudaSuccess;
  if (rows > kMaxGridX) return bad_input("batch * depth = ", rows, " exceeds ", kMaxGridX);
  JETSPEC_RETURN_IF_FAILED(check_range("k", p.k, 1, kMaxTopk));
  if (p.k > p.vocab) return bad_input("k ", p.k, " exceeds vocab ", p.vocab);
  if (p.hidden_dim < kHiddenTopkMultiple || p.hidden_dim % kHiddenTopkMultiple != 0)
    return bad_input("hidden_dim ", p.hidden_dim, " is not a positive multiple of 8");
  HiddenTopkPlan plan;
  JETSPEC_RETURN_IF_FAILED(hidden_topk_plan(rows, p.vocab, p.k, &plan));
  if (plan.m_blocks > kMaxGridYZ)
    return bad_input("batch * depth = ", rows, " rows need ", plan.m_blocks, " blocks of ",
                     16 * plan.mtiles, ", over ", kMaxGridYZ);
  const cudaError_t err = plan.mtiles == 1 ? hidden_topk_partials<T, 1>(p, plan, stream)
                                            : hidden_topk_partials<T, 4>(p, plan, stream);
  JETSPEC_RETURN_IF_ERROR(err);
  TopkParams merge{};
  merge.tokens = p.tokens;
  merge.logprobs = p.logprobs;
  merge.workspace = p.workspace;
  merge.batch = p.batch;
  merge.depth = p.depth;
  merge.vocab = p.vocab;
  merge.k = p.k;
  return topk_merge(merge, plan.chunks, stream);
}

}  // namespace jetspec
