// SwiGLU's activation over the rows of x [R, 2I], the fused gate/up projection's output (gate in
// the first I columns, up in the last I): out [R, I], per element
//   s = rnd(g / (1 + exp(-g))) in fp32, out = rnd(float(s) * float(u)),
// rnd rounding to the storage type (round to nearest even; nothing for float32): what
// F.silu(gate) * up gives in that type (transformers' Qwen3MLP). Full-precision expf and a
// correctly rounded division, no flush to zero: torch's specials follow from the form (silu(+inf)
// = +inf, silu(-inf) = NaN, silu(g) = -0.0 where exp(-g) overflows, NaN in -> NaN out).
//
// Memory-bound: each element of x is read once and out written once (3 * I elements a row), no
// reuse, so the layout is a flat one: the R * I outputs (in units of 16 bytes, or one element on
// the scalar path) are split evenly over the threads of a grid sized to the work, consecutive
// threads on consecutive units (coalesced across row ends), so any R and I fill the GPU alike (no
// CTA per row idling on short rows, no rows-per-CTA rounding on long ones).
#pragma once
#include <algorithm>

#include "jetspec/common.cuh"

namespace jetspec {

constexpr int kSiluMulThreads = 256;
// Units each thread loads before it computes (all its gate and up loads in flight at once): two
// with 16-byte units (64 bytes of loads a thread), four with scalar ones; one while the call is
// small (below kSiluMulSmallBytes of output), so its few units spread over as many CTAs, SMs and
// memory pipes as they fill (R 16 x I 12288 bf16: 96 CTAs, not 48).
constexpr int kSiluMulVecItems = 2;
constexpr int kSiluMulScalarItems = 4;
constexpr long long kSiluMulSmallBytes = 4LL << 20;

// out of one unit from its gate and up units. Every element's 1 + exp(-g) comes first, then the
// divisions: each correctly rounded division ends in a branch (its slow path), which the compiler
// does not schedule across, so one element at a time would chain E exp + division latencies (the
// small calls' critical path). The _rn intrinsics keep the add and the product out of FMAs.
template <typename T, typename U>
__device__ __forceinline__ U silu_mul_unit(const U& g, const U& u) {
  constexpr int E = static_cast<int>(sizeof(U) / sizeof(T));
  const T* ge = reinterpret_cast<const T*>(&g);
  const T* ue = reinterpret_cast<const T*>(&u);
  float d[E];
#pragma unroll
  for (int j = 0; j < E; ++j) d[j] = __fadd_rn(1.0f, expf(-to_float(ge[j])));
  U o;
  T* oe = reinterpret_cast<T*>(&o);
#pragma unroll
  for (int j = 0; j < E; ++j) {
    const float s = __fdiv_rn(to_float(ge[j]), d[j]);
    oe[j] = from_float<T>(__fmul_rn(to_float(from_float<T>(s)), to_float(ue[j])));
  }
  return o;
}

// U: uint4 (16-byte units; every row of x, its up half and out start 16-byte aligned and I fills
// whole units) or T (one element a unit). Items: units a thread handles per pass of its
// grid-stride loop (passes past the first only where the grid would exceed its limit).
template <typename T, typename U, int Items>
__global__ void __launch_bounds__(kSiluMulThreads) silu_mul_kernel(SiluMulParams p) {
  pdl_begin();
  constexpr int E = static_cast<int>(sizeof(U) / sizeof(T));  // elements per unit
  constexpr int kSpan = kSiluMulThreads * Items;                // units a CTA handles per pass
  const int n = p.inner / E;                                    // units per row of out
  const int64_t total = static_cast<int64_t>(p.rows) * n;
  const T* x = static_cast<const T*>(p.x);
  T* out = static_cast<T*>(p.out);
  // A thread's next unit is kSiluMulThreads on: dr rows and dc units further (carry past n).
  const int dr = static_cast<int>(static_cast<uint32_t>(kSiluMulThreads) / static_cast<uint32_t>(n));
  const int dc = kSiluMulThreads - dr * n;
  for (int64_t f = static_cast<int64_t>(blockIdx.x) * kSpan + threadIdx.x; f < total;
       f += static_cast<int64_t>(gridDim.x) * kSpan) {
    // Row and column of unit f of out (a 32-bit division unless out has 2^32 units or more).
    int64_t row;
    int col;
    if (total <= 0xffffffffLL) {
      const uint32_t q = static_cast<uint32_t>(f) / static_cast<uint32_t>(n);
      row = q;
      col = static_cast<int>(static_cast<uint32_t>(f) - q * static_cast<uint32_t>(n));
    } else {
      row = f / n;
      col = static_cast<int>(f - row * n);
    }
    U g[Items], u[Items];
#pragma unroll
    for (int i = 0; i < Items; ++i) {
      if (f + i * kSiluMulThreads < total) {
        const T* gate = x + row * p.x_row_stride + static_cast<int64_t>(col) * E;
        g[i] = *as_units<const U>(gate);
        u[i] = *as_units<const U>(gate + p.inner);
      }
      row += dr;
      col += dc;
      if (col >= n) {
        col -= n;
        ++row;
      }
    }
#pragma unroll
    for (int i = 0; i < Items; ++i) {
      const int64_t fi = f + i * kSiluMulThreads;
      if (fi < total) *as_units<U>(out + fi * E) = silu_mul_unit<T>(g[i], u[i]);
    }
  }
}

template <typename T, typename U, int Items>
Status silu_mul_launch(const SiluMulParams& p, cudaStream_t stream) {
  constexpr long long kSpan = static_cast<long long>(kSiluMulThreads) * Items;
  constexpr int E = static_cast<int>(sizeof(U) / sizeof(T));
  const long long total = static_cast<long long>(p.rows) * (p.inner / E);
  const unsigned grid = static_cast<unsigned>(std::min((total + kSpan - 1) / kSpan, kMaxGridX));
  auto* kernel = silu_mul_kernel<T, U, Items>;
  JETSPEC_LAUNCH(kernel, grid, kSiluMulThreads, 0, stream, p);
  return cudaGetLastError();
}

// 16-byte units where x's rows (both halves) and out's start 16-byte aligned and I fills whole
// units, else one element a unit; one unit a thread for small calls.
template <typename T>
Status silu_mul(const SiluMulParams& p, cudaStream_t stream) {
  const int eb = static_cast<int>(sizeof(T));
  const bool vec = rows_aligned16(p.x, eb, p.inner, {p.x_row_stride}) &&
                   rows_aligned16(p.out, eb, p.inner, {});
  const bool small = static_cast<long long>(p.rows) * p.inner * eb < kSiluMulSmallBytes;
  if (vec)
    return small ? silu_mul_launch<T, uint4, 1>(p, stream)
                 : silu_mul_launch<T, uint4, kSiluMulVecItems>(p, stream);
  return small ? silu_mul_launch<T, T, 1>(p, stream)
               : silu_mul_launch<T, T, kSiluMulScalarItems>(p, stream);
}

}  // namespace jetspec
