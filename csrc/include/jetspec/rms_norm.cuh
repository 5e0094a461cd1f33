// Fused residual add + RMSNorm over the rows of a [R, H] tensor: Qwen3RMSNorm as transformers
// computes it, after the residual add that precedes it in a decoder layer. Per row:
//   h = rnd(x + residual) (total = h), r = 1 / sqrt(sum(h^2) / H + eps) in fp32,
//   out = rnd(weight * rnd(h * r)),
// rnd rounding to the storage type (round to nearest even; nothing for float32). Memory-bound:
// each element of x, residual and weight is read once, out and total written once. A row's
// threads keep their h values in registers between the two passes (rms_norm_items units each),
// so such a row is never re-read; the elements of a longer row past that are read back from
// total (or recomputed) in the second pass, so no hidden size is refused.
#pragma once
#include "jetspec/common.cuh"
#include "jetspec/primitives/block_reduce.cuh"

namespace jetspec {

constexpr int kRmsNormThreads = 256;
// Units of U (16 bytes, or one element) of x, residual and weight a thread keeps in registers:
// 64 bytes of each with 16-byte units (32 fp16/bf16 or 16 fp32 elements); 8 elements with
// scalar ones (misaligned rows: the rare path, kept short).
constexpr int kRmsNormVecItems = 4;
constexpr int kRmsNormScalarItems = 8;
template <typename T, typename U>
constexpr int rms_norm_items() {
  return sizeof(U) == sizeof(T) ? kRmsNormScalarItems : kRmsNormVecItems;
}

// RowThreads threads per row: 32 (one warp a row, kRmsNormThreads / 32 rows a CTA; short rows) or
// kRmsNormThreads (one CTA a row). U: 16-byte units (uint4) where every row of every tensor
// starts 16-byte aligned and H fills whole units, else T itself.
template <typename T, typename U, int RowThreads>
__global__ void __launch_bounds__(kRmsNormThreads) rms_norm_kernel(RmsNormParams p) {
  pdl_begin();
  static_assert(RowThreads == 32 || RowThreads == kRmsNormThreads, "a warp or the CTA per row");
  constexpr int E = static_cast<int>(sizeof(U) / sizeof(T));  // elements per unit
  constexpr int kItems = rms_norm_items<T, U>();
  constexpr int kRowsPerCta = kRmsNormThreads / RowThreads;
  const int lane = static_cast<int>(threadIdx.x) % RowThreads;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerCta + threadIdx.x / RowThreads;
  // Whole warps only (RowThreads == 32): a CTA-wide row is always < rows, so every thread of a
  // CTA reaches its barriers.
  if (row >= p.rows) return;
  const int units = p.hidden / E;
  const U* x = reinterpret_cast<const U*>(static_cast<const T*>(p.x) + row * p.x_row_stride);
  const U* res = p.residual == nullptr
                     ? nullptr
                     : reinterpret_cast<const U*>(static_cast<const T*>(p.residual) +
                                                  row * p.residual_row_stride);
  const U* w = static_cast<const U*>(p.weight);
  U* out = reinterpret_cast<U*>(static_cast<T*>(p.out) + row * p.hidden);
  U* total = p.total == nullptr ? nullptr
                                : reinterpret_cast<U*>(static_cast<T*>(p.total) + row * p.hidden);

  // h of one unit (x + residual rounded to T, or x), as T; stored to total.
  auto sum_unit = [&](const U& xu, const U& ru, int u) {
    U tu = xu;
    if (res != nullptr) {
      const T* xe = reinterpret_cast<const T*>(&xu);
      const T* re = reinterpret_cast<const T*>(&ru);
      T* te = reinterpret_cast<T*>(&tu);
#pragma unroll
      for (int j = 0; j < E; ++j) te[j] = from_float<T>(to_float(xe[j]) + to_float(re[j]));
    }
    if (total != nullptr) total[u] = tu;
    return tu;
  };
  auto sum_squares = [](const U& tu) {
    const T* te = reinterpret_cast<const T*>(&tu);
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < E; ++j) s += to_float(te[j]) * to_float(te[j]);
    return s;
  };
  // out of one unit from its h and weight units.
  auto norm_unit = [&](const U& tu, const U& wu, float r, int u) {
    const T* te = reinterpret_cast<const T*>(&tu);
    const T* we = reinterpret_cast<const T*>(&wu);
    U ou;
    T* oe = reinterpret_cast<T*>(&ou);
#pragma unroll
    for (int j = 0; j < E; ++j) {
      const float n = to_float(from_float<T>(to_float(te[j]) * r));
      oe[j] = from_float<T>(to_float(we[j]) * n);
    }
    out[u] = ou;
  };

  // Pass 1: every load of the kept units is issued before the first use (x, residual, weight),
  // then h (kept as T: it is exactly representable), total and the sum of squares.
  U hv[kItems], rv[kItems], wv[kItems];
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int u = lane + i * RowThreads;
    if (u < units) {
      hv[i] = x[u];
      if (res != nullptr) rv[i] = res[u];
      wv[i] = w[u];
    }
  }
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int u = lane + i * RowThreads;
    if (u < units) {
      hv[i] = sum_unit(hv[i], rv[i], u);
      ss += sum_squares(hv[i]);
    }
  }
  // Units past the registers (rows longer than RowThreads * kItems units).
  for (int u = lane + kItems * RowThreads; u < units; u += RowThreads)
    ss += sum_squares(sum_unit(x[u], res == nullptr ? U{} : res[u], u));

  if constexpr (RowThreads == 32) {
    ss = warp_sum(ss);
  } else {
    __shared__ float red[kRmsNormThreads / 32];
    ss = block_reduce<kRmsNormThreads>(ss, SumOp{}, red);
  }
  // Correctly rounded division and square root (no fast math), as qk_norm_rope_append's norm.
  const float r = 1.0f / sqrtf(ss / static_cast<float>(p.hidden) + p.eps);

  // Pass 2: out from the kept h, then from the units past them (h read back from total, which
  // this thread wrote, or recomputed from x and residual).
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int u = lane + i * RowThreads;
    if (u < units) norm_unit(hv[i], wv[i], r, u);
  }
  for (int u = lane + kItems * RowThreads; u < units; u += RowThreads) {
    const U tu = total != nullptr ? total[u] : sum_unit(x[u], res == nullptr ? U{} : res[u], u);
    norm_unit(tu, w[u], r, u);
  }
}

// Picks the unit (16-byte where every pointer, row stride and H allow) and the rows per CTA (a
// warp per row while a warp's registers hold the row, else a CTA per row).
template <typename T, typename U>
Status rms_norm_launch(const RmsNormParams& p, cudaStream_t stream) {
  constexpr int E = static_cast<int>(sizeof(U) / sizeof(T));
  const bool warp_rows = p.hidden <= 32 * rms_norm_items<T, U>() * E;
  if (warp_rows) {
    constexpr int kRowsPerCta = kRmsNormThreads / 32;
    const unsigned grid = static_cast<unsigned>((static_cast<int64_t>(p.rows) + kRowsPerCta - 1) /
                                                kRowsPerCta);
    auto* kernel = rms_norm_kernel<T, U, 32>;
    JETSPEC_LAUNCH(kernel, grid, kRmsNormThreads, 0, stream, p);
  } else {
    auto* kernel = rms_norm_kernel<T, U, kRmsNormThreads>;
    JETSPEC_LAUNCH(kernel, static_cast<unsigned>(p.rows), kRmsNormThreads, 0, stream, p);
  }
  return cudaGetLastError();
}

template <typename T>
Status rms_norm(const RmsNormParams& p, cudaStream_t stream) {
  const int eb = static_cast<int>(sizeof(T));
  const bool vec =
      rows_aligned16(p.x, eb, p.hidden, {p.x_row_stride}) &&
      (p.residual == nullptr || rows_aligned16(p.residual, eb, p.hidden, {p.residual_row_stride})) &&
      rows_aligned16(p.weight, eb, p.hidden, {}) && rows_aligned16(p.out, eb, p.hidden, {}) &&
      (p.total == nullptr || rows_aligned16(p.total, eb, p.hidden, {}));
  return vec ? rms_norm_launch<T, uint4>(p, stream) : rms_norm_launch<T, T>(p, stream);
}

}  // namespace jetspec
