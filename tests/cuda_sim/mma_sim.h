// The warp-level PTX wrappers of jetspec/mma.cuh, emulated for cuda_sim.h: cp.async is a
// deferred 16-byte copy (below); ldmatrix and mma.sync gather every lane's operands through the warp
// exchange buffer and give each lane its part of the result, with the fragment layouts of the
// PTX ISA (m8n8 ldmatrix; mma.m16n8k16 .row.col with f32 accumulators).
// groupID = lane / 4, tig = lane % 4 below, as in the ISA's figures.
// A k-group's 16 products are summed by kgroup_sum (below) in an association where a product's
// slot in the group matters, as it may on tensor cores.
#pragma once
#include <array>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace jetspec {

// cp.async as late as the hardware may complete it: at issue the destination is poisoned with
// 0xFF bytes (NaN in fp16/bf16/fp32), and the copy lands only when cp_async_wait retires its
// group. A kernel that reads a stage before waiting for it, or refills a stage that another
// thread is still reading, sees NaN instead of data.
namespace sim_detail {
struct CpAsyncCopy {
  void* dst;
  const void* src;
  bool valid;
};
struct CpAsyncQueue {
  std::vector<CpAsyncCopy> open;                 // issued, not yet committed
  std::vector<std::vector<CpAsyncCopy>> groups;  // committed, oldest first
  bool unfenced = false;  // copies landed since the last fence.proxy.async (wgmma_sim.h checks)
};
inline CpAsyncQueue& cp_async_queue() { return ::jetspec_sim::thread_state<CpAsyncQueue>(); }
}  // namespace sim_detail

inline void cp_async_16(void* dst, const void* src, bool valid) {
  std::memset(dst, 0xFF, 16);
  sim_detail::cp_async_queue().open.push_back({dst, src, valid});
}

inline void cp_async_commit() {
  auto& q = sim_detail::cp_async_queue();
  q.groups.push_back(std::move(q.open));
  q.open.clear();
}

template <int N>
inline void cp_async_wait() {
  auto& q = sim_detail::cp_async_queue();
  while (q.groups.size() > static_cast<size_t>(N)) {
    for (const auto& c : q.groups.front()) {
      if (c.valid) {
        std::memcpy(c.dst, c.src, 16);
      } else {
        std::memset(c.dst, 0, 16);
      }
    }
    q.unfenced = q.unfenced || !q.groups.front().empty();
    q.groups.erase(q.groups.begin());
  }
}

namespace sim_detail {

// How mma.sync and wgmma (wgmma_sim.h) sum the 16 products of one k16 step before adding the
// accumulator. The hardware's association is undocumented. Summed in k order in double (nearly
// exact), a product's slot in its group would not matter: moving a key to another slot of the
// same group, with exact zeros around it, would change no bit, which need not hold on tensor
// cores. So the default, "pairwise", sums in float32 along a binary tree (slots 2i and 2i + 1,
// then pairs of pairs), rounding at every node: a kernel whose rows must be the same bits in two
// layouts fails here when the layouts put a row's products in other slots. "sequential" (the
// environment's JETSPEC_SIM_KGROUP_SUM) is the former model, for comparisons.
enum class KGroupSum { kPairwise, kSequential };

inline KGroupSum kgroup_sum_mode() {
  const char* env = std::getenv("JETSPEC_SIM_KGROUP_SUM");
  if (env == nullptr || std::strcmp(env, "pairwise") == 0) return KGroupSum::kPairwise;
  if (std::strcmp(env, "sequential") == 0) return KGroupSum::kSequential;
  ::jetspec_sim::fail("JETSPEC_SIM_KGROUP_SUM must be pairwise or sequential");
}

// acc + sum_k a[k] * b[k] over one k16 step, in the association kgroup_sum_mode() names. The
// products of 16-bit inputs are exact in float32.
inline float kgroup_sum(float acc, const float (&a)[16], const float (&b)[16]) {
  if (kgroup_sum_mode() == KGroupSum::kSequential) {
    double sum = 0.0;
    for (int k = 0; k < 16; ++k) sum += static_cast<double>(a[k]) * b[k];
    return static_cast<float>(acc + sum);
  }
  float level[16];
  for (int k = 0; k < 16; ++k) level[k] = a[k] * b[k];
  for (int width = 8; width >= 1; width /= 2)
    for (int i = 0; i < width; ++i) level[i] = level[2 * i] + level[2 * i + 1];
  return acc + level[0];
}

inline unsigned lane() { return ::jetspec_sim::thread_idx.x & 31u; }

// The 32 lanes' values of `v`, in lane order.
inline std::array<uint64_t, 32> gather(uint64_t v) {
  return ::jetspec_sim::exchange(v, [](const uint64_t* w) {
    std::array<uint64_t, 32> all;
    std::copy(w, w + 32, all.begin());
    return all;
  });
}

inline uint16_t load16(uint64_t row_address, int col) {
  uint16_t v;
  std::memcpy(&v, reinterpret_cast<const unsigned char*>(row_address) + 2 * col, 2);
  return v;
}

}  // namespace sim_detail

// Lanes 8m..8m+7 give the row addresses of matrix m; lane l gets row l/4, columns 2(l%4), +1.
inline void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  const auto rows = sim_detail::gather(reinterpret_cast<uint64_t>(p));
  const unsigned l = sim_detail::lane();
  for (int m = 0; m < 4; ++m) {
    const uint64_t row = rows[m * 8 + (l >> 2)];
    r[m] = sim_detail::load16(row, 2 * (l & 3)) |
           (static_cast<uint32_t>(sim_detail::load16(row, 2 * (l & 3) + 1)) << 16);
  }
}

// Transposed: lane l gets rows 2(l%4) and 2(l%4)+1 of column l/4.
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  const auto rows = sim_detail::gather(reinterpret_cast<uint64_t>(p));
  const unsigned l = sim_detail::lane();
  for (int m = 0; m < 4; ++m) {
    const int col = static_cast<int>(l >> 2);
    r[m] = sim_detail::load16(rows[m * 8 + 2 * (l & 3)], col) |
           (static_cast<uint32_t>(sim_detail::load16(rows[m * 8 + 2 * (l & 3) + 1], col)) << 16);
  }
}

// d += a * b for the warp's 16x16 A (row-major fragments) and 16x8 B (column fragments).
template <typename T>
inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  const auto a01 = sim_detail::gather(a[0] | (static_cast<uint64_t>(a[1]) << 32));
  const auto a23 = sim_detail::gather(a[2] | (static_cast<uint64_t>(a[3]) << 32));
  const auto b = sim_detail::gather(b0 | (static_cast<uint64_t>(b1) << 32));
  auto half = [](uint64_t word, int which) {  // which: 0..3, the 16-bit pieces of a 64-bit word
    return to_float(T{static_cast<uint16_t>(word >> (16 * which))});
  };
  float A[16][16], B[16][8];
  for (int L = 0; L < 32; ++L) {
    const int g = L >> 2, t = L & 3;
    for (int h = 0; h < 2; ++h) {
      A[g][2 * t + h] = half(a01[L], h);          // a0
      A[g + 8][2 * t + h] = half(a01[L], 2 + h);  // a1
      A[g][2 * t + 8 + h] = half(a23[L], h);      // a2
      A[g + 8][2 * t + 8 + h] = half(a23[L], 2 + h);  // a3
      B[2 * t + h][g] = half(b[L], h);            // b0
      B[2 * t + 8 + h][g] = half(b[L], 2 + h);    // b1
    }
  }
  const int g = static_cast<int>(sim_detail::lane() >> 2), t = static_cast<int>(sim_detail::lane() & 3);
  for (int i = 0; i < 4; ++i) {
    const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
    float a[16], b[16];
    for (int k = 0; k < 16; ++k) {
      a[k] = A[row][k];
      b[k] = B[k][col];
    }
    d[i] = sim_detail::kgroup_sum(d[i], a, b);
  }
}

// Two floats -> one register of two 16-bit values (lo = first, the lower column).
template <typename T>
inline uint32_t pack2(float lo, float hi) {
  return from_float<T>(lo).bits | (static_cast<uint32_t>(from_float<T>(hi).bits) << 16);
}

}  // namespace jetspec
