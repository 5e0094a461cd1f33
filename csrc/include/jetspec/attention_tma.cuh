// Tree-masked / block-causal attention, warp-specialised (sm_90a; head dims 64, 128): one producer
// thread streams K and V tiles with TMA into two rings of shared-memory stages, and each of the
// WGS consumer warpgroups (64 packed rows each) runs the wgmma block step (attention_wgmma.cuh)
// with block j + 1's S = Q K^T MMA in flight while it computes block j's softmax (the tensor
// cores and the softmax overlap inside the warpgroup, FlashAttention-3's intra-warpgroup
// pipelining).
//
// Two consumer warpgroups (WGS = 2, used when a (sequence, kv head) has more than 64 packed rows)
// share every K/V tile between 128 rows: half the shared-memory fills and half the L2 -> SM
// traffic per FLOP of one warpgroup per CTA. At B1 L4K N64 (GQA 4: 256 rows per kv head) one
// warpgroup per CTA reads each K/V byte from L2 four times (67 MB per call); two read it twice.
// With the producer warpgroup that is 384 threads and one CTA per SM (by registers): 8 consumer
// warps per SM.
//
// Rings: K and V have kTmaStages<HD, WGS> stages each, every stage two mbarriers. full (count 1):
// the producer's arrive.expect_tx plus the TMA bytes; empty (count 128 WGS): every consumer
// thread arrives once the MMAs reading the stage have completed. Block i of the CTA uses stage
// i % S in round i / S, so the consumer waits on full with parity (i / S) & 1 and the producer
// on empty with the opposite parity (a fresh barrier's "previous phase" counts as complete: the
// rings start empty). Separate rings let K run ahead of V: K_j is released as soon as S_j is done,
// while V_j is held until P_j V_j is, so two stages each suffice for the overlap.
//
// Consumer step for block j (S_j complete): wait K_{j+1}, issue S_{j+1}; release K_j;
// softmax(S_j) while S_{j+1} runs; wait V_j, issue P_j V_j, wait for both groups (the next
// softmax rescales O and reads S_{j+1}), release V_j.
//
// TMA tensor maps view a cache as 4-d (Dh, Hkv, rows, outer): contiguous caches as
// (Dh, Hkv, L, B), paged ones as (Dh, Hkv, page_size, pages). A copy is one 64-column block of
// `chunk` rows (chunk = 64 for contiguous caches, gcd(page_size, 64) for paged ones, at least 8
// so that each copy starts on a swizzle atom), so a copy never crosses a page. Rows of the
// sequence's last block past its end hold whatever the cache holds there (or zeros past the
// cache); the consumers zero those V rows before P V reads them (P is 0 there, but 0 * NaN is
// NaN), and the mask hides those keys from S.
//
// Not done: ping-pong scheduling of the two warpgroups (named barriers ordering one's softmax
// against the other's MMAs, as FlashAttention-3); here they run free. The GPU measurements
// decide whether it is worth it.
#pragma once
#include <numeric>

#include "jetspec/attention_wgmma.cuh"
#include "jetspec/tma.cuh"

namespace jetspec {

// Stages per ring. One consumer warpgroup: 2 at Dh 128 (81 KB in all, so that shared memory
// allows 2 CTAs/SM; 3 would be 113 KB and 1 CTA/SM), 4 at Dh 64 (73 KB; registers, 142 x 160
// threads, allow 2 CTAs/SM). Whether the Dh 128 kernel's 181 registers let two CTAs share an SM is
// for the GPU to show (bench/NOTES.md). Two: one CTA per SM by registers, so 4 (161 KB at Dh 128,
// 81 KB at Dh 64).
template <int HD, int WGS>
constexpr int kTmaStages = WGS == 1 && HD >= 128 ? 2 : 4;
static_assert(kTmaStages<64, 1> >= 2 && kTmaStages<128, 1> >= 2,
              "S_{j+1} needs K_{j+1} while K_j is held");
// The consumer warpgroups + the producer: one warp, or with two consumer warpgroups a whole
// warpgroup, so that setmaxnreg can move its registers to the consumers (at 288 threads ptxas
// caps every thread at 168 registers and the Dh 128 consumers spill; 384 threads with the
// producer at 40 and the consumers at 232 fit the 64 K register file: 128 x 40 + 256 x 232).
template <int WGS>
constexpr int kTmaThreads = WGS * kAttnThreads + (WGS == 1 ? 32 : kAttnThreads);
constexpr int kProducerRegs = 40, kConsumerRegs = 232;
static_assert(kAttnThreads * (kProducerRegs + 2 * kConsumerRegs) <= 64 * 1024,
              "the register split must fit the register file");
// Named barriers: 1 + w is consumer warpgroup w's own; the V-tail one is all consumers' (with
// one warpgroup, its own).
template <int WGS>
constexpr int kTailBarrier = WGS == 1 ? 1 : 3;

template <int HD, int WGS>
constexpr size_t attention_tma_smem_bytes() {
  // Q + S stages of K and of V (2-byte elements), 4 S mbarriers, slack for 1024-byte alignment.
  constexpr int S = kTmaStages<HD, WGS>;
  return static_cast<size_t>(WGS * kAttnRows + 2 * S * kWgmmaBlockN) * HD * 2 +
         4 * S * sizeof(uint64_t) + kSw128Bytes;
}

#ifdef JETSPEC_WGMMA
// A ring of S shared-memory tiles of one tensor (K or V) with their full / empty mbarriers.
struct TmaRing {
  unsigned char* tiles;  // [S][HD / 64 column blocks][kWgmmaBlockN rows][128 B], swizzled
  uint64_t* full;        // [S]
  uint64_t* empty;       // [S]
};

// Producer side: waits until block i's stage is free, then copies key block blk of `map` into it
// (the chunks up to the sequence's end) and announces the bytes on its full barrier.
template <int HD, int S>
__device__ __forceinline__ void tma_fill_stage(const TmaRing& r, int i, const CUtensorMap* map,
                                               const AttnParams& p, const AttnTile& t, int blk,
                                               int chunk) {
  constexpr int BN = kWgmmaBlockN, KB = HD / 64;
  const int stage = i % S;
  mbar_wait(&r.empty[stage], ((i / S) & 1) ^ 1);
  const int key0 = blk * BN;
  const int chunks = (min(BN, t.len - key0) + chunk - 1) / chunk;
  mbar_arrive_expect_tx(&r.full[stage], static_cast<unsigned>(chunks * chunk * 128 * KB));
  unsigned char* tile = r.tiles + stage * BN * HD * 2;
  for (int c = 0; c < chunks; ++c) {
    const int pos = key0 + c * chunk;
    int row = pos, outer = t.b;
    if (p.block_table != nullptr) {
      outer = p.block_table[t.b * p.block_table_batch_stride + pos / p.page_size];
      row = pos % p.page_size;
    }
#pragma unroll
    for (int kb = 0; kb < KB; ++kb)
      tma_load_4d(tile + kb * BN * 128 + c * chunk * 128, map, kb * 64, t.kvh, row, outer,
                  &r.full[stage]);
  }
}

// Consumer side: block i's tile once its copies have landed / the stage handed back.
template <int HD, int S>
__device__ __forceinline__ unsigned char* tma_wait_stage(const TmaRing& r, int i) {
  mbar_wait(&r.full[i % S], (i / S) & 1);
  return r.tiles + (i % S) * kWgmmaBlockN * HD * 2;
}
template <int S>
__device__ __forceinline__ void tma_release_stage(const TmaRing& r, int i) {
  mbar_arrive(&r.empty[i % S]);
}

// Zeroes V rows from..BN - 1 of a swizzled tile (HD / 64 column blocks of BN rows), shared by all
// WGS consumer warpgroups (every consumer thread calls it), and makes the zeros visible to their
// wgmma (async proxy).
template <int HD, int WGS>
__device__ __forceinline__ void attn_zero_v_tail(unsigned char* tV, int from) {
  constexpr int BN = kWgmmaBlockN;
  constexpr int CH = HD / 8;  // 16-byte chunks per row
  for (int c = threadIdx.x; c < (BN - from) * CH; c += WGS * kAttnThreads) {
    const int r = from + c / CH, col = (c % CH) * 8;
    st_shared_zero16(sw128_tile_at<uint16_t>(tV, BN, r, col));
  }
  fence_proxy_async();
  named_barrier_sync(kTailBarrier<WGS>, WGS * kAttnThreads);
}

// One consumer step for key block blk (the CTA's i-th): S_blk is complete in s_cur. Issues
// S_{blk+1} into s_next (if any), releases K_blk, runs the softmax while S_{blk+1} computes,
// then O += P V, waits for both groups and releases V_blk. Called with the two S buffers swapped
// on alternate blocks (no register copies).
template <typename T, int HD, int WGS>
__device__ __forceinline__ void tma_consume_block(const AttnParams& p, const AttnTile& t, int blk,
                                                  int i, const unsigned char* sQ,
                                                  const TmaRing& kr, const TmaRing& vr,
                                                  float (&s_cur)[kWgmmaBlockN / 8][4],
                                                  float (&s_next)[kWgmmaBlockN / 8][4],
                                                  float (&o)[HD / 8][4], float (&m_run)[2],
                                                  float (&l_run)[2]) {
  constexpr int BN = kWgmmaBlockN, S = kTmaStages<HD, WGS>;
  const bool more = blk + 1 < t.blk_end;
  // Block blk's softmax and P V (S_blk was retired by the previous step's final wait, or after
  // its issue for the first block). Called inside both branches: ptxas serialises every wgmma of
  // the kernel (warning C7515) when a group issued in one branch is retired after the branches
  // rejoin.
  auto finish = [&]() {
    tma_release_stage<S>(kr, i);  // K_blk is read by S_blk only
    wgmma_fence_operand(s_cur);
    wgmma_fence_output<HD>(o);
    attn_scale_mask<BN>(s_cur, p, t.b, t.prefix, t.tree_row, blk * BN);
    attn_online_softmax<BN, HD>(s_cur, o, m_run, l_run);
    unsigned char* tV = tma_wait_stage<HD, S>(vr, i);
    if (t.len - blk * BN < BN) attn_zero_v_tail<HD, WGS>(tV, t.len - blk * BN);
    wgmma_issue_pv<T, HD>(o, s_cur, tV);
    wgmma_wait<0>();
    wgmma_fence_output<HD>(o);
    tma_release_stage<S>(vr, i);
  };
  if (more) {
    wgmma_issue_qk<T, HD>(s_next, sQ, tma_wait_stage<HD, S>(kr, i + 1));  // runs during the softmax
    finish();  // its final wait retires S_{blk+1} too
    wgmma_fence_operand(s_next);
  } else {
    finish();
  }
}
#endif

template <typename T, int HD, int WGS>
__global__ void __launch_bounds__(kTmaThreads<WGS>, 1)
    tree_attention_tma_kernel(AttnParams p, const __grid_constant__ CUtensorMap tk,
                              const __grid_constant__ CUtensorMap tv, int chunk) {
  pdl_begin();
#ifdef JETSPEC_WGMMA
  static_assert(HD == 64 || HD == 128, "the TMA kernel takes head dims 64 and 128");
  static_assert(WGS == 1 || WGS == 2, "one or two consumer warpgroups");
  constexpr int BN = kWgmmaBlockN, S = kTmaStages<HD, WGS>;
  constexpr int kTileBytes = BN * HD * 2, kQBytes = kAttnRows * HD * 2;
  constexpr int kConsumers = WGS * kAttnThreads;
  JETSPEC_DYNAMIC_SMEM(smem_raw);
  unsigned char* sQs = align_smem_1024(smem_raw);   // [WGS] Q tiles of 64 rows
  unsigned char* tiles = sQs + WGS * kQBytes;        // [S] K tiles, then [S] V tiles
  uint64_t* bars = reinterpret_cast<uint64_t*>(tiles + 2 * S * kTileBytes);
  const TmaRing kr{tiles, bars, bars + S};
  const TmaRing vr{tiles + S * kTileBytes, bars + 2 * S, bars + 3 * S};

  const AttnTile t = attn_tile<BN>(p, WGS);
  if (threadIdx.x == kConsumers) {
    for (int s = 0; s < S; ++s) {
      mbar_init(&kr.full[s], 1);
      mbar_init(&kr.empty[s], kConsumers);
      mbar_init(&vr.full[s], 1);
      mbar_init(&vr.empty[s], kConsumers);
    }
    mbar_init_fence();
  }
  __syncthreads();
  if (threadIdx.x >= kConsumers) {  // the producer: one thread issues every copy
    if constexpr (WGS > 1) warpgroup_reg_dealloc<kProducerRegs>();
    if (threadIdx.x == kConsumers) {
      for (int blk = t.blk_begin; blk < t.blk_end; ++blk) {
        const int i = blk - t.blk_begin;
        tma_fill_stage<HD, S>(kr, i, &tk, p, t, blk, chunk);
        tma_fill_stage<HD, S>(vr, i, &tv, p, t, blk, chunk);
      }
    }
    return;
  }

  if constexpr (WGS > 1) warpgroup_reg_alloc<kConsumerRegs>();
  // Each warpgroup its own 64 Q rows (t.row0 is its own).
  const int wg = WGS == 1 ? 0 : static_cast<int>(threadIdx.x) / kAttnThreads;
  unsigned char* sQ = sQs + wg * kQBytes;
  attn_load_q<T, HD>(p, t.b, t.kvh, t.row0,
                     [&](int r, int col) { return sw128_tile_at<T>(sQ, kAttnRows, r, col); });
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async();  // this thread's cp.async data, before the async proxy reads it
  if (wg == 0) {  // constant barrier ids: with a computed one ptxas reserves all 16
    named_barrier_sync(1, kAttnThreads);
  } else {
    named_barrier_sync(2, kAttnThreads);
  }

  float o[HD / 8][4];
#pragma unroll
  for (int dt = 0; dt < HD / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.f, 0.f};
  float sa[BN / 8][4], sb[BN / 8][4];
  if (t.blk_begin < t.blk_end) {  // S_0, waited for here (see finish() on serialisation)
    wgmma_issue_qk<T, HD>(sa, sQ, tma_wait_stage<HD, S>(kr, 0));
    wgmma_wait<0>();
  }
  for (int blk = t.blk_begin; blk < t.blk_end; blk += 2) {
    const int i = blk - t.blk_begin;
    tma_consume_block<T, HD, WGS>(p, t, blk, i, sQ, kr, vr, sa, sb, o, m_run, l_run);
    if (blk + 1 < t.blk_end)
      tma_consume_block<T, HD, WGS>(p, t, blk + 1, i + 1, sQ, kr, vr, sb, sa, o, m_run, l_run);
  }
  attn_store<T, HD>(p, o, m_run, l_run, t.b, t.kvh, t.split, t.row0);
#else
  __trap();  // as tree_attention_wgmma_kernel: never launched where sm_90a code cannot run
#endif
}

// Rows per TMA copy for this cache layout and key block (block_n keys), or 0 when a kernel cannot
// take it (a page size that is not a multiple of 8).
inline int attention_tma_chunk(const AttnParams& p, int block_n = kWgmmaBlockN) {
  if (p.block_table == nullptr) return block_n;
  const int chunk = std::gcd(p.page_size, block_n);
  return chunk % kAttnTmaPageMultiple == 0 ? chunk : 0;
}

// The K and V tensor maps of the TMA kernels: the cache as 4-d (Dh, Hkv, rows, outer) with boxes
// of 64 columns x `chunk` rows; `who` names the kernel in messages. Bad input for layouts tensor
// maps cannot describe (negative strides, strides that are not multiples of 16 bytes).
template <int HD>
Status attention_tensor_maps(const AttnParams& p, int chunk, CUtensorMap (&maps)[2],
                             const char* who) {
  JETSPEC_RETURN_IF_FAILED(check_range("cache_outer", p.cache_outer, 1));
  JETSPEC_RETURN_IF_FAILED(check_range("hkv", p.hkv, 1));
  const void* bases[2] = {p.k_cache, p.v_cache};
  const Strides4* strides[2] = {&p.k_cache_strides, &p.v_cache_strides};
  const char* names[2] = {"k_cache", "v_cache"};
  for (int m = 0; m < 2; ++m) {
    const Strides4& st = *strides[m];
    if (st.batch < 0 || st.row < 0 || st.head < 0) {
      return bad_input(names[m], " strides (", st.batch, ", ", st.row, ", ", st.head,
                       ") are negative (", who, ")");
    }
    const uint64_t dims[4] = {static_cast<uint64_t>(HD), static_cast<uint64_t>(p.hkv),
                              static_cast<uint64_t>(p.page_size),
                              static_cast<uint64_t>(p.cache_outer)};
    const uint64_t bytes[3] = {static_cast<uint64_t>(st.head) * 2,
                               static_cast<uint64_t>(st.row) * 2,
                               static_cast<uint64_t>(st.batch) * 2};
    const uint32_t box[4] = {64, 1, static_cast<uint32_t>(chunk), 1};
    JETSPEC_RETURN_IF_FAILED(encode_tensor_map_4d(&maps[m], names[m], bases[m], dims, bytes, box));
  }
  return Status();
}

// Launches the TMA kernel (two consumer warpgroups when a (sequence, kv head) has more than 64
// packed rows, else one); refuses cache layouts that tensor maps cannot describe (pages not
// multiples of 8 rows, strides not multiples of 16 bytes).
template <typename T, int HD>
Status tree_attention_tma(const AttnParams& p, cudaStream_t stream) {
  JETSPEC_RETURN_IF_FAILED(check_range("page_size", p.page_size, 1));
  const int chunk = attention_tma_chunk(p);
  if (chunk == 0)
    return bad_input("page_size ", p.page_size, " is not a multiple of 8 (kernel 3, tma)");
  CUtensorMap maps[2];
  JETSPEC_RETURN_IF_FAILED(attention_tensor_maps<HD>(p, chunk, maps, "kernel 3, tma"));
  if (static_cast<long long>(p.n) * p.group > kAttnRows) {
    return attention_launch<T>(p, tree_attention_tma_kernel<T, HD, 2>,
                               attention_tma_smem_bytes<HD, 2>(), HD, kTmaThreads<2>,
                               2 * kAttnRows, stream, maps[0], maps[1], chunk);
  }
  return attention_launch<T>(p, tree_attention_tma_kernel<T, HD, 1>,
                             attention_tma_smem_bytes<HD, 1>(), HD, kTmaThreads<1>, kAttnRows,
                             stream, maps[0], maps[1], chunk);
}

}  // namespace jetspec
