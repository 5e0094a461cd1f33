// A CPU stand-in for the CUDA features the csrc kernels use, so that CI (no GPU) can run the
// real kernel source against python_ref. Included by jetspec/common.cuh and jetspec/api.h when
// JETSPEC_CPU_SIM is defined; tests/cuda_sim/build.py builds csrc with it (g++, C++20).
//
// Model: the blocks of a launch run one after another; the threads of a block are fibers on the
// launching thread that take turns in a fixed order (Block below), switching only at barriers.
// __syncthreads / __syncwarp are barriers; a shuffle or ballot is a store to a per-warp exchange
// buffer between two warp barriers (every lane of the warp must take part, as the kernels do).
// A thread that returns leaves its barriers (arrive_and_drop), like an exited GPU thread.
// `__shared__` locals become `static`: one block at a time, so all of its threads share them.
// Float math is plain IEEE float (build with -ffp-contract=off): __fadd_rn and friends are exact
// counterparts; expf/logf come from glibc, which may differ from CUDA's by an ulp.
// Inline PTX is not simulated: jetspec/mma.cuh and wgmma.cuh take their wrappers from mma_sim.h
// and wgmma_sim.h instead.
// cp.async copies land as late as allowed (at the wait that retires their group; the
// destination holds NaN bytes until then), so a missing wait or an early refill shows.
// Named barriers (bar.sync id, count) and mbarrier waits (tma_sim.h, through WaitList) block a
// fiber like __syncthreads does, so the deadlock check covers them too; a thread that completes
// an mbarrier phase hands the turn to the threads it wakes.
// What the simulator cannot show: timing, races between orders other than the two it runs (a
// warp's lanes interleaving instruction by instruction), and hardware-specific rounding (an MMA
// k-group is summed along a pairwise tree, mma_sim.h's kgroup_sum: a kernel may not rely on the
// k order, but the hardware's own association is not modelled).
#pragma once
#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __shared__ static
#define __grid_constant__
// Bounds of the static locals of namespace jetspec (sim_shared.ld gathers them), which launch()
// poisons for every block.
extern "C" unsigned char __start_jetspec_sim_shared[], __stop_jetspec_sim_shared[];

// ---- runtime API surface --------------------------------------------------------------------
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInsufficientDriver = 35,
  cudaErrorNoDevice = 100,
  cudaErrorNotSupported = 801,
};
struct CUstream_st;
using cudaStream_t = CUstream_st*;
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

// A failed launch is reported by the next cudaGetLastError, as on the GPU.
inline cudaError_t sim_launch_error = cudaSuccess;
inline cudaError_t cudaGetLastError() {
  const cudaError_t err = sim_launch_error;
  sim_launch_error = cudaSuccess;
  return err;
}
inline const char* cudaGetErrorName(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
  }
  return "cudaSimError";
}
inline const char* cudaGetErrorString(cudaError_t) { return "error in the CPU simulator"; }
inline cudaError_t cudaGetDeviceCount(int* n) {
  *n = 0;
  return cudaErrorNoDevice;
}
// The runtime is CUDA 13.0's; the driver's CUDA version is JETSPEC_SIM_DRIVER_VERSION (default
// 13000), so a test can play a driver too old for the runtime.
inline cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = 13000;
  return cudaSuccess;
}
inline cudaError_t cudaDriverGetVersion(int* v) {
  const char* env = std::getenv("JETSPEC_SIM_DRIVER_VERSION");
  *v = env != nullptr ? std::atoi(env) : 13000;
  return cudaSuccess;
}
// An H200's attributes; JETSPEC_SIM_SM_COUNT overrides the SM count and
// JETSPEC_SIM_SMEM_PER_BLOCK the default shared memory per block (tests of launch plans).
enum cudaDeviceAttr {
  cudaDevAttrMaxSharedMemoryPerBlock = 8,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrMaxSharedMemoryPerMultiprocessor = 81,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};
inline cudaError_t cudaGetDevice(int* dev) {
  *dev = 0;
  return cudaSuccess;
}
// The opt-in shared memory per block: an H200's, or JETSPEC_SIM_SMEM_OPTIN (a smaller device).
inline int sim_smem_optin() {
  const char* env = std::getenv("JETSPEC_SIM_SMEM_OPTIN");
  return env != nullptr ? std::atoi(env) : 232448;
}
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: {
      const char* env = std::getenv("JETSPEC_SIM_SM_COUNT");
      *value = env != nullptr ? std::atoi(env) : 132;
      return cudaSuccess;
    }
    case cudaDevAttrMaxSharedMemoryPerBlock: {
      const char* env = std::getenv("JETSPEC_SIM_SMEM_PER_BLOCK");
      *value = env != nullptr ? std::atoi(env) : 49152;
      return cudaSuccess;
    }
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = 233472; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = sim_smem_optin(); return cudaSuccess;
  }
  return cudaErrorInvalidValue;
}
// Dynamic shared memory over 48 KB needs the kernel's opt-in first, up to the device's limit;
// launch() checks it as the GPU does.
constexpr size_t kSimSmemDefault = 48 * 1024;
inline std::map<const void*, size_t>& smem_optin() {
  static std::map<const void*, size_t> m;
  return m;
}
template <typename F>
cudaError_t cudaFuncSetAttribute(F kernel, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
      value > sim_smem_optin())
    return cudaErrorInvalidValue;
  smem_optin()[reinterpret_cast<const void*>(kernel)] = static_cast<size_t>(value);
  return cudaSuccess;
}
// binaryVersion: the arch of the code the runtime picked for a kernel, 90 (an H200 running the
// sm_90a build) unless JETSPEC_SIM_BINARY_VERSION says otherwise.
struct cudaFuncAttributes {
  int binaryVersion;
};
template <typename F>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, F) {
  const char* env = std::getenv("JETSPEC_SIM_BINARY_VERSION");
  attr->binaryVersion = env != nullptr ? std::atoi(env) : 90;
  return cudaSuccess;
}

namespace jetspec_sim {
// Resident CTAs per SM by an H100 / H200's limits (the CUDA occupancy calculator's rules): 2048
// threads, 32 CTAs, 64 K registers allocated per warp in units of 256, 228 KB of shared memory
// with 1 KB reserved per CTA (allocated in units of 128 bytes). `regs` is the registers a thread
// uses: on the GPU ptxas decides it, here the caller says (the launch bounds' cap; the ptxas gate
// test checks the real count against it).
inline int occupancy(int threads, size_t smem, int regs) {
  if (threads <= 0 || threads > 1024 || regs <= 0 || regs > 255) return 0;
  const int warps = (threads + 31) / 32;
  const int per_warp = (regs * 32 + 255) / 256 * 256;
  const int by_regs = 65536 / per_warp / warps;
  const int by_threads = 2048 / (warps * 32);
  const size_t per_cta = (smem + 1024 + 127) / 128 * 128;
  const int by_smem = static_cast<int>(233472 / per_cta);
  return std::min(std::min(by_regs, by_threads), std::min(by_smem, 32));
}
}  // namespace jetspec_sim

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

struct alignas(8) float2 {
  float x, y;
};
inline float2 make_float2(float x, float y) { return float2{x, y}; }
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};

// ---- storage types --------------------------------------------------------------------------
struct __half {
  uint16_t bits;
};
struct __nv_bfloat16 {
  uint16_t bits;
};
inline float __half2float(__half h) {
  _Float16 f;
  std::memcpy(&f, &h.bits, 2);
  return static_cast<float>(f);
}
inline __half __float2half_rn(float v) {
  const _Float16 f = static_cast<_Float16>(v);
  __half h;
  std::memcpy(&h.bits, &f, 2);
  return h;
}
inline float __bfloat162float(__nv_bfloat16 b) {
  const uint32_t u = static_cast<uint32_t>(b.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  if (v != v) return __nv_bfloat16{0x7fc0};
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return __nv_bfloat16{static_cast<uint16_t>(u >> 16)};
}

// ---- device math ----------------------------------------------------------------------------
using std::max;
using std::min;
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline int __ffs(unsigned x) { return __builtin_ffs(static_cast<int>(x)); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x)); }
// The low 32 bits of (hi:lo) >> (shift % 32).
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
  const uint64_t both = (static_cast<uint64_t>(hi) << 32) | lo;
  return static_cast<unsigned>(both >> (shift & 31u));
}
// One fiber runs at a time, so a read-modify-write is atomic as written.
template <typename T>
T atomicAdd(T* address, T value) {
  const T old = *address;
  *address = old + value;
  return old;
}
inline int __float_as_int(float f) {
  int i;
  std::memcpy(&i, &f, 4);
  return i;
}
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}

// ---- threads, barriers, warp exchange -------------------------------------------------------
namespace jetspec_sim {

// A simulated program error (a deadlock, a broken PTX rule): message, then abort.
[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "cuda_sim: %s\n", what);
  std::abort();
}

// A vector access (jetspec/common.cuh's as_units) at an address off its size: the GPU faults
// ("misaligned address"), where x86 would read or write it as if nothing were wrong.
inline void require_aligned(const void* p, std::size_t align) {
  if (reinterpret_cast<std::uintptr_t>(p) % align != 0)
    fail("misaligned vector access: a unit of 16 (or 8, 4) bytes at an address not a multiple "
         "of its size (the GPU faults)");
}

// The threads of a block are fibers (ucontext) on the launching thread and take turns: exactly
// one runs at a time, until it waits at a barrier or exits; then the runnable thread first in the
// block's order runs. So each stretch between two barriers runs whole, in a fixed order: lowest
// thread first, or highest first (alternating between blocks and launches;
// JETSPEC_SIM_ORDER=forward or reverse fixes it; =random:SEED picks a random runnable thread at
// every switch, for stress runs). A shared-memory race (a write and a read of one
// address by two threads with no barrier between them) then gives the same wrong answer on every
// run in one of the two orders, instead of depending on how the OS interleaves threads. Every live
// thread waiting with none runnable is a deadlock, reported at once.
struct Block;
struct Barrier {
  Block* blk;
  unsigned expected;
  unsigned arrived = 0;
  std::vector<unsigned> waiters;
  void arrive_and_wait();
  void arrive_and_drop();  // an exiting thread: the barrier stops waiting for it
};

struct Block {
  Block(unsigned n, bool reverse_order, std::mt19937_64* random_order)
      : all{this, n}, xchg(n), runnable(n, true), urgent(n, false), fibers(n),
        reverse(reverse_order), rng(random_order) {
    for (unsigned w = 0; w * 32 < n; ++w) warps.push_back({this, std::min(32u, n - 32 * w)});
  }
  Barrier all;
  std::vector<Barrier> warps;
  std::map<int, Barrier> named;  // bar.sync / bar.arrive id, count (ids 1..15)
  std::vector<uint64_t> xchg;
  std::vector<bool> runnable;
  std::vector<bool> urgent;  // woken by an mbarrier phase: runs before everyone else
  std::vector<ucontext_t> fibers;
  ucontext_t launcher;
  unsigned done = 0;
  bool reverse;
  std::mt19937_64* rng;  // non-null: random order

  // The runnable thread first in this block's order (urgent ones first), or -1.
  int next() const {
    const int n = static_cast<int>(runnable.size());
    for (int t = 0; t < n; ++t)
      if (runnable[t] && urgent[t]) return t;
    if (rng != nullptr) {
      int count = 0;
      for (int t = 0; t < n; ++t) count += runnable[t] ? 1 : 0;
      if (count == 0) return -1;
      int pick = static_cast<int>((*rng)() % static_cast<uint64_t>(count));
      for (int t = 0; t < n; ++t)
        if (runnable[t] && pick-- == 0) return t;
    }
    for (int i = 0; i < n; ++i) {
      const int t = reverse ? n - 1 - i : i;
      if (runnable[t]) return t;
    }
    return -1;
  }
  // Thread `self` stops running (it waits, or has exited) and the next one runs; a live thread
  // comes back here when its turn comes again.
  void yield(unsigned self, bool exited);
};

// Threads blocked until some shared state changes (an mbarrier phase); wake() makes them
// runnable, and each re-checks what it waits for. wake_first() also lets them run before the
// waking thread goes on: a producer freed by a consumer's release then refills the stage at
// once, so a consumer that still reads it after releasing it sees the refill.
struct WaitList {
  std::vector<unsigned> waiters;
  void wait();
  void wake();
  void wake_first();
};

inline dim3 thread_idx, block_idx;  // of the running thread
inline Block* block;
inline dim3 grid_dim, block_dim;

inline std::vector<unsigned char>& smem_buffer() {
  static std::vector<unsigned char> buf;
  return buf;
}
// 1024-byte aligned, as the wgmma kernel's swizzled tiles need (the buffer has the slack).
inline unsigned char* dynamic_smem() {
  const auto base = reinterpret_cast<uintptr_t>(smem_buffer().data());
  return reinterpret_cast<unsigned char*>((base + 1023) & ~static_cast<uintptr_t>(1023));
}

inline Barrier& my_warp() { return block->warps[thread_idx.x >> 5]; }

inline void Block::yield(unsigned self, bool exited) {
  const int t = next();
  if (t == static_cast<int>(self)) return;
  if (t < 0) {
    if (done < runnable.size()) fail("deadlock: every live thread of a block waits at a barrier");
    setcontext(&launcher);  // the last thread has exited
  }
  thread_idx = dim3(static_cast<unsigned>(t));
  urgent[t] = false;
  if (exited) {
    setcontext(&fibers[t]);
  } else {
    swapcontext(&fibers[self], &fibers[t]);
  }
}

// Per simulated thread state of the PTX emulations (cp.async and wgmma queues), fresh for each
// block, like registers.
inline unsigned long long block_serial = 0;
template <typename T>
T& thread_state() {
  static std::vector<T> states;
  static unsigned long long serial = ~0ull;
  if (serial != block_serial) {
    states.assign(block_dim.x, T{});
    serial = block_serial;
  }
  return states[thread_idx.x];
}

// griddepcontrol.wait (jetspec/pdl.cuh's pdl_begin). On the GPU every kernel is launched with
// programmatic dependent launch, so it may run before the previous kernel in the stream has
// finished until it waits. The simulator cannot see global-memory reads, so it checks where the
// wait is: every thread must have waited before its first barrier or shuffle, and before it exits.
struct PdlState {
  bool waited = false;
};
inline void griddepcontrol_wait() { thread_state<PdlState>().waited = true; }
inline void require_pdl_wait() {
  if (!thread_state<PdlState>().waited)
    fail("PDL: a thread reached a barrier, a shuffle or its exit before pdl_begin() "
         "(griddepcontrol.wait); a kernel must start with it");
}

inline void Barrier::arrive_and_wait() {
  require_pdl_wait();
  const unsigned self = thread_idx.x;
  if (++arrived == expected) {
    for (unsigned w : waiters) blk->runnable[w] = true;
    waiters.clear();
    arrived = 0;
  } else {
    waiters.push_back(self);
    blk->runnable[self] = false;
  }
  blk->yield(self, false);
}

inline void WaitList::wait() {
  const unsigned self = thread_idx.x;
  waiters.push_back(self);
  block->runnable[self] = false;
  block->yield(self, false);
}

inline void WaitList::wake() {
  for (unsigned w : waiters) block->runnable[w] = true;
  waiters.clear();
}

inline void WaitList::wake_first() {
  if (waiters.empty()) return;
  for (unsigned w : waiters) block->urgent[w] = true;
  wake();
  block->yield(thread_idx.x, false);  // this thread stays runnable and resumes in its turn
}

// Block-wide state of a PTX emulation (mbarriers), fresh for each block, like shared memory.
template <typename T>
T& block_state() {
  static T state;
  static unsigned long long serial = ~0ull;
  if (serial != block_serial) {
    state = T{};
    serial = block_serial;
  }
  return state;
}

inline void Barrier::arrive_and_drop() {
  if (--expected == arrived && arrived > 0) {
    for (unsigned w : waiters) blk->runnable[w] = true;
    waiters.clear();
    arrived = 0;
  }
}

// JETSPEC_SIM_ORDER "random:SEED": one generator for the process, seeded once.
inline std::mt19937_64* random_order() {
  static std::mt19937_64* rng = [] () -> std::mt19937_64* {
    const char* env = std::getenv("JETSPEC_SIM_ORDER");
    if (env == nullptr || std::strncmp(env, "random", 6) != 0) return nullptr;
    return new std::mt19937_64(env[6] == ':' ? std::strtoull(env + 7, nullptr, 10) : 0);
  }();
  return rng;
}

// JETSPEC_SIM_ORDER: "forward", "reverse", or unset to alternate.
inline bool reverse_order(unsigned long long launch, unsigned long long block_linear) {
  const char* env = std::getenv("JETSPEC_SIM_ORDER");
  if (env != nullptr && std::strcmp(env, "forward") == 0) return false;
  if (env != nullptr && std::strcmp(env, "reverse") == 0) return true;
  return ((launch + block_linear) & 1ull) != 0;
}

// Every lane publishes `bits`; returns the exchange buffer of this warp after all have.
template <typename F>
auto exchange(uint64_t bits, F&& read) {
  block->xchg[thread_idx.x] = bits;
  my_warp().arrive_and_wait();
  auto r = read(&block->xchg[thread_idx.x & ~31u]);
  my_warp().arrive_and_wait();
  return r;
}

// A kernel that never finishes (a loop that does not end) aborts the process
// with a message after this long, instead of hanging the test run.
// JETSPEC_SIM_WATCHDOG_S overrides the limit (e.g. shorter for a sweep of mutations).
inline std::chrono::seconds watchdog_limit() {
  const char* env = std::getenv("JETSPEC_SIM_WATCHDOG_S");
  return std::chrono::seconds(env != nullptr ? std::atoi(env) : 300);
}

struct Watchdog {
  Watchdog() : thread([this] {
    std::unique_lock<std::mutex> lock(mu);
    const auto limit = watchdog_limit();
    if (!cv.wait_for(lock, limit, [this] { return done; })) {
      std::fprintf(stderr, "cuda_sim: a kernel launch did not finish within %lld s (hang)\n",
                   static_cast<long long>(limit.count()));
      std::abort();
    }
  }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
    }
    cv.notify_one();
    thread.join();
  }
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread thread;
};

// Checks a PTX emulation runs when a block's threads have all exited (e.g. setmaxnreg).
inline std::vector<void (*)()>& block_end_checks() {
  static std::vector<void (*)()> checks;
  return checks;
}

constexpr size_t kFiberStack = 256 * 1024;
inline std::function<void()>* fiber_body;
inline unsigned long long launch_count = 0;

// Stack of thread slot t, allocated once and reused by every block. A guard page below it turns
// an overflow into a segfault instead of silent corruption of another thread's stack.
inline char* fiber_stack(unsigned t) {
  static std::vector<char*> stacks;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  while (stacks.size() <= t) {
    void* m = mmap(nullptr, kFiberStack + page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED || mprotect(m, page, PROT_NONE) != 0) fail("cannot map a fiber stack");
    stacks.push_back(static_cast<char*>(m) + page);
  }
  return stacks[t];
}

// A simulated thread: the kernel, then it leaves its barriers and hands the turn on.
inline void run_fiber() {
  (*fiber_body)();
  require_pdl_wait();
  const unsigned self = thread_idx.x;
  block->runnable[self] = false;
  ++block->done;
  my_warp().arrive_and_drop();
  block->all.arrive_and_drop();
  block->yield(self, true);
}

// Runs `kernel(args...)` on grid x block threads, one block at a time.
template <typename... KArgs, typename... Args>
cudaError_t launch(dim3 grid, dim3 threads, size_t smem, void (*kernel)(KArgs...), Args... args) {
  if (threads.y != 1 || threads.z != 1 || threads.x == 0 || threads.x > 1024) {
    return sim_launch_error = cudaErrorInvalidConfiguration;
  }
  if (smem > kSimSmemDefault) {
    const auto it = smem_optin().find(reinterpret_cast<const void*>(kernel));
    if (it == smem_optin().end() || smem > it->second) return sim_launch_error = cudaErrorInvalidValue;
  }
  grid_dim = grid;
  block_dim = threads;
  ++launch_count;
  Watchdog watchdog;
  // Blocks run one at a time in the launch's order (reverse_order(launch, 0) reverses it, random
  // shuffles it), so a block that depends on another block of the same launch fails in one order.
  const unsigned long long blocks = 1ull * grid.x * grid.y * grid.z;
  std::vector<unsigned long long> order(blocks);
  for (unsigned long long i = 0; i < blocks; ++i) order[i] = i;
  if (random_order() != nullptr) {
    std::shuffle(order.begin(), order.end(), *random_order());
  } else if (reverse_order(launch_count, 0)) {
    std::reverse(order.begin(), order.end());
  }
  for (const unsigned long long linear : order) {
    const unsigned x = static_cast<unsigned>(linear % grid.x);
    const unsigned y = static_cast<unsigned>(linear / grid.x % grid.y);
    const unsigned z = static_cast<unsigned>(linear / grid.x / grid.y);
    // Poisoned for every block, like uninitialised shared memory (nothing carries over):
    // dynamic with 0xA5 bytes, static with 0x7F (a huge float, NaN in fp16).
    smem_buffer().assign(smem + 1024 + 16, 0xA5);
    std::memset(__start_jetspec_sim_shared, 0x7F,
                static_cast<size_t>(__stop_jetspec_sim_shared - __start_jetspec_sim_shared));
    Block blk(threads.x, reverse_order(launch_count, linear), random_order());
    block = &blk;
    block_idx = dim3(x, y, z);
    ++block_serial;
    std::function<void()> body = [&] { kernel(args...); };
    for (unsigned t = 0; t < threads.x; ++t) {
      getcontext(&blk.fibers[t]);
      blk.fibers[t].uc_stack.ss_sp = fiber_stack(t);
      blk.fibers[t].uc_stack.ss_size = kFiberStack;
      blk.fibers[t].uc_link = nullptr;
      makecontext(&blk.fibers[t], &run_fiber, 0);
    }
    fiber_body = &body;
    const int first = blk.next();
    thread_idx = dim3(static_cast<unsigned>(first));
    swapcontext(&blk.launcher, &blk.fibers[first]);
    // A named barrier left with arrivals (bar.arrive without the matching bar.sync) would carry
    // them into the next use of its id; the kernels keep every barrier balanced.
    for (const auto& [id, bar] : blk.named) {
      if (bar.arrived != 0) {
        char msg[120];
        std::snprintf(msg, sizeof(msg), "named barrier %d has %u of %u arrivals pending at block "
                      "exit (unbalanced bar.arrive / bar.sync)", id, bar.arrived, bar.expected);
        fail(msg);
      }
    }
    for (auto& check : block_end_checks()) check();
  }
  return cudaSuccess;
}

}  // namespace jetspec_sim

#define threadIdx (::jetspec_sim::thread_idx)
#define blockIdx (::jetspec_sim::block_idx)
#define blockDim (::jetspec_sim::block_dim)
#define gridDim (::jetspec_sim::grid_dim)

inline void __syncthreads() { ::jetspec_sim::block->all.arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { ::jetspec_sim::my_warp().arrive_and_wait(); }

namespace jetspec_sim {
// Named barrier `id` with `count` threads: the first use of an id in a block fixes its count.
inline Barrier& named_barrier(int id, int count) {
  if (id <= 0 || id > 15 || count <= 0 || count % 32 != 0)
    fail("bar.sync / bar.arrive: id must be 1..15 and the count a positive multiple of 32");
  auto it = block->named.find(id);
  if (it == block->named.end())
    it = block->named.emplace(id, Barrier{block, static_cast<unsigned>(count)}).first;
  if (it->second.expected != static_cast<unsigned>(count))
    fail("bar.sync / bar.arrive: one named barrier used with two thread counts");
  return it->second;
}
// bar.sync id, count: arrive and wait until `count` threads have arrived.
inline void named_barrier_sync(int id, int count) { named_barrier(id, count).arrive_and_wait(); }
// bar.arrive id, count: arrive without waiting; completes the barrier if it is the last arrival.
inline void named_barrier_arrive(int id, int count) {
  require_pdl_wait();
  Barrier& bar = named_barrier(id, count);
  if (++bar.arrived == bar.expected) {
    for (unsigned w : bar.waiters) block->runnable[w] = true;
    bar.waiters.clear();
    bar.arrived = 0;
  }
}
}  // namespace jetspec_sim

namespace jetspec_sim {
// Every lane publishes v and reads lane src_of(its own lane) of the warp (a 32-lane shuffle).
template <typename T, typename Src>
T shuffle(T v, Src src_of) {
  static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  const unsigned src = src_of(thread_idx.x & 31u) & 31u;
  const uint64_t got = exchange(bits, [&](const uint64_t* w) { return w[src]; });
  T out;
  std::memcpy(&out, &got, sizeof(T));
  return out;
}
}  // namespace jetspec_sim

template <typename T>
T __shfl_xor_sync(unsigned, T v, int lane_mask) {
  return ::jetspec_sim::shuffle(v, [&](unsigned lane) { return lane ^ static_cast<unsigned>(lane_mask); });
}

template <typename T>
T __shfl_sync(unsigned, T v, int src_lane) {
  return ::jetspec_sim::shuffle(v, [&](unsigned) { return static_cast<unsigned>(src_lane); });
}

template <typename T>
T __shfl_up_sync(unsigned, T v, unsigned delta) {
  static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  const unsigned lane = ::jetspec_sim::thread_idx.x & 31u;
  const uint64_t got = ::jetspec_sim::exchange(
      bits, [&](const uint64_t* w) { return lane >= delta ? w[lane - delta] : w[lane]; });
  T out;
  std::memcpy(&out, &got, sizeof(T));
  return out;
}

inline unsigned __ballot_sync(unsigned, bool pred) {
  const unsigned lanes = std::min(32u, ::jetspec_sim::block_dim.x - (::jetspec_sim::thread_idx.x & ~31u));
  return ::jetspec_sim::exchange(pred ? 1u : 0u, [&](const uint64_t* w) {
    unsigned m = 0;
    for (unsigned l = 0; l < lanes; ++l) m |= static_cast<unsigned>(w[l] & 1u) << l;
    return m;
  });
}
