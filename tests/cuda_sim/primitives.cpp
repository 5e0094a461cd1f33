// Test-only launchers of csrc/include/jetspec/primitives, built into the simulator only (module
// _primitives, tests/cuda_sim/build.py; tests/test_cuda_primitives.py): one block each, which
// calls a primitive the way the kernels do (several calls sharing one scratch array) and writes
// what every thread got.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "jetspec/common.cuh"
#include "jetspec/primitives/block_reduce.cuh"
#include "jetspec/primitives/block_scan.cuh"
#include "jetspec/primitives/radix_select.cuh"

namespace py = pybind11;

namespace jetspec {
namespace primitives_test {

// out[t, 0..5]: min, max and sum of in[], then the minima of (in, -in, in ^ 5) in one pass.
template <int Threads>
__global__ void reduce_kernel(const long long* in, long long* out) {
  pdl_begin();
  __shared__ long long red[3 * Threads / 32];
  const long long v = in[threadIdx.x];
  long long* o = out + 6 * threadIdx.x;
  o[0] = block_reduce<Threads>(v, MinOp(), red);
  o[1] = block_reduce<Threads>(v, MaxOp(), red);
  o[2] = block_reduce<Threads>(v, SumOp(), red);
  long long three[3] = {v, -v, v ^ 5};
  block_reduce_n<Threads>(three, MinOp(), red);
  o[3] = three[0];
  o[4] = three[1];
  o[5] = three[2];
}

// Larger value first, ties to the lower index.
__device__ __forceinline__ bool larger(float av, int ai, float bv, int bi) {
  return av > bv || (av == bv && ai < bi);
}

// Three block_best calls (parities 0, 1, 0), call c on the pairs rotated by 7c threads (the same
// pairs, so the same winner): out_v / out_i[t, c].
template <int Threads>
__global__ void best_kernel(const float* in_v, const int* in_i, float* out_v, int* out_i) {
  pdl_begin();
  __shared__ float buf_v[2 * Threads / 32];
  __shared__ int buf_i[2 * Threads / 32];
  for (int c = 0; c < 3; ++c) {
    const int src = (threadIdx.x + 7 * c) % Threads;
    float v = in_v[src];
    int i = in_i[src];
    block_best<Threads>(v, i, larger, buf_v, buf_i, c & 1);
    out_v[3 * threadIdx.x + c] = v;
    out_i[3 * threadIdx.x + c] = i;
  }
}

// out[t, 0..2]: the warp's inclusive scan of in[], the block's exclusive scan of in[] and of
// 2 * in[] (two calls sharing red).
template <int Threads>
__global__ void scan_kernel(const long long* in, long long* out) {
  pdl_begin();
  __shared__ long long red[Threads / 32];
  const long long v = in[threadIdx.x];
  long long* o = out + 3 * threadIdx.x;
  o[0] = warp_inclusive_scan(v);
  o[1] = block_exclusive_scan(v, red);
  o[2] = block_exclusive_scan(2 * v, red);
}

struct SelectArgs {
  const void* keys;                 // [n] Key
  const unsigned long long* masses; // [n]
  const int8_t* take;               // [n]: whether key i takes part
  int n, nbits, by_mass;
  unsigned long long target;        // 0: ceil(share * total), at least 1
  double share;
  unsigned long long* key_of_thread;  // [Threads]: the key every thread got (first call)
  unsigned long long* fields;         // [2, 6]: thread 0's result of each of two calls
};

template <int Threads, typename Key, bool kMass>
__global__ void select_kernel(SelectArgs a) {
  pdl_begin();
  __shared__ RadixSelectSmem<kMass> sm;
  const Key* keys = static_cast<const Key*>(a.keys);
  auto for_each_key = [&](auto add) {
    for (int i = threadIdx.x; i < a.n; i += Threads)
      if (a.take[i]) add(keys[i], a.masses[i]);
  };
  auto target_of = [&](unsigned long long total) {
    const double want = a.share * static_cast<double>(total);
    unsigned long long t = static_cast<unsigned long long>(want);
    if (static_cast<double>(t) < want) ++t;
    return t < 1 ? 1ull : t;
  };
  for (int call = 0; call < 2; ++call) {
    const RadixSelected<Key> r = radix_select<Threads, kMass, Key>(
        for_each_key, a.nbits, a.by_mass != 0, a.target, sm, target_of);
    if (call == 0) a.key_of_thread[threadIdx.x] = r.key;
    if (threadIdx.x == 0) {
      unsigned long long* f = a.fields + 6 * call;
      f[0] = r.key;
      f[1] = r.above_count;
      f[2] = r.above_mass;
      f[3] = r.equal_count;
      f[4] = r.equal_mass;
      f[5] = r.target;
    }
  }
}

template <typename T>
T* ptr(long long p) {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(p));
}

void check(cudaError_t launch) {
  if (launch != cudaSuccess || cudaGetLastError() != cudaSuccess)
    throw std::runtime_error("launch failed");
}

// Calls f.template operator()<Threads>() for threads 64, 256 or 512.
template <typename F>
void with_threads(int threads, F f) {
  switch (threads) {
    case 64: return f.template operator()<64>();
    case 256: return f.template operator()<256>();
    case 512: return f.template operator()<512>();
    default: throw std::invalid_argument("threads must be 64, 256 or 512");
  }
}

}  // namespace primitives_test
}  // namespace jetspec

PYBIND11_MODULE(_primitives, m) {
  using namespace jetspec::primitives_test;
  m.def("block_reduce", [](int threads, long long in, long long out) {
    with_threads(threads, [&]<int T>() {
      check(JETSPEC_LAUNCH(reduce_kernel<T>, 1, T, 0, nullptr, ptr<const long long>(in),
                           ptr<long long>(out)));
    });
  });
  m.def("block_best", [](int threads, long long in_v, long long in_i, long long out_v,
                         long long out_i) {
    with_threads(threads, [&]<int T>() {
      check(JETSPEC_LAUNCH(best_kernel<T>, 1, T, 0, nullptr, ptr<const float>(in_v),
                           ptr<const int>(in_i), ptr<float>(out_v), ptr<int>(out_i)));
    });
  });
  m.def("block_scan", [](int threads, long long in, long long out) {
    with_threads(threads, [&]<int T>() {
      check(JETSPEC_LAUNCH(scan_kernel<T>, 1, T, 0, nullptr, ptr<const long long>(in),
                           ptr<long long>(out)));
    });
  });
  m.def("radix_select", [](int threads, int key_bytes, bool with_mass, long long keys,
                           long long masses, long long take, int n, int nbits, bool by_mass,
                           unsigned long long target, double share, long long key_of_thread,
                           long long fields) {
    const SelectArgs a{ptr<const void>(keys), ptr<const unsigned long long>(masses),
                       ptr<const int8_t>(take), n, nbits, by_mass ? 1 : 0, target, share,
                       ptr<unsigned long long>(key_of_thread), ptr<unsigned long long>(fields)};
    with_threads(threads, [&]<int T>() {
      void (*kernel)(SelectArgs) = nullptr;
      if (key_bytes == 4 && with_mass) kernel = select_kernel<T, uint32_t, true>;
      if (key_bytes == 8 && with_mass) kernel = select_kernel<T, unsigned long long, true>;
      if (key_bytes == 8 && !with_mass) kernel = select_kernel<T, unsigned long long, false>;
      if (kernel == nullptr) throw std::invalid_argument("keys: 4 bytes with masses, or 8 bytes");
      check(JETSPEC_LAUNCH(kernel, 1, T, 0, nullptr, a));
    });
  });
}
