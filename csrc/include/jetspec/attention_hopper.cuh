// Tree-masked / block-causal attention for Hopper (sm_90a; fp16 / bf16; head dims 64, 128): one
// kernel family, FlashAttention-3's mechanisms, every tuning choice a template parameter
// (HopperAttnCfg) so that the sweep harness (bench/attn_sweep) can instantiate each variant.
//
// CTA: kWgs consumer warpgroups of 64 GQA-packed rows each (row r = tree row r / G, query head
// kvh * G + r % G: every K/V tile serves all G heads of its kv head) plus one producer warpgroup
// whose warp 0 issues every K/V copy with TMA (setmaxnreg moves the producer's registers to the
// consumers). The wide variant (two consumer warpgroups, 128-row Q tiles) is for a (sequence,
// kv head) with more than 64 packed rows; the small one (one warpgroup, a deeper ring) for the
// memory-bound trees of at most 64 packed rows.
//
// Consumer step i (block i - 1's P is in registers, S_i's K stage has landed):
//   [ping-pong: wait for this warpgroup's turn]  issue S_i = Q K_i^T, then O += P_{i-1} V_{i-1}
//   [hand the turn to the other warpgroup]       wait_group 1 (S_i done, P V still running)
//   release K_i; mask (tree blocks only) + online softmax of S_i under the P V GEMM;
//   wait_group 0; release V_{i-1}; O *= alpha_i; P_i = S_i packed to 16 bits.
// So QK(i) and PV(i-1) go to the tensor cores back to back, and each warpgroup waits only for
// what it reads next. With two warpgroups, named barriers 4 / 5 order their issues (ping-pong):
// warpgroup 0 issues, then 1, then 0 ..., so one's softmax runs while the other's GEMMs do.
// Blocks that hold no tree key (all positions < prefix) run an unmasked loop; the blocks from
// the first that reaches the tree run the masked loop (tree mask bits / causal / full; keys past
// the sequence's end are hidden). Softmax: the running max is kept in raw scores and the scale
// folded into one FMA before ex2.approx.ftz (kFastExp; else exp2f after a multiply: the old
// kernels' way, an ablation).
//
// K and V have separate rings of kStages stages (full mbarrier: the producer's expect_tx + the
// TMA bytes; empty: every consumer thread arrives). TMA copies are boxes of 64 columns x `chunk`
// rows: chunk = kBlockN for contiguous caches, gcd(page size, kBlockN) for paged ones (a copy
// never crosses a page; each is placed by a block_table lookup), so a 128-key block of a page-16
// cache is 8 copies per 64 columns; the producer warp's 32 lanes issue them in parallel. Copies
// stop at the sequence's end; the V rows past it hold whatever the cache or an earlier block left,
// so the consumers zero them before P V reads them (P is 0 there, but 0 * NaN is NaN).
//
// Split-KV: blockIdx.z takes an even share of the key blocks; the split count comes from the real
// occupancy (cudaOccupancyMaxActiveBlocksPerMultiprocessor; the simulator computes it) and a
// wave-efficiency rule (hopper_attention_splits). Partials are merged by
// attention_combine_kernel (attention.cuh).
#pragma once
#include <algorithm>
#include <cmath>
#include <numeric>
#include <type_traits>

#include "jetspec/attention_wgmma.cuh"
#include "jetspec/hopper_ops.cuh"
#include "jetspec/tma.cuh"

namespace jetspec {

// Ablations for the sweep harness (results are wrong by design; they time what is left).
enum HopperAblate : int { kAblateNone = 0, kAblateSoftmax = 1, kAblateLoads = 2, kAblatePv = 4 };

// One variant: WGS consumer warpgroups (64 rows each), BN keys a block, STAGES stages per ring,
// ping-pong between two warpgroups, fast exponential, the CTAs per SM the launch bounds ask for,
// and an ablation mask.
template <int WGS, int BN, int STAGES, bool PINGPONG = true, bool FAST_EXP = true, int CTAS = 1,
          int ABLATE = kAblateNone>
struct HopperAttnCfg {
  static_assert(WGS == 1 || WGS == 2, "one or two consumer warpgroups");
  static_assert(BN == 64 || BN == 128, "key blocks of 64 or 128 (one wgmma N)");
  static_assert(STAGES >= 2, "S_i needs K_i while K_{i-1} may be held; V likewise");
  static constexpr int kWgs = WGS, kBlockN = BN, kStages = STAGES, kCtasPerSm = CTAS;
  static constexpr int kAblate = ABLATE;
  static constexpr bool kPingPong = PINGPONG && WGS == 2, kFastExp = FAST_EXP;
  static constexpr int kRows = WGS * kAttnRows;
  static constexpr int kConsumers = WGS * kAttnThreads;
  static constexpr int kThreads = kConsumers + kAttnThreads;  // + the producer warpgroup
  // Registers a thread gets at launch (the launch bounds' cap), and the setmaxnreg split when
  // that cap is below what the consumers need: the producer drops to 24, the consumers take the
  // rest (128 x 24 + 256 x 240 = 64.5 K at 384 threads, FlashAttention-3's split).
  static constexpr int kLaunchRegs = std::min(65536 / (kThreads * CTAS) / 8 * 8, 255);
  static constexpr bool kRegSplit = kLaunchRegs < 232;
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs =
      std::min(240, (kLaunchRegs * (WGS + 1) - kProducerRegs) / WGS / 8 * 8);
  static_assert(!kRegSplit || kProducerRegs + WGS * kConsumerRegs <= kLaunchRegs * (WGS + 1),
                "the register split must fit what the CTA holds at launch");
};

// The variants _C launches: wide for more than 64 packed rows per (sequence, kv head), small
// otherwise. docs/kernels.md ("Hopper attention family") says why these and what the sweep tries.
template <int HD>
using HopperWide = HopperAttnCfg<2, 128, HD >= 128 ? 2 : 3>;
template <int HD>
using HopperSmall = HopperAttnCfg<1, 64, 4, true, true, HD >= 128 ? 1 : 2>;  // Dh 64: 73 KB

template <int HD, class Cfg>
constexpr size_t attention_hopper_smem_bytes() {
  // Q + STAGES K and V tiles (2-byte elements), 4 STAGES mbarriers, slack for 1024-byte alignment.
  return static_cast<size_t>(Cfg::kRows + 2 * Cfg::kStages * Cfg::kBlockN) * HD * 2 +
         4 * Cfg::kStages * sizeof(uint64_t) + kSw128Bytes;
}

#ifdef JETSPEC_WGMMA
// Named barriers (constant ids: with a computed id ptxas reserves all 16): 1 + w is consumer
// warpgroup w's own (its Q copy), 3 all consumers' (the V tail), 4 + w warpgroup w's turn to
// issue (ping-pong).
constexpr int kHopperTailBarrier = 3;

// Zeroes rows from..BN - 1 of the V tile tV (HD / 64 swizzled column blocks of BN rows), by every
// consumer thread, and makes the zeros visible to every consumer's wgmma.
template <int HD, class Cfg>
__device__ __forceinline__ void hopper_zero_v_tail(unsigned char* tV, int from) {
  constexpr int BN = Cfg::kBlockN, CH = HD / 8;
  for (int c = threadIdx.x; c < (BN - from) * CH; c += Cfg::kConsumers) {
    const int r = from + c / CH, col = (c % CH) * 8;
    st_shared_zero16(sw128_tile_at<uint16_t>(tV, BN, r, col));
  }
  fence_proxy_async();
  named_barrier_sync(kHopperTailBarrier, Cfg::kConsumers);
}

// Hides the keys of block key0 .. key0 + BN - 1 that this thread's two rows may not see: the
// prefix is visible, then tail key j = pos - prefix by the tree mask bit (i, j), j <= i (causal)
// or j < n (full); keys at or past the sequence's end never. The tree mask of a row is read as
// BN / 32 + 1 words once and shifted into BN bits (no per-key load).
template <int BN>
__device__ __forceinline__ void hopper_mask(float (&s)[BN / 8][4], const AttnParams& p,
                                            const AttnTile& t, int key0) {
  const int tq = threadIdx.x & 3;
  const int jbase = key0 - t.prefix + 2 * tq;  // tail index of this thread's column 0
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    const int i = t.tree_row[h2];
    // Column c0 = 8 nt + e of this thread (key jbase + c0) is a prefix key when c0 < pre, a
    // visible tail key when c0 < lim and its mask bit (if any) is set.
    const int pre = -jbase;
    const int lim = (p.tail == kTailCausal ? i + 1 : p.n) - jbase;
    uint32_t bits[BN / 32];  // bit c0 of word c0 / 32: the mask bit of column c0 (8 nt + e)
#pragma unroll
    for (int q = 0; q < BN / 32; ++q) bits[q] = ~0u;
    if (p.tail == kTailMask) {
      const int words = (p.n + 31) >> 5;
      const int w0 = jbase >> 5;  // floor
      const int32_t* row = p.tree_mask + t.b * p.tree_mask_batch_stride + i * p.tree_mask_row_stride;
      uint32_t w[BN / 32 + 1];
#pragma unroll
      for (int q = 0; q <= BN / 32; ++q) {
        const int wi = w0 + q;
        w[q] = wi >= 0 && wi < words ? static_cast<uint32_t>(row[wi]) : 0u;
      }
#pragma unroll
      for (int q = 0; q < BN / 32; ++q) bits[q] = __funnelshift_r(w[q], w[q + 1], jbase & 31);
    }
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int c0 = nt * 8 + e;  // a compile-time column offset
        const bool bit = (bits[c0 >> 5] >> (c0 & 31)) & 1u;
        if (!(c0 < pre || (c0 < lim && bit))) s[nt][2 * h2 + e] = -INFINITY;
      }
    }
  }
}

// 2^x: ex2.approx.ftz, or exp2f (the ablation).
template <bool FAST>
__device__ __forceinline__ float hopper_exp2(float x) {
  if constexpr (FAST) {
    return fast_exp2(x);
  } else {
    return exp2f(x);
  }
}

// Online softmax of one S block (a row spread over the 4 threads of a quad; raw scores, the
// scale folded into the exponent): S becomes P = 2^(S c - m c) with c = scale * log2(e), the
// running max m (raw) and the thread's partial row sums l are updated, alpha = 2^((m_old - m) c)
// is what O must be multiplied by.
template <int NT, bool FAST>
__device__ __forceinline__ void hopper_softmax(float (&s)[NT][4], float (&m)[2], float (&l)[2],
                                               float (&alpha)[2], float c) {
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    float mx = m[h2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * h2], s[nt][2 * h2 + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mc = (mx == -INFINITY ? 0.f : mx) * c;  // no visible key yet: no NaN
    alpha[h2] = hopper_exp2<FAST>(m[h2] * c - mc);
    float sum = 0.f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& v = s[nt][2 * h2 + e];
        if constexpr (FAST) {
          v = hopper_exp2<true>(fmaf(v, c, -mc));
        } else {
          v = hopper_exp2<false>(v * c - mc);
        }
        sum += v;
      }
    }
    l[h2] = l[h2] * alpha[h2] + sum;
    m[h2] = mx;
  }
}

template <typename T, int HD, class Cfg>
__device__ __forceinline__ void hopper_attention_body(const AttnParams& p, const CUtensorMap* tk,
                                                      const CUtensorMap* tv, int chunk) {
  constexpr int WGS = Cfg::kWgs, BN = Cfg::kBlockN, S = Cfg::kStages, KB = HD / 64;
  constexpr int kTileBytes = BN * HD * 2, kQBytes = Cfg::kRows * HD * 2;
  constexpr int kConsumers = Cfg::kConsumers;
  constexpr bool kNoLoads = Cfg::kAblate & kAblateLoads;
  constexpr bool kNoSoftmax = Cfg::kAblate & kAblateSoftmax;
  constexpr bool kNoPv = Cfg::kAblate & kAblatePv;
  JETSPEC_DYNAMIC_SMEM(smem_raw);
  unsigned char* sQ = align_smem_1024(smem_raw);  // [KB][kRows][128 B]
  unsigned char* sK = sQ + kQBytes;                // [S][KB][BN][128 B]
  unsigned char* sV = sK + S * kTileBytes;         // [S][KB][BN][128 B]
  uint64_t* bars = reinterpret_cast<uint64_t*>(sV + S * kTileBytes);
  uint64_t* k_full = bars;
  uint64_t* k_empty = bars + S;
  uint64_t* v_full = bars + 2 * S;
  uint64_t* v_empty = bars + 3 * S;

  const AttnTile t = attn_tile<BN>(p, WGS);
  const int nblk = t.blk_end - t.blk_begin;
  if (threadIdx.x == kConsumers) {
    for (int s = 0; s < S; ++s) {
      mbar_init(&k_full[s], 1);
      mbar_init(&k_empty[s], kConsumers);
      mbar_init(&v_full[s], 1);
      mbar_init(&v_empty[s], kConsumers);
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (threadIdx.x >= kConsumers) {
    // ---- producer warpgroup: warp 0 issues every copy, the other warps leave ----
    if constexpr (Cfg::kRegSplit) warpgroup_reg_dealloc<Cfg::kProducerRegs>();
    if (threadIdx.x >= kConsumers + 32) return;
    const int lane = threadIdx.x & 31;
    // Waits for block i's stage of a ring, then copies key block blk_begin + i into it.
    auto fill = [&](unsigned char* tiles, uint64_t* full, uint64_t* empty, const CUtensorMap* map,
                    int i) {
      const int stage = i % S;
      if (lane == 0) mbar_wait(&empty[stage], ((i / S) & 1) ^ 1);
      const int key0 = (t.blk_begin + i) * BN;
      const int chunks = (min(BN, t.len - key0) + chunk - 1) / chunk;
      if (lane == 0) {
        if constexpr (kNoLoads) {
          mbar_arrive(&full[stage]);
        } else {
          mbar_arrive_expect_tx(&full[stage], static_cast<unsigned>(chunks * KB * chunk * 128));
        }
      }
      __syncwarp();
      if constexpr (!kNoLoads) {
        unsigned char* tile = tiles + stage * kTileBytes;
        for (int c = lane; c < chunks * KB; c += 32) {
          const int ci = c % chunks, kb = c / chunks;
          const int pos = key0 + ci * chunk;
          int row = pos, outer = t.b;
          if (p.block_table != nullptr) {
            outer = p.block_table[t.b * p.block_table_batch_stride + pos / p.page_size];
            row = pos % p.page_size;
          }
          tma_load_4d(tile + kb * BN * 128 + ci * chunk * 128, map, kb * 64, t.kvh, row, outer,
                      &full[stage]);
        }
      }
    };
    for (int i = 0; i < nblk; ++i) {
      if (i == 0) fill(sK, k_full, k_empty, tk, 0);
      if (i + 1 < nblk) fill(sK, k_full, k_empty, tk, i + 1);
      fill(sV, v_full, v_empty, tv, i);
    }
  } else {
    // ---- consumer warpgroups ----
    if constexpr (Cfg::kRegSplit) warpgroup_reg_alloc<Cfg::kConsumerRegs>();
    const int wg = WGS == 1 ? 0 : static_cast<int>(threadIdx.x) / kAttnThreads;
    attn_load_q<T, HD>(p, t.b, t.kvh, t.row0, [&](int r, int col) {
      return sw128_tile_at<T>(sQ, Cfg::kRows, wg * kAttnRows + r, col);
    });
    cp_async_commit();
    cp_async_wait<0>();
    fence_proxy_async();  // this thread's cp.async data, before the async proxy reads it
    if (wg == 0) {
      named_barrier_sync(1, kAttnThreads);
    } else {
      named_barrier_sync(2, kAttnThreads);
    }
    auto pp_sync = [&]() {
      if constexpr (Cfg::kPingPong) {
        if (wg == 0) {
          named_barrier_sync(4, 2 * kAttnThreads);
        } else {
          named_barrier_sync(5, 2 * kAttnThreads);
        }
      }
    };
    // Hands the turn to the other warpgroup; warpgroup 1 skips its last hand-over, so both
    // barriers end balanced (warpgroup 0's first turn is warpgroup 1's arrival below).
    auto pp_arrive = [&](bool last) {
      if constexpr (Cfg::kPingPong) {
        if (wg == 0) {
          named_barrier_arrive(5, 2 * kAttnThreads);
        } else if (!last) {
          named_barrier_arrive(4, 2 * kAttnThreads);
        }
      }
    };

    // Descriptors: Q rows 64 wg .. of column block kk / 4, 32 (kk % 4) bytes in (K-major); K
    // likewise; V (MN-major) 16 keys = 2048 bytes a k-step, LBO = the next 64 columns.
    const uint64_t dq = sw128_desc(sQ + wg * kAttnRows * 128, 16, kSw128Bytes);
    auto q_step = [](int kk) { return static_cast<uint64_t>(((kk / 4) * Cfg::kRows * 128 + (kk % 4) * 32) >> 4); };
    auto k_step = [](int kk) { return static_cast<uint64_t>(((kk / 4) * BN * 128 + (kk % 4) * 32) >> 4); };
    auto stage_of = [&](unsigned char* tiles, uint64_t* full, int i) {
      mbar_wait(&full[i % S], (i / S) & 1);
      return tiles + (i % S) * kTileBytes;
    };

    float o[HD / 8][4];
#pragma unroll
    for (int dt = 0; dt < HD / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY};
    float l_run[2] = {0.f, 0.f};
    float s[BN / 8][4];
    uint32_t pf[BN / 16][4];
    const float c = p.scale_log2;

    auto issue_qk = [&](const unsigned char* tK) {
      const uint64_t dk = sw128_desc(tK, 16, kSw128Bytes), dqi = opaque_u64(dq);
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk)
        wgmma_ss_n<T, BN>(s, dqi + q_step(kk), dk + k_step(kk), kk > 0);
      wgmma_commit();
    };
    auto issue_pv = [&](const unsigned char* tV) {
      const uint64_t dv = sw128_desc(tV, BN * 128, kSw128Bytes);
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) wgmma_rs_n<T, HD>(o, pf[kk], dv + ((kk * 16 * 128) >> 4));
      wgmma_commit();
    };
    // Orders every register a wgmma reads or writes before wgmma.fence.
    auto fence_all = [&]() {
      wgmma_fence_acc(s);
      wgmma_fence_acc(o);
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) wgmma_fence_fragment(pf[kk]);
      wgmma_fence();
    };
    auto pack_p = [&]() {
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) attn_p_fragment<T, BN>(s, kk, pf[kk]);
    };
    // Mask (tree blocks) + softmax of S for block blk; returns alpha in a.
    auto softmax = [&](auto masked, int blk, float (&a)[2]) {
      if constexpr (kNoSoftmax) {
        a[0] = a[1] = 1.f;
      } else {
        if constexpr (decltype(masked)::value) hopper_mask<BN>(s, p, t, blk * BN);
        hopper_softmax<BN / 8, Cfg::kFastExp>(s, m_run, l_run, a, c);
      }
    };

    if (nblk > 0) {
      if constexpr (Cfg::kPingPong) {
        if (wg == 1) named_barrier_arrive(4, 2 * kAttnThreads);  // warpgroup 0 goes first
      }
      // Block 0: S_0 alone.
      {
        const unsigned char* tK = stage_of(sK, k_full, 0);
        fence_all();
        pp_sync();
        issue_qk(tK);
        pp_arrive(nblk == 1);
        wgmma_wait<0>();
        wgmma_fence_acc(s);
        mbar_arrive(&k_empty[0]);
        float a[2];
        if (t.blk_begin >= t.prefix / BN) {
          softmax(std::true_type{}, t.blk_begin, a);
        } else {
          softmax(std::false_type{}, t.blk_begin, a);
        }
        pack_p();
      }
      // Step i: S_i and P_{i-1} V_{i-1} in flight together.
      auto step = [&](auto masked, int i) {
        const unsigned char* tK = stage_of(sK, k_full, i);
        const unsigned char* tV = stage_of(sV, v_full, i - 1);
        fence_all();
        pp_sync();
        issue_qk(tK);
        if constexpr (!kNoPv) issue_pv(tV);
        pp_arrive(i == nblk - 1);
        if constexpr (kNoPv) {
          wgmma_wait<0>();
        } else {
          wgmma_wait<1>();  // S_i; P_{i-1} V_{i-1} may still run
        }
        wgmma_fence_acc(s);
        mbar_arrive(&k_empty[i % S]);
        float a[2];
        softmax(masked, t.blk_begin + i, a);
        // The fences keep the softmax above the wait and the packing of P below it in the PTX.
        // (ptxas 13.0 still schedules the SASS wait a few instructions after the first one, so
        // the intra-warpgroup overlap of P V with the softmax may be lost; the ping-pong of the
        // two warpgroups remains: docs/kernels.md, "Hopper attention family".)
        wgmma_fence_acc(s);
        wgmma_wait<0>();
        wgmma_fence_acc(o);
        wgmma_fence_acc(s);
        mbar_arrive(&v_empty[(i - 1) % S]);
#pragma unroll
        for (int dt = 0; dt < HD / 8; ++dt) {
          o[dt][0] *= a[0];
          o[dt][1] *= a[0];
          o[dt][2] *= a[1];
          o[dt][3] *= a[1];
        }
        pack_p();
      };
      const int first_masked = std::min(nblk, std::max(1, t.prefix / BN - t.blk_begin));
      int i = 1;
      for (; i < first_masked; ++i) step(std::false_type{}, i);
      for (; i < nblk; ++i) step(std::true_type{}, i);
      // The last block's P V.
      {
        unsigned char* tV = stage_of(sV, v_full, nblk - 1);
        const int rows = t.len - (t.blk_end - 1) * BN;
        if (rows < BN) hopper_zero_v_tail<HD, Cfg>(tV, rows);
        fence_all();
        if constexpr (!kNoPv) issue_pv(tV);
        wgmma_wait<0>();
        wgmma_fence_acc(o);
        mbar_arrive(&v_empty[(nblk - 1) % S]);
      }
    }
    const float m_log2[2] = {m_run[0] * c, m_run[1] * c};
    attn_store<T, HD>(p, o, m_log2, l_run, t.b, t.kvh, t.split, t.row0);
  }
}
#endif

template <typename T, int HD, class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kCtasPerSm)
    tree_attention_hopper_kernel(AttnParams p, const __grid_constant__ CUtensorMap tk,
                                 const __grid_constant__ CUtensorMap tv, int chunk) {
  pdl_begin();
#ifdef JETSPEC_WGMMA
  static_assert(HD == 64 || HD == 128, "the Hopper kernels take head dims 64 and 128");
  hopper_attention_body<T, HD, Cfg>(p, &tk, &tv, chunk);
#else
  __trap();  // as tree_attention_wgmma_kernel: never launched where sm_90a code cannot run
#endif
}

// Resident CTAs per SM of a variant: the occupancy calculator on the GPU; in the simulator, the
// same rules with the launch bounds' register cap (tests/test_attention_hopper_gates.py checks
// that ptxas's real count gives the same answer).
template <typename T, int HD, class Cfg>
Status hopper_resident_ctas(int* ctas) {
  auto kernel = tree_attention_hopper_kernel<T, HD, Cfg>;
  constexpr size_t smem = attention_hopper_smem_bytes<HD, Cfg>();
  JETSPEC_RETURN_IF_FAILED(cuda_context(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem)),
      cat("cudaFuncSetAttribute(max dynamic shared memory ", smem, " bytes)")));
#ifdef JETSPEC_CPU_SIM
  *ctas = ::jetspec_sim::occupancy(Cfg::kThreads, smem, Cfg::kLaunchRegs);
#else
  JETSPEC_RETURN_IF_ERROR(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas, kernel, Cfg::kThreads, smem));
#endif
  return Status();
}

// Split-KV count by wave efficiency: `base` CTAs without splitting, `slots` = resident CTAs per
// SM x SMs, `nblocks` key blocks of the longest sequence. No split when the base grid already
// fills 80 % of the slots; otherwise the fewest splits whose last wave is within 85 % of the best
// fill over 1..max_splits (at least two key blocks a split).
inline int hopper_split_count(long long base, long long slots, int nblocks, int max_splits) {
  if (base <= 0 || slots <= 0) return 1;
  if (base * 10 >= slots * 8) return 1;
  const int most = std::max(1, std::min(max_splits, nblocks / 2));
  auto efficiency = [&](int s) {
    const double waves = static_cast<double>(base) * s / static_cast<double>(slots);
    return waves / std::ceil(waves);
  };
  double best = 0.0;
  for (int s = 1; s <= most; ++s) best = std::max(best, efficiency(s));
  for (int s = 1; s <= most; ++s)
    if (efficiency(s) >= 0.85 * best) return s;
  return 1;
}

// The current device's SM count (for callers without one of their own: the sweep harness; _C
// takes the count from jetspec_kernels.launch_plan.sm_count, the one number all split rules use).
inline Status current_sm_count(int* sms) {
  int dev = 0;
  JETSPEC_RETURN_IF_ERROR(cudaGetDevice(&dev));
  JETSPEC_RETURN_IF_ERROR(cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev));
  return Status();
}

// Splits for a launch of variant Cfg over `batch` sequences of up to `capacity` keys on a GPU of
// `sms` SMs (the CTAs per SM from the current device's occupancy calculator).
template <typename T, int HD, class Cfg>
Status hopper_splits_for(int batch, int n, int group, int hkv, int capacity, int max_splits,
                         int sms, int* splits) {
  JETSPEC_RETURN_IF_FAILED(check_range("sms", sms, 1));
  int ctas = 0;
  JETSPEC_RETURN_IF_FAILED((hopper_resident_ctas<T, HD, Cfg>(&ctas)));
  if (ctas < 1) {
    return unsupported("the Hopper attention kernel (", Cfg::kThreads, " threads, ",
                       attention_hopper_smem_bytes<HD, Cfg>(), " bytes of shared memory) fits no "
                       "SM of this device (kernel 4, hopper)");
  }
  const long long tiles = (static_cast<long long>(n) * group + Cfg::kRows - 1) / Cfg::kRows;
  const long long base = tiles * batch * hkv;
  *splits = hopper_split_count(base, static_cast<long long>(ctas) * sms,
                               (capacity + Cfg::kBlockN - 1) / Cfg::kBlockN, max_splits);
  return Status();
}

// Rows per TMA copy for this cache layout and key block (block_n keys), or 0 when the kernel
// cannot take it (a page size that is not a multiple of 8: each copy starts on a swizzle atom).
inline int attention_tma_chunk(const AttnParams& p, int block_n) {
  if (p.block_table == nullptr) return block_n;
  const int chunk = std::gcd(p.page_size, block_n);
  return chunk % kAttnTmaPageMultiple == 0 ? chunk : 0;
}

// The K and V tensor maps: the cache as 4-d (Dh, Hkv, rows, outer) with boxes of 64 columns x
// `chunk` rows (contiguous caches as (Dh, Hkv, L, B), paged ones as (Dh, Hkv, page_size, pages)).
// Bad input for layouts tensor maps cannot describe (negative strides, strides that are not
// multiples of 16 bytes).
template <int HD>
Status attention_tensor_maps(const AttnParams& p, int chunk, CUtensorMap (&maps)[2]) {
  JETSPEC_RETURN_IF_FAILED(check_range("cache_outer", p.cache_outer, 1));
  JETSPEC_RETURN_IF_FAILED(check_range("hkv", p.hkv, 1));
  const void* bases[2] = {p.k_cache, p.v_cache};
  const Strides4* strides[2] = {&p.k_cache_strides, &p.v_cache_strides};
  const char* names[2] = {"k_cache", "v_cache"};
  for (int m = 0; m < 2; ++m) {
    const Strides4& st = *strides[m];
    if (st.batch < 0 || st.row < 0 || st.head < 0) {
      return bad_input(names[m], " strides (", st.batch, ", ", st.row, ", ", st.head,
                       ") are negative (kernel 4, hopper)");
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

// Launches variant Cfg (the sweep harness calls this directly; _C through tree_attention_hopper).
template <typename T, int HD, class Cfg>
Status tree_attention_hopper_variant(const AttnParams& p, cudaStream_t stream) {
  JETSPEC_RETURN_IF_FAILED(check_range("page_size", p.page_size, 1));
  const int chunk = attention_tma_chunk(p, Cfg::kBlockN);
  if (chunk == 0)
    return bad_input("page_size ", p.page_size, " is not a multiple of 8 (kernel 4, hopper)");
  CUtensorMap maps[2];
  JETSPEC_RETURN_IF_FAILED(attention_tensor_maps<HD>(p, chunk, maps));
  return attention_launch<T>(p, tree_attention_hopper_kernel<T, HD, Cfg>,
                             attention_hopper_smem_bytes<HD, Cfg>(), HD, Cfg::kThreads,
                             Cfg::kRows, stream, maps[0], maps[1], chunk);
}

// The variant for these shapes: two consumer warpgroups when a (sequence, kv head) has more than
// 64 packed rows, else the small one.
template <typename T, int HD>
Status tree_attention_hopper(const AttnParams& p, cudaStream_t stream) {
  if (static_cast<long long>(p.n) * p.group > kAttnRows)
    return tree_attention_hopper_variant<T, HD, HopperWide<HD>>(p, stream);
  return tree_attention_hopper_variant<T, HD, HopperSmall<HD>>(p, stream);
}

// Split count tree_attention_hopper uses for these shapes (capacity: keys a sequence may hold)
// on a GPU of `sms` SMs.
template <typename T, int HD>
Status tree_attention_hopper_splits(int batch, int n, int group, int hkv, int capacity, int sms,
                                    int* splits) {
  constexpr int kMaxSplits = 32;
  if (static_cast<long long>(n) * group > kAttnRows)
    return hopper_splits_for<T, HD, HopperWide<HD>>(batch, n, group, hkv, capacity, kMaxSplits,
                                                    sms, splits);
  return hopper_splits_for<T, HD, HopperSmall<HD>>(batch, n, group, hkv, capacity, kMaxSplits,
                                                   sms, splits);
}

}  // namespace jetspec
