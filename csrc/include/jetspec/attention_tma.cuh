// Tree-masked / block-causal attention, warp-specialised (sm_90a; head dims 64, 128): a producer
// warp streams K/V tiles with TMA into a ring of kTmaStages<HD> shared-memory stages, and the
// consumer warpgroup runs the wgmma kernel's per-block step (attention_wgmma.cuh) on them.
//
// Pipeline: stage s has two mbarriers. full[s] (count 1): the producer's arrive.expect_tx plus
// the TMA bytes; empty[s] (count 128): every consumer thread arrives once its MMAs on the stage
// have completed. Block i of the CTA uses stage i % S in round i / S, so the consumer waits on
// full with parity (i / S) & 1 and the producer on empty with the opposite parity (a fresh
// barrier's "previous phase" counts as complete: the ring starts empty).
//
// TMA tensor maps view a cache as 4-d (Dh, Hkv, rows, outer): contiguous caches as
// (Dh, Hkv, L, B), paged ones as (Dh, Hkv, page_size, pages). A copy is one 64-column block of
// `chunk` rows (chunk = 64 for contiguous caches, gcd(page_size, 64) for paged ones, at least 8
// so that each copy starts on a swizzle atom), so a copy never crosses a page. Rows of the
// sequence's last block past its end hold whatever the cache holds there (or zeros past the
// cache); the consumers zero those V rows before P V reads them (P is 0 there, but 0 * NaN is
// NaN), and the mask hides those keys from S.
//
// Compared with tree_attention_wgmma_kernel: one thread issues a block's copies (1-8 KB
// each, addresses from the block table once per page chunk) instead of 128 threads issuing
// 16-byte cp.async with an address computation each; the consumers never wait on a CTA-wide
// barrier; at Dh 64 the loads run up to 3 blocks ahead. Not done: a second consumer warpgroup
// (ping-pong softmax against MMA) and issuing block j + 1's S MMA before block j's softmax.
// Both need a third stage, which at Dh 128 costs the second CTA per SM (bench/NOTES.md); the
// GPU measurements of this version decide.
#pragma once
#include "jetspec/attention_wgmma.cuh"
#include "jetspec/tma.cuh"

namespace jetspec {

// Ring depth: 2 stages at Dh 128 (80 KB, so 2 CTAs/SM, as the cp.async kernel; 3 stages would be
// 113 KB and 1 CTA/SM), 4 at Dh 64 (73 KB, 3 CTAs/SM).
template <int HD>
constexpr int kTmaStages = HD >= 128 ? 2 : 4;
constexpr int kTmaThreads = kAttnThreads + 32;  // the consumer warpgroup + the producer warp
constexpr int kConsumerBarrier = 1;             // named barrier of the consumer warpgroup

template <int HD>
constexpr size_t attention_tma_smem_bytes() {
  // Q + S stages of K and V (2-byte elements), the 2 S mbarriers, slack for 1024-byte alignment.
  return static_cast<size_t>(kAttnRows + 2 * kTmaStages<HD> * kWgmmaBlockN) * HD * 2 +
         2 * kTmaStages<HD> * sizeof(uint64_t) + kSw128Bytes;
}

#ifdef JETSPEC_WGMMA
// The producer (one thread): for every key block of the CTA, waits for its stage to be free,
// announces the bytes and issues the K and V copies.
template <int HD>
__device__ __forceinline__ void attn_tma_produce(const AttnParams& p, const AttnTile& t,
                                                 const CUtensorMap* tk, const CUtensorMap* tv,
                                                 int chunk, unsigned char* sK, unsigned char* sV,
                                                 uint64_t* full, uint64_t* empty) {
  constexpr int BN = kWgmmaBlockN;
  constexpr int KB = HD / 64;
  constexpr int kTileBytes = BN * HD * 2;
  for (int blk = t.blk_begin; blk < t.blk_end; ++blk) {
    const int i = blk - t.blk_begin, stage = i % kTmaStages<HD>;
    mbar_wait(&empty[stage], ((i / kTmaStages<HD>) & 1) ^ 1);
    const int key0 = blk * BN;
    const int chunks = (min(BN, t.len - key0) + chunk - 1) / chunk;
    mbar_arrive_expect_tx(&full[stage], static_cast<unsigned>(chunks * chunk * 128 * KB * 2));
    for (int c = 0; c < chunks; ++c) {
      const int pos = key0 + c * chunk;
      int row = pos, outer = t.b;
      if (p.block_table != nullptr) {
        outer = p.block_table[t.b * p.bt_stride + pos / p.page_size];
        row = pos % p.page_size;
      }
      const int dst = stage * kTileBytes + c * chunk * 128;
#pragma unroll
      for (int kb = 0; kb < KB; ++kb) {
        tma_load_4d(sK + dst + kb * BN * 128, tk, kb * 64, t.kvh, row, outer, &full[stage]);
        tma_load_4d(sV + dst + kb * BN * 128, tv, kb * 64, t.kvh, row, outer, &full[stage]);
      }
    }
  }
}

// Zeroes V rows from..BN - 1 of a swizzled tile (HD / 64 column blocks of BN rows) and makes the
// zeros visible to the consumers' wgmma (async proxy).
template <int HD>
__device__ __forceinline__ void attn_zero_v_tail(unsigned char* tV, int from) {
  constexpr int BN = kWgmmaBlockN;
  constexpr int CH = HD / 8;  // 16-byte chunks per row
  for (int c = threadIdx.x; c < (BN - from) * CH; c += kAttnThreads) {
    const int r = from + c / CH, col = (c % CH) * 8;
    *reinterpret_cast<uint4*>(sw128_tile_at<uint16_t>(tV, BN, r, col)) = uint4{0u, 0u, 0u, 0u};
  }
  fence_proxy_async();
  named_barrier_sync(kConsumerBarrier, kAttnThreads);
}
#endif

template <typename T, int HD>
__global__ void __launch_bounds__(kTmaThreads)
    tree_attention_tma_kernel(AttnParams p, const __grid_constant__ CUtensorMap tk,
                              const __grid_constant__ CUtensorMap tv, int chunk) {
#ifdef JETSPEC_WGMMA
  static_assert(HD == 64 || HD == 128, "the TMA kernel takes head dims 64 and 128");
  constexpr int BN = kWgmmaBlockN;
  constexpr int kQBytes = kAttnRows * HD * 2;
  constexpr int kTileBytes = BN * HD * 2;
  JETSPEC_DYNAMIC_SMEM(smem_raw);
  unsigned char* sQ = align_smem_1024(smem_raw);
  unsigned char* sK = sQ + kQBytes;                   // [S stages]
  unsigned char* sV = sK + kTmaStages<HD> * kTileBytes;   // [S stages]
  uint64_t* full = reinterpret_cast<uint64_t*>(sV + kTmaStages<HD> * kTileBytes);
  uint64_t* empty = full + kTmaStages<HD>;

  const AttnTile t = attn_tile<BN>(p);
  if (threadIdx.x == kAttnThreads) {
    for (int s = 0; s < kTmaStages<HD>; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kAttnThreads);
    }
    mbar_init_fence();
  }
  __syncthreads();
  if (threadIdx.x >= kAttnThreads) {
    if (threadIdx.x == kAttnThreads) attn_tma_produce<HD>(p, t, &tk, &tv, chunk, sK, sV, full, empty);
    return;
  }

  attn_load_q<T, HD>(p, t.b, t.kvh, t.row0,
                     [&](int r, int col) { return sw128_tile_at<T>(sQ, kAttnRows, r, col); });
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async();  // this thread's cp.async data, before the async proxy reads it
  named_barrier_sync(kConsumerBarrier, kAttnThreads);

  float o[HD / 8][4];
#pragma unroll
  for (int dt = 0; dt < HD / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.f, 0.f};

  for (int blk = t.blk_begin; blk < t.blk_end; ++blk) {
    const int i = blk - t.blk_begin, stage = i % kTmaStages<HD>;
    mbar_wait(&full[stage], (i / kTmaStages<HD>) & 1);
    unsigned char* tV = sV + stage * kTileBytes;
    if (t.len - blk * BN < BN) attn_zero_v_tail<HD>(tV, t.len - blk * BN);
    wgmma_attend_block<T, HD>(sQ, sK + stage * kTileBytes, tV, p, t, blk, o, m_run, l_run);
    mbar_arrive(&empty[stage]);
  }
  attn_store<T, HD>(p, o, m_run, l_run, t.b, t.kvh, t.split, t.row0);
#else
  __trap();  // as tree_attention_wgmma_kernel: never launched where sm_90a code cannot run
#endif
}

// Rows per TMA copy for this cache layout, or 0 when the kernel cannot take it (a page size that
// is not a multiple of 8).
inline int attention_tma_chunk(const AttnParams& p) {
  if (p.block_table == nullptr) return kWgmmaBlockN;
  int a = p.page_size, b = kWgmmaBlockN;
  while (b != 0) {
    const int r = a % b;
    a = b;
    b = r;
  }
  return a % 8 == 0 ? a : 0;
}

// Launches the TMA kernel, or returns cudaErrorNotSupported when the cache layout cannot be
// described by tensor maps (strides not multiples of 16 bytes, pages not multiples of 8 rows).
template <typename T, int HD>
cudaError_t tree_attention_tma(const AttnParams& p, cudaStream_t stream) {
  const int chunk = attention_tma_chunk(p);
  if (chunk == 0 || p.cache_outer <= 0 || p.page_size <= 0) return cudaErrorNotSupported;
  CUtensorMap maps[2];
  const void* bases[2] = {p.k_cache, p.v_cache};
  const Strides4* strides[2] = {&p.sk, &p.sv};
  for (int m = 0; m < 2; ++m) {
    const Strides4& st = *strides[m];
    if (st.s0 < 0 || st.s1 < 0 || st.s2 < 0) return cudaErrorNotSupported;
    const uint64_t dims[4] = {static_cast<uint64_t>(HD), static_cast<uint64_t>(p.hkv),
                              static_cast<uint64_t>(p.page_size),
                              static_cast<uint64_t>(p.cache_outer)};
    const uint64_t bytes[3] = {static_cast<uint64_t>(st.s2) * 2, static_cast<uint64_t>(st.s1) * 2,
                               static_cast<uint64_t>(st.s0) * 2};
    const uint32_t box[4] = {64, 1, static_cast<uint32_t>(chunk), 1};
    JETSPEC_RETURN_IF_ERROR(encode_tensor_map_4d(&maps[m], bases[m], dims, bytes, box));
  }
  return attention_launch<T>(p, tree_attention_tma_kernel<T, HD>, attention_tma_smem_bytes<HD>(),
                             HD, kTmaThreads, stream, maps[0], maps[1], chunk);
}

}  // namespace jetspec
