// The wgmma wrappers of jetspec/wgmma.cuh, emulated for cuda_sim.h.
//
// Descriptors hold offsets into the simulated dynamic shared memory (1024-byte aligned, so the
// 128B swizzle is the XOR of address bits 4-6 with bits 7-9, as on the GPU). An operand element
// is found from the descriptor with the PTX ISA's canonical layouts:
//   K-major,  128B swizzle: ((8,m),(T,2k)) : ((8T,SBO),(1,T))   element (mn, k)
//   MN-major, 128B swizzle: ((T,8,m),(8,k)) : ((1,T,LBO),(8T,SBO))
// (T = 8 16-bit elements per 16 bytes). This encodes our reading of the ISA, the same reading
// the kernel was written from; the GPU tests are what check it against the hardware.
//
// Asynchrony: wgmma_ss / wgmma_rs only queue the operation (A registers are captured at issue)
// and poison the accumulators with NaN; the queued groups run, reading shared memory then, at the
// wgmma_wait that retires them, and only then are the accumulators written back. So reading the
// accumulators before the wait, writing them in between, or refilling an operand's shared memory
// before the wait all show up as wrong results; a write that changes the poison's bits (e.g. a
// store of a number) fails at the write-back with a message. wgmma_wait<N> retires exactly the
// groups older than the newest N, as the ISA's wait_group N, so a wait one group too shallow
// leaves the accumulators NaN. Shapes: m64nN with N = 8 * ntiles (64 here, 128 in hopper_sim.h).
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace jetspec {

#define JETSPEC_WGMMA 1

namespace sim_detail {

struct WgmmaOp;
using WgmmaRun = void (*)(const WgmmaOp&);
struct WgmmaOp {
  WgmmaRun run;             // run<T> for the operand type
  float (*d)[4];            // the thread's accumulators (float[ntiles][4])
  uint64_t desc_a, desc_b;  // desc_a unused when A comes from registers
  bool a_in_regs, accumulate;
  float a[2][16];           // A rows 16w + g and 16w + g + 8 (register A only)
  int ntiles = 8;           // N / 8
};
struct WgmmaQueue {
  std::vector<WgmmaOp> open;
  std::vector<std::vector<WgmmaOp>> groups;
  std::map<float (*)[4], std::vector<float>> shadow;  // true accumulators while in flight
  bool fenced = false;  // wgmma.fence since the last wait (after which registers are touched)
  // Register-A fragments (address, value) through wgmma_fence_fragment since the last
  // wgmma.fence, and those the last wgmma.fence ordered.
  std::vector<std::pair<const uint32_t*, std::array<uint32_t, 4>>> a_pending, a_ordered;
};
inline WgmmaQueue& wgmma_queue() { return ::jetspec_sim::thread_state<WgmmaQueue>(); }

// Address of element (mn, k) of a 16-bit operand described by desc.
inline const unsigned char* sw128_element(uint64_t desc, bool mn_major, int mn, int k) {
  if ((desc >> 62) != 1) ::jetspec_sim::fail("wgmma descriptor: only 128B swizzle is simulated");
  if (((desc >> 49) & 7) != 0) ::jetspec_sim::fail("wgmma descriptor: base offset must be 0");
  const size_t start = (desc & 0x3FFFu) << 4;
  const size_t lbo = ((desc >> 16) & 0x3FFFu) << 4;
  const size_t sbo = ((desc >> 32) & 0x3FFFu) << 4;
  const size_t off = mn_major ? (mn / 64) * lbo + (k / 8) * sbo + (k % 8) * 128 + (mn % 64) * 2
                              : (mn / 8) * sbo + (mn % 8) * 128 + k * 2;
  size_t addr = start + off;
  addr ^= ((addr >> 7) & 7u) << 4;
  return ::jetspec_sim::dynamic_smem() + addr;
}

template <typename T>
inline float element(uint64_t desc, bool mn_major, int mn, int k) {
  T v;
  std::memcpy(&v.bits, sw128_element(desc, mn_major, mn, k), 2);
  return to_float(v);
}

// The bits of the NaN an in-flight accumulator holds (a quiet NaN with a payload).
constexpr uint32_t kInFlightBits = 0x7fc0f00du;
inline float in_flight_nan() {
  float f;
  std::memcpy(&f, &kInFlightBits, 4);
  return f;
}

inline std::vector<float>& true_accumulators(float (*d)[4], int ntiles) {
  auto& q = wgmma_queue();
  auto it = q.shadow.find(d);
  if (it == q.shadow.end()) {
    std::vector<float> cur(4 * ntiles);
    std::memcpy(cur.data(), d, sizeof(float) * cur.size());
    it = q.shadow.emplace(d, std::move(cur)).first;
    for (int i = 0; i < 4 * ntiles; ++i) d[i / 4][i % 4] = in_flight_nan();
  } else if (it->second.size() != static_cast<size_t>(4 * ntiles)) {
    ::jetspec_sim::fail("wgmma: one accumulator array used with two N in flight");
  }
  return it->second;
}

template <typename T>
inline void run(const WgmmaOp& op) {
  auto& acc = wgmma_queue().shadow.at(op.d);
  const int tid = static_cast<int>(::jetspec_sim::thread_idx.x & 127u);
  const int w = tid >> 5, g = (tid & 31) >> 2, tq = tid & 3;
  for (int j = 0; j < op.ntiles; ++j) {
    for (int e = 0; e < 4; ++e) {
      const int row = 16 * w + g + 8 * (e >> 1), col = 8 * j + 2 * tq + (e & 1);
      float a[16], b[16];
      for (int k = 0; k < 16; ++k) {
        a[k] = op.a_in_regs ? op.a[e >> 1][k] : element<T>(op.desc_a, false, row, k);
        b[k] = element<T>(op.desc_b, op.a_in_regs, col, k);
      }
      float& dst = acc[4 * j + e];
      dst = kgroup_sum(op.accumulate ? dst : 0.f, a, b);  // mma_sim.h: the k-group's association
    }
  }
}

}  // namespace sim_detail

// The simulated dynamic shared memory is already 1024-byte aligned.
inline unsigned char* align_smem_1024(unsigned char* p) {
  if (reinterpret_cast<uintptr_t>(p) % 1024 != 0) ::jetspec_sim::fail("unaligned shared memory");
  return p;
}

inline uint64_t sw128_desc(const void* smem, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  const auto off = static_cast<uint64_t>(static_cast<const unsigned char*>(smem) -
                                         ::jetspec_sim::dynamic_smem());
  if (off >= (1u << 18)) ::jetspec_sim::fail("wgmma descriptor: not in shared memory");
  return (off >> 4) | (static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFFu) << 16) |
         (static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}

// Ordering rules, checked per thread (stricter than the ISA, which needs wgmma.fence only where
// registers an MMA uses were touched since the last one; our kernels touch them after every wait):
// a wgmma needs a wgmma.fence since the thread's last wgmma_wait, and no cp.async data may have
// landed (nor st_shared_zero16 stored) since the thread's last fence.proxy.async (wgmma reads
// shared memory through the async proxy, which does not see generic-proxy writes until that
// fence). A wgmma with A from registers needs that fragment passed, with its current value, to
// wgmma_fence_fragment between the previous wgmma.fence and the one before the issue (else the
// compiler may move its definition past the fence).
inline void wgmma_fence() {
  auto& q = sim_detail::wgmma_queue();
  q.fenced = true;
  q.a_ordered = std::move(q.a_pending);
  q.a_pending.clear();
}
inline void wgmma_fence_fragment(uint32_t (&a)[4]) {
  sim_detail::wgmma_queue().a_pending.push_back({a, {a[0], a[1], a[2], a[3]}});
}
inline void fence_proxy_async() { sim_detail::cp_async_queue().unfenced = false; }
inline void st_shared_zero16(void* dst) {
  std::memset(dst, 0, 16);
  sim_detail::cp_async_queue().unfenced = true;  // a generic-proxy write, as landed cp.async data
}

namespace sim_detail {
inline void check_issue_order() {
  if (!wgmma_queue().fenced)
    ::jetspec_sim::fail("wgmma issued without a wgmma.fence since the last wait");
  if (cp_async_queue().unfenced)
    ::jetspec_sim::fail("wgmma issued after a generic-proxy shared-memory write (cp.async data or "
                        "st.shared) but before fence.proxy.async");
}
}  // namespace sim_detail
inline void wgmma_fence_operand(float (&)[8][4]) {}

inline void wgmma_commit() {
  auto& q = sim_detail::wgmma_queue();
  q.groups.push_back(std::move(q.open));
  q.open.clear();
}

namespace sim_detail {
// Queues d (m64n(8 ntiles)) = A (smem, K-major) * B (smem, K-major) [+ d].
template <typename T>
inline void issue_ss(float (*d)[4], int ntiles, uint64_t desc_a, uint64_t desc_b,
                     bool accumulate) {
  check_issue_order();
  true_accumulators(d, ntiles);
  WgmmaOp op{&run<T>, d, desc_a, desc_b, false, accumulate, {}, ntiles};
  wgmma_queue().open.push_back(op);
}

// Queues d (m64n(8 ntiles)) += A (registers: the warp's m16k16 fragment) * B (smem, MN-major).
template <typename T>
inline void issue_rs(float (*d)[4], int ntiles, const uint32_t (&a)[4], uint64_t desc_b) {
  check_issue_order();
  bool ordered = false;
  for (const auto& [ptr, v] : wgmma_queue().a_ordered)
    ordered = ordered || (ptr == a && v == std::array<uint32_t, 4>{a[0], a[1], a[2], a[3]});
  if (!ordered) {
    ::jetspec_sim::fail("wgmma with A from registers: the fragment was not passed to "
                        "wgmma_fence_fragment (after its last write) right before the wgmma.fence");
  }
  // The warp's m16k16 A fragment (the mma.m16n8k16 layout): rows g, g + 8 of this thread.
  const auto a01 = gather(a[0] | (static_cast<uint64_t>(a[1]) << 32));
  const auto a23 = gather(a[2] | (static_cast<uint64_t>(a[3]) << 32));
  true_accumulators(d, ntiles);
  WgmmaOp op{&run<T>, d, 0, desc_b, true, true, {}, ntiles};
  const int g = static_cast<int>(lane() >> 2);
  auto half = [](uint64_t word, int which) {
    return to_float(T{static_cast<uint16_t>(word >> (16 * which))});
  };
  for (int t = 0; t < 4; ++t) {
    const int L = 4 * g + t;
    for (int h = 0; h < 2; ++h) {
      op.a[0][2 * t + h] = half(a01[L], h);          // a0: row g, k 2t..
      op.a[1][2 * t + h] = half(a01[L], 2 + h);      // a1: row g + 8
      op.a[0][2 * t + 8 + h] = half(a23[L], h);      // a2: row g, k 8 + 2t..
      op.a[1][2 * t + 8 + h] = half(a23[L], 2 + h);  // a3: row g + 8, k 8 + 2t..
    }
  }
  wgmma_queue().open.push_back(op);
}
}  // namespace sim_detail

template <typename T>
inline void wgmma_ss(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  sim_detail::issue_ss<T>(d, 8, desc_a, desc_b, accumulate);
}

template <typename T>
inline void wgmma_rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc_b) {
  sim_detail::issue_rs<T>(d, 8, a, desc_b);
}

// Runs the groups past the newest N, then writes back accumulators with nothing in flight.
template <int N>
inline void wgmma_wait() {
  auto& q = sim_detail::wgmma_queue();
  q.fenced = false;
  q.a_ordered.clear();
  while (q.groups.size() > static_cast<size_t>(N)) {
    for (const auto& op : q.groups.front()) op.run(op);
    q.groups.erase(q.groups.begin());
  }
  for (auto it = q.shadow.begin(); it != q.shadow.end();) {
    bool busy = false;
    for (const auto& grp : q.groups)
      for (const auto& op : grp) busy = busy || op.d == it->first;
    for (const auto& op : q.open) busy = busy || op.d == it->first;
    if (busy) {
      ++it;
      continue;
    }
    for (size_t i = 0; i < it->second.size(); ++i) {
      uint32_t bits;
      std::memcpy(&bits, &it->first[i / 4][i % 4], 4);
      if (bits != sim_detail::kInFlightBits)
        ::jetspec_sim::fail("wgmma: an accumulator was written while its wgmma was in flight");
    }
    std::memcpy(it->first, it->second.data(), sizeof(float) * it->second.size());
    it = q.shadow.erase(it);
  }
}

}  // namespace jetspec
