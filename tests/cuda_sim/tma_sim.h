// The TMA / mbarrier wrappers of jetspec/tma.cuh, and the driver's tensor-map encoding, emulated
// for cuda_sim.h.
//
// Tensor maps: cuTensorMapEncodeTiled (reached through cudaGetDriverEntryPointByVersion, as on
// the GPU) checks the documented requirements (16-byte aligned base and strides, boxes of at most
// 256, a 128-byte inner box for the 128B swizzle) and stores the layout in the opaque words.
//
// mbarriers live in a per-block table keyed by their shared-memory address. A TMA load poisons
// its destination with NaN bytes at issue and lands (out-of-bounds elements as zeros, 16-byte
// chunks swizzled by address bits 4-6 ^ 7-9, as on the GPU) only when a thread waits on its
// mbarrier: as late as the hardware may deliver it. So a consumer that reads a stage before its
// wait, or a producer that refills a stage still being read, sees NaN. Checks: waiting on or
// arriving at an uninitialised barrier, more bytes landing than a phase expected (fewer leave the
// waiters blocked, which the scheduler reports as a deadlock), more arrivals than the count in
// one phase, a TMA destination that is not 1024-byte aligned, and named-barrier misuse
// (cuda_sim.h).
#pragma once
#include <map>
#include <vector>

// ---- driver API surface --------------------------------------------------------------------
using cuuint32_t = uint32_t;
using cuuint64_t = uint64_t;
enum CUresult { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1 };
enum CUtensorMapDataType { CU_TENSOR_MAP_DATA_TYPE_UINT16 = 1 };
enum CUtensorMapInterleave { CU_TENSOR_MAP_INTERLEAVE_NONE = 0 };
enum CUtensorMapSwizzle { CU_TENSOR_MAP_SWIZZLE_128B = 3 };
enum CUtensorMapL2promotion { CU_TENSOR_MAP_L2_PROMOTION_L2_128B = 2 };
enum CUtensorMapFloatOOBfill { CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0 };
struct alignas(64) CUtensorMap {
  uint64_t opaque[16];
};
using PFN_cuTensorMapEncodeTiled_v12000 = CUresult (*)(
    CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*,
    const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
    CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
enum cudaDriverEntryPointQueryResult { cudaDriverEntryPointSuccess = 0 };
constexpr unsigned long long cudaEnableDefault = 0;

namespace jetspec_sim {

// What the simulated encode keeps in CUtensorMap::opaque.
struct TensorMapLayout {
  uint64_t magic;
  const unsigned char* base;
  uint32_t rank, elem_bytes;
  uint64_t dims[5], strides[5];  // strides in bytes, strides[0] = elem_bytes
  uint32_t box[5];
};
static_assert(sizeof(TensorMapLayout) <= sizeof(CUtensorMap), "layout must fit the opaque map");
constexpr uint64_t kTensorMapMagic = 0x4A5354454E534F52ull;

inline CUresult encode_tiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank,
                             void* base, const cuuint64_t* dims, const cuuint64_t* strides,
                             const cuuint32_t* box, const cuuint32_t* element_strides,
                             CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                             CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
  if (reinterpret_cast<uintptr_t>(map) % 64 != 0 || type != CU_TENSOR_MAP_DATA_TYPE_UINT16 ||
      rank == 0 || rank > 5 || reinterpret_cast<uintptr_t>(base) % 16 != 0 ||
      interleave != CU_TENSOR_MAP_INTERLEAVE_NONE || swizzle != CU_TENSOR_MAP_SWIZZLE_128B)
    return CUDA_ERROR_INVALID_VALUE;
  TensorMapLayout t{};
  t.magic = kTensorMapMagic;
  t.base = static_cast<const unsigned char*>(base);
  t.rank = rank;
  t.elem_bytes = 2;
  for (uint32_t i = 0; i < rank; ++i) {
    if (dims[i] == 0 || dims[i] > (1ull << 32) || box[i] == 0 || box[i] > 256 ||
        element_strides[i] != 1)
      return CUDA_ERROR_INVALID_VALUE;
    if (i > 0 && (strides[i - 1] % 16 != 0 || strides[i - 1] >= (1ull << 40)))
      return CUDA_ERROR_INVALID_VALUE;
    t.dims[i] = dims[i];
    t.strides[i] = i == 0 ? 2 : strides[i - 1];
    t.box[i] = box[i];
  }
  // The 128B swizzle takes inner boxes of at most 128 bytes; only exactly 128 is simulated.
  if (box[0] * 2 != 128) return CUDA_ERROR_INVALID_VALUE;
  std::memset(map, 0, sizeof(*map));
  std::memcpy(map->opaque, &t, sizeof(t));
  return CUDA_SUCCESS;
}

}  // namespace jetspec_sim

inline cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned,
                                                    unsigned long long,
                                                    cudaDriverEntryPointQueryResult* found) {
  if (std::strcmp(symbol, "cuTensorMapEncodeTiled") != 0) return cudaErrorInvalidValue;
  *fn = reinterpret_cast<void*>(&::jetspec_sim::encode_tiled);
  *found = cudaDriverEntryPointSuccess;
  return cudaSuccess;
}

namespace jetspec {

namespace sim_detail {

struct TmaCopy {
  unsigned char* dst;
  ::jetspec_sim::TensorMapLayout map;
  int coord[4];
};

struct Mbarrier {
  unsigned count = 0, pending = 0, phase = 0;
  long long tx = 0;
  std::vector<TmaCopy> copies;  // issued, not landed
  ::jetspec_sim::WaitList waiting;
};
using MbarrierTable = std::map<const void*, Mbarrier>;

inline Mbarrier& mbarrier(const void* bar, const char* op) {
  auto& table = ::jetspec_sim::block_state<MbarrierTable>();
  auto it = table.find(bar);
  if (it == table.end()) {
    char msg[96];
    std::snprintf(msg, sizeof(msg), "mbarrier %s on an uninitialised barrier", op);
    ::jetspec_sim::fail(msg);
  }
  return it->second;
}

// Completes the phase once every arrival and every expected byte is in; wakes the waiters. A
// completed phase hands them the turn at once (WaitList::wake_first), so what the completing
// thread does next happens after them.
inline void settle(Mbarrier& b) {
  if (b.tx < 0) ::jetspec_sim::fail("mbarrier: more TMA bytes landed than the phase expected");
  if (b.pending == 0 && b.tx == 0) {
    ++b.phase;
    b.pending = b.count;
    b.waiting.wake_first();
  } else {
    b.waiting.wake();
  }
}

inline void land(const TmaCopy& c) {
  const auto& m = c.map;
  const uint64_t row_bytes = m.box[0] * m.elem_bytes;
  const auto smem_base = reinterpret_cast<uintptr_t>(::jetspec_sim::dynamic_smem());
  uint64_t row = 0;
  for (uint32_t i3 = 0; i3 < m.box[3]; ++i3)
    for (uint32_t i2 = 0; i2 < m.box[2]; ++i2)
      for (uint32_t i1 = 0; i1 < m.box[1]; ++i1, ++row)
        for (uint32_t i0 = 0; i0 < m.box[0]; ++i0) {
          const long long g[4] = {c.coord[0] + static_cast<long long>(i0),
                                  c.coord[1] + static_cast<long long>(i1),
                                  c.coord[2] + static_cast<long long>(i2),
                                  c.coord[3] + static_cast<long long>(i3)};
          bool inside = true;
          uint64_t off = 0;
          for (int d = 0; d < 4; ++d) {
            inside = inside && g[d] >= 0 && static_cast<uint64_t>(g[d]) < m.dims[d];
            off += static_cast<uint64_t>(g[d]) * m.strides[d];
          }
          uintptr_t addr = reinterpret_cast<uintptr_t>(c.dst) - smem_base + row * row_bytes +
                           i0 * m.elem_bytes;
          addr ^= ((addr >> 7) & 7u) << 4;
          unsigned char* dst = reinterpret_cast<unsigned char*>(smem_base + addr);
          if (inside) {
            std::memcpy(dst, m.base + off, m.elem_bytes);
          } else {
            std::memset(dst, 0, m.elem_bytes);
          }
        }
}

inline uint64_t box_bytes(const ::jetspec_sim::TensorMapLayout& m) {
  return static_cast<uint64_t>(m.box[0]) * m.box[1] * m.box[2] * m.box[3] * m.elem_bytes;
}

}  // namespace sim_detail

inline void mbar_init(uint64_t* bar, unsigned count) {
  auto& table = ::jetspec_sim::block_state<sim_detail::MbarrierTable>();
  if (count == 0) ::jetspec_sim::fail("mbarrier.init with count 0");
  if (table.count(bar) != 0) ::jetspec_sim::fail("mbarrier.init of a barrier already initialised");
  auto& b = table[bar];
  b.count = b.pending = count;
}
inline void mbar_init_fence() {}

namespace sim_detail {
inline void arrive(Mbarrier& b) {
  if (b.pending == 0) ::jetspec_sim::fail("mbarrier: more arrivals than its count in one phase");
  --b.pending;
}
}  // namespace sim_detail

inline void mbar_arrive(uint64_t* bar) {
  auto& b = sim_detail::mbarrier(bar, "arrive");
  sim_detail::arrive(b);
  sim_detail::settle(b);
}

inline void mbar_arrive_expect_tx(uint64_t* bar, unsigned bytes) {
  auto& b = sim_detail::mbarrier(bar, "arrive.expect_tx");
  b.tx += bytes;
  sim_detail::arrive(b);
  sim_detail::settle(b);
}

// Lands the barrier's outstanding copies, then blocks until the phase of `parity` is complete.
inline void mbar_wait(uint64_t* bar, unsigned parity) {
  for (;;) {
    auto& b = sim_detail::mbarrier(bar, "try_wait");
    std::vector<sim_detail::TmaCopy> copies;
    copies.swap(b.copies);
    for (const auto& c : copies) {
      sim_detail::land(c);
      b.tx -= static_cast<long long>(sim_detail::box_bytes(c.map));
    }
    if (!copies.empty()) sim_detail::settle(b);
    if ((b.phase & 1u) != (parity & 1u)) return;
    b.waiting.wait();
  }
}

inline void tma_load_4d(void* dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                        uint64_t* bar) {
  ::jetspec_sim::TensorMapLayout m;
  std::memcpy(&m, map->opaque, sizeof(m));
  if (m.magic != ::jetspec_sim::kTensorMapMagic || m.rank != 4)
    ::jetspec_sim::fail("cp.async.bulk.tensor.4d: not a 4-d tensor map");
  auto* d = static_cast<unsigned char*>(dst);
  const auto& buf = ::jetspec_sim::smem_buffer();
  if (d < ::jetspec_sim::dynamic_smem() || d + sim_detail::box_bytes(m) > buf.data() + buf.size() ||
      (d - ::jetspec_sim::dynamic_smem()) % 1024 != 0)
    ::jetspec_sim::fail("cp.async.bulk.tensor: destination not 1024-byte aligned shared memory");
  auto& b = sim_detail::mbarrier(bar, "complete_tx");
  std::memset(d, 0xFF, sim_detail::box_bytes(m));
  b.copies.push_back({d, m, {c0, c1, c2, c3}});
  b.waiting.wake();
}

inline void named_barrier_sync(int id, int count) { ::jetspec_sim::named_barrier_sync(id, count); }
// setmaxnreg: the count is not enforced on the code (ptxas does that), but its rules are checked:
// every thread of a warpgroup executes it with the same count (.sync.aligned), and the counts of
// the warpgroups that ask fit a 64 K register file.
namespace sim_detail {
struct RegSplit {
  std::map<unsigned, std::pair<int, unsigned>> wg;  // warpgroup -> (count, threads that asked)
};
inline void check_reg_split_complete() {
  for (const auto& [wg, e] : ::jetspec_sim::block_state<RegSplit>().wg) {
    const unsigned size = std::min(128u, ::jetspec_sim::block_dim.x - 128u * wg);
    if (e.second != size)
      ::jetspec_sim::fail("setmaxnreg: not every thread of a warpgroup executed it (.aligned)");
  }
}
inline void setmaxnreg(int n) {
  static const bool registered =
      (::jetspec_sim::block_end_checks().push_back(&check_reg_split_complete), true);
  (void)registered;
  auto& st = ::jetspec_sim::block_state<RegSplit>();
  auto& e = st.wg[::jetspec_sim::thread_idx.x / 128u];
  if (e.second != 0 && e.first != n)
    ::jetspec_sim::fail("setmaxnreg: threads of one warpgroup ask for different counts");
  e.first = n;
  ++e.second;
  long total = 0;
  for (const auto& [wg, f] : st.wg) total += 128L * f.first;
  if (total > 65536) ::jetspec_sim::fail("setmaxnreg: the warpgroups ask for more than 64 K registers");
}
}  // namespace sim_detail
template <int N>
inline void warpgroup_reg_dealloc() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: a multiple of 8 in 24..256");
  sim_detail::setmaxnreg(N);
}
template <int N>
inline void warpgroup_reg_alloc() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: a multiple of 8 in 24..256");
  sim_detail::setmaxnreg(N);
}

}  // namespace jetspec
