// Tree-masked / block-causal attention with Hopper warpgroup MMA (sm_90a; head dims 64, 128).
//
// The CTA shape, GQA packing, masking, online softmax, split-KV and epilogue are those of the
// mma.sync kernel (attention.cuh): one warpgroup of 128 threads per 64 packed rows, whose m64
// is exactly one wgmma M. Q and double-buffered K/V tiles of 64 keys are copied with cp.async
// into 128B-swizzled shared memory (wgmma.cuh). S = Q K^T is wgmma m64n64k16 with both operands
// in shared memory (K-major); O += P V takes P from registers (the S accumulators packed to
// 16 bits, the same fragments as the mma.sync kernel) and V as an MN-major operand, one n64
// wgmma per 64 output columns.
//
// Not yet done (each needs GPU measurements to be worth it): TMA loads (paged caches need one
// copy per page), a producer warp with mbarriers, and two consumer warpgroups that overlap one
// tile's softmax with the other's MMA.
#pragma once
#include "jetspec/arch_list.h"
#include "jetspec/attention.cuh"
#include "jetspec/wgmma.cuh"

namespace jetspec {

constexpr int kWgmmaBlockN = 64;

template <int HD>
constexpr size_t attention_wgmma_smem_bytes() {
  // Q + 2 stages of K and V, 2-byte elements, plus slack to align the tiles to 1024 bytes.
  return static_cast<size_t>(kAttnRows + 4 * kWgmmaBlockN) * HD * 2 + kSw128Bytes;
}

// Where 8 elements of row r, from column col (a multiple of 8), go in a 128B-swizzled tile of
// `rows` rows: [HD / 64 column blocks][rows][128 bytes].
template <typename T>
__device__ __forceinline__ T* sw128_tile_at(unsigned char* tile, int rows, int r, int col) {
  return reinterpret_cast<T*>(tile + (col / 64) * rows * 128 + sw128_offset(r, (col % 64) / 8));
}

#ifdef JETSPEC_WGMMA
// Issues S = Q K^T for one key block as one wgmma group (HD / 16 k-steps of m64n64k16, both
// operands in shared memory, K-major; step kk is in column block kk / 4, 32 (kk % 4) bytes into
// its 128-byte rows). sQ / tK: swizzled tiles of kAttnRows / kWgmmaBlockN rows. s holds NaN
// until a wgmma_wait retires the group.
template <typename T, int HD>
__device__ __forceinline__ void wgmma_issue_qk(float (&s)[kWgmmaBlockN / 8][4],
                                               const unsigned char* sQ, const unsigned char* tK) {
  constexpr int BN = kWgmmaBlockN;
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    const int koff = (kk % 4) * 32;
    wgmma_ss<T>(s, sw128_desc(sQ + (kk / 4) * kAttnRows * 128 + koff, 16, kSw128Bytes),
                sw128_desc(tK + (kk / 4) * BN * 128 + koff, 16, kSw128Bytes), kk > 0);
  }
  wgmma_commit();
}

// Output columns 64 db .. 64 db + 63 of O: one m64n64 accumulator block.
using WgmmaAcc = float[8][4];
template <int HD>
__device__ __forceinline__ WgmmaAcc& o_block(float (&o)[HD / 8][4], int db) {
  return *reinterpret_cast<WgmmaAcc*>(&o[db * 8]);
}

// Keeps the compiler from moving accesses to all of O across a wgmma issue or wait.
template <int HD>
__device__ __forceinline__ void wgmma_fence_output(float (&o)[HD / 8][4]) {
#pragma unroll
  for (int db = 0; db < HD / 64; ++db) wgmma_fence_operand(o_block<HD>(o, db));
}

// Issues O += P V for one key block as one wgmma group: P (the softmaxed S, packed to 16 bits,
// from registers) times V (tV, MN-major), one n64 wgmma per 64 output columns per 16 keys.
template <typename T, int HD>
__device__ __forceinline__ void wgmma_issue_pv(float (&o)[HD / 8][4],
                                               const float (&s)[kWgmmaBlockN / 8][4],
                                               const unsigned char* tV) {
  constexpr int BN = kWgmmaBlockN;
  constexpr int KB = HD / 64;
  // All P fragments are packed before the fence (registers an in-flight wgmma reads must not
  // change), and fenced so that the compiler keeps the packing there.
  uint32_t pa[BN / 16][4];
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) attn_p_fragment<T, BN>(s, kk, pa[kk]);
  wgmma_fence_output<HD>(o);
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) wgmma_fence_fragment(pa[kk]);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
#pragma unroll
    for (int db = 0; db < KB; ++db) {
      wgmma_rs<T>(o_block<HD>(o, db), pa[kk],
                  sw128_desc(tV + db * BN * 128 + kk * 16 * 128, kSw128Bytes, kSw128Bytes));
    }
  }
  wgmma_commit();
}

// One key block of the online-softmax loop, every MMA waited for: S = Q K^T, mask + softmax,
// O += P V. Returns after every MMA has completed, so the caller may then release tK and tV.
template <typename T, int HD>
__device__ __forceinline__ void wgmma_attend_block(const unsigned char* sQ,
                                                   const unsigned char* tK,
                                                   const unsigned char* tV, const AttnParams& p,
                                                   const AttnTile& t, int blk,
                                                   float (&o)[HD / 8][4], float (&m_run)[2],
                                                   float (&l_run)[2]) {
  constexpr int BN = kWgmmaBlockN;
  float s[BN / 8][4];
  wgmma_issue_qk<T, HD>(s, sQ, tK);
  wgmma_wait<0>();
  wgmma_fence_operand(s);
  attn_scale_mask<BN>(s, p, t.b, t.prefix, t.tree_row, blk * BN);
  attn_online_softmax<BN, HD>(s, o, m_run, l_run);
  wgmma_issue_pv<T, HD>(o, s, tV);
  wgmma_wait<0>();
  wgmma_fence_output<HD>(o);
}
#endif

template <typename T, int HD>
__global__ void __launch_bounds__(kAttnThreads) tree_attention_wgmma_kernel(AttnParams p) {
  pdl_begin();
#ifdef JETSPEC_WGMMA
  static_assert(HD == 64 || HD == 128, "the wgmma kernel takes head dims 64 and 128");
  constexpr int BN = kWgmmaBlockN;
  constexpr int kQBytes = kAttnRows * HD * 2;      // [KB][64 rows][128 B]
  constexpr int kTileBytes = BN * HD * 2;          // [KB][BN rows][128 B]
  JETSPEC_DYNAMIC_SMEM(smem_raw);
  unsigned char* sQ = align_smem_1024(smem_raw);
  unsigned char* sK = sQ + kQBytes;         // [2 stages]
  unsigned char* sV = sK + 2 * kTileBytes;  // [2 stages]

  const AttnTile t = attn_tile<BN>(p);
  attn_load_q<T, HD>(p, t.b, t.kvh, t.row0,
                     [&](int r, int col) { return sw128_tile_at<T>(sQ, kAttnRows, r, col); });
  auto load_kv = [&](int blk, int stage) {
    unsigned char* dk = sK + stage * kTileBytes;
    unsigned char* dv = sV + stage * kTileBytes;
    attn_load_kv<T, HD, BN>(p, t.b, t.kvh, t.len, blk,
                            [&](int r, int col) { return sw128_tile_at<T>(dk, BN, r, col); },
                            [&](int r, int col) { return sw128_tile_at<T>(dv, BN, r, col); });
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
    fence_proxy_async();  // this thread's cp.async data, before the async proxy reads it
    __syncthreads();
    const unsigned char* tK = sK + stage * kTileBytes;
    const unsigned char* tV = sV + stage * kTileBytes;

    wgmma_attend_block<T, HD>(sQ, tK, tV, p, t, blk, o, m_run, l_run);
    __syncthreads();  // the next prefetch overwrites this stage
  }
  cp_async_wait<0>();
  attn_store<T, HD>(p, o, m_run, l_run, t.b, t.kvh, t.split, t.row0);
#else
  // Code for other archs has no wgmma; wgmma_attention_usable keeps it from being launched, and
  // a launch that slipped through fails loudly instead of leaving the output unwritten.
  __trap();
#endif
}

// Can tree_attention_wgmma_kernel<T, HD> run on the current device? True when the runtime picked
// sm_90 code for it and the build's only sm_90 code is 90a (a plain "90" build has the same
// binaryVersion but an empty kernel); cached per device (not in the simulator, whose tests change
// the answer).
template <typename T, int HD>
cudaError_t wgmma_attention_usable(bool* usable) {
  static signed char cached[64] = {};  // 0 unknown, 1 no, 2 yes
  int dev = 0;
  JETSPEC_RETURN_IF_ERROR(cudaGetDevice(&dev));
  const bool cache = dev >= 0 && dev < 64;
#ifndef JETSPEC_CPU_SIM
  if (cache && cached[dev] != 0) {
    *usable = cached[dev] == 2;
    return cudaSuccess;
  }
#endif
  cudaFuncAttributes attr{};
  JETSPEC_RETURN_IF_ERROR(cudaFuncGetAttributes(&attr, tree_attention_wgmma_kernel<T, HD>));
  *usable = attr.binaryVersion == 90 && arch_list_sm90_is_90a(JETSPEC_CUDA_ARCHS);
  if (cache) cached[dev] = *usable ? 2 : 1;
  return cudaSuccess;
}

}  // namespace jetspec
