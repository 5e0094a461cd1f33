// Torch-free sweep of the tree_attention kernels on one GPU: every Hopper variant of
// variants.h and today's kernels (baselines.cu), bf16, Qwen3-8B heads (Hq 32, Hkv 8), at the
// headline shapes of docs/perf/tree_attention.md. For each kernel and shape: the split count it picks, CTAs per
// SM (occupancy calculator), the median time of back-to-back launches over rotating K/V buffers
// (cold L2: at least 256 MB of K/V between two reads of one buffer) timed with CUDA events, the
// same launches replayed from a captured CUDA graph, TFLOP/s, GB/s, time over the floor (measured
// copy bandwidth and GEMM peak), and the error against the mma.sync kernel's output. One table on
// stdout (printed last), all rows as CSV.
//
//   attn_sweep --list                  kernels and shapes (no GPU needed)
//   attn_sweep --dry-run               the plan: bytes, FLOPs, grids, memory (no GPU needed)
//   attn_sweep [--csv F] [--best F] [--only k1,k2] [--shapes s1,s2] [--cublas libcublas.so]
//              [--peak-tflops X] [--reps N] [--target-ms T]
//   attn_sweep --profile KERNEL --shape SHAPE   one launch between cudaProfilerStart/Stop (ncu)
//
// --best writes, per shape, the fastest kernel whose output passed the check ("shape kernel").
#include <cuda_profiler_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "sweep.h"

using jetspec::AttnParams;
using jetspec::Status;
using jetspec_sweep::registry;
using jetspec_sweep::SweepKernel;

namespace {

constexpr int kHq = 32, kHkv = 8;
constexpr double kMiB = 1024.0 * 1024.0;

struct Shape {
  const char* name;
  int b, prefix, n, dh, page;  // page 0: contiguous cache
  const char* bound;
};

// The headline shapes (docs/perf/tree_attention.md): compute-bound, memory-bound, paged at one of each, Dh 64.
const Shape kShapes[] = {
    {"1x32Kx256", 1, 32768, 256, 128, 0, "compute"},
    {"4x16Kx128", 4, 16384, 128, 128, 0, "compute"},
    {"1x8Kx256", 1, 8192, 256, 128, 0, "compute"},
    {"16x4Kx16", 16, 4096, 16, 128, 0, "memory"},
    {"1x32Kx16", 1, 32768, 16, 128, 0, "memory"},
    {"4x8Kx32", 4, 8192, 32, 128, 0, "memory"},
    {"4x16Kx128_p16", 4, 16384, 128, 128, 16, "compute"},
    {"4x16Kx128_p64", 4, 16384, 128, 128, 64, "compute"},
    {"16x4Kx16_p16", 16, 4096, 16, 128, 16, "memory"},
    {"16x4Kx16_p64", 16, 4096, 16, 128, 64, "memory"},
    {"1x8Kx256_d64", 1, 8192, 256, 64, 0, "compute"},
    {"16x4Kx16_d64", 16, 4096, 16, 64, 0, "memory"},
};

struct Options {
  bool list = false, dry = false;
  std::string csv, best, only, shapes, cublas, profile, profile_shape;
  double peak_tflops = 0.0;
  int reps = 5;
  double target_ms = 2.0;
};

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "attn_sweep: %s\n", what);
  std::exit(2);
}

bool in_list(const std::string& list, const std::string& name) {
  if (list.empty()) return true;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t end = list.find(',', start);
    if (list.substr(start, end == std::string::npos ? std::string::npos : end - start) == name)
      return true;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return false;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) die(("missing value after " + a).c_str());
      return argv[++i];
    };
    if (a == "--list") o.list = true;
    else if (a == "--dry-run") o.dry = true;
    else if (a == "--csv") o.csv = value();
    else if (a == "--best") o.best = value();
    else if (a == "--only") o.only = value();
    else if (a == "--shapes") o.shapes = value();
    else if (a == "--cublas") o.cublas = value();
    else if (a == "--peak-tflops") o.peak_tflops = std::atof(value().c_str());
    else if (a == "--reps") o.reps = std::max(1, std::atoi(value().c_str()));
    else if (a == "--target-ms") o.target_ms = std::atof(value().c_str());
    else if (a == "--profile") o.profile = value();
    else if (a == "--shape") o.profile_shape = value();
    else die(("unknown option " + a + " (see the comment at the top of sweep.cu)").c_str());
  }
  return o;
}

// The shapes to run, in the order --shapes names them (a time-limited run measures the first
// ones first), else every shape in kShapes' order.
std::vector<const Shape*> selected_shapes(const Options& o) {
  std::vector<const Shape*> out;
  if (o.shapes.empty()) {
    for (const auto& s : kShapes) out.push_back(&s);
    return out;
  }
  size_t start = 0;
  while (start <= o.shapes.size()) {
    size_t end = o.shapes.find(',', start);
    if (end == std::string::npos) end = o.shapes.size();
    const std::string name = o.shapes.substr(start, end - start);
    const Shape* found = nullptr;
    for (const auto& s : kShapes)
      if (name == s.name) found = &s;
    if (found == nullptr) die(("unknown shape " + name + " (--list shows them)").c_str());
    out.push_back(found);
    start = end + 1;
  }
  return out;
}

// ---- per-shape arithmetic (docs/perf/README.md, "Floor formulas") ----------------------------------
int words(const Shape& s) { return (s.n + 31) / 32; }
double shape_bytes(const Shape& s) {
  return 2.0 * s.b * (s.prefix + s.n) * kHkv * s.dh * 2 + 2.0 * s.b * s.n * kHq * s.dh * 2 +
         4.0 * s.b * s.n * words(s);
}
double shape_flops(const Shape& s) { return 4.0 * s.b * s.n * double(s.prefix + s.n) * kHq * s.dh; }
int capacity(const Shape& s) {
  const int keys = s.prefix + s.n;
  return s.page ? (keys + s.page - 1) / s.page * s.page : keys;
}
double kv_set_bytes(const Shape& s) { return 2.0 * s.b * capacity(s) * kHkv * s.dh * 2; }
// K/V sets rotated between launches: at least 256 MB (five H100/H200 L2s) and two sets.
int kv_sets(const Shape& s) {
  return std::max(2, static_cast<int>(std::ceil(256.0 * kMiB / kv_set_bytes(s))));
}
bool runs_on(const SweepKernel& k, const Shape& s) { return k.head_dim == s.dh; }

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "attn_sweep: %s: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}

// ---- device buffers --------------------------------------------------------------------------
__global__ void fill_bf16(__nv_bfloat16* x, size_t count, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed ^ static_cast<uint32_t>(i >> 32);
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float u = (h & 0xFFFFFF) / float(0x1000000) * 2.f - 1.f;  // [-1, 1)
    x[i] = __float2bfloat16_rn(u * scale);
  }
}

template <typename T>
T* device_alloc(size_t count) {
  void* p = nullptr;
  check(cudaMalloc(&p, count * sizeof(T) + 16), "cudaMalloc");
  return static_cast<T*>(p);
}

struct ShapeData {
  const Shape* s = nullptr;
  __nv_bfloat16* q = nullptr;
  std::vector<__nv_bfloat16*> k, v;
  int32_t *prefix = nullptr, *mask = nullptr, *table = nullptr;
  int pages_per_seq = 0, pool = 0;
  __nv_bfloat16 *out = nullptr, *ref = nullptr;
  float *lse = nullptr, *part_o = nullptr, *part_lse = nullptr;
  int max_splits = 1;
  std::vector<uint16_t> ref_host;

  void fill(__nv_bfloat16* x, size_t count, uint32_t seed, float scale) {
    fill_bf16<<<1024, 256>>>(x, count, seed, scale);
    check(cudaGetLastError(), "fill");
  }

  void build(const Shape& shape, int splits) {
    s = &shape;
    max_splits = splits;
    const size_t qn = size_t(s->b) * s->n * kHq * s->dh;
    q = device_alloc<__nv_bfloat16>(qn);
    out = device_alloc<__nv_bfloat16>(qn);
    ref = device_alloc<__nv_bfloat16>(qn);
    fill(q, qn, 11, 2.f);
    const int cap = capacity(*s);
    size_t kvn;
    if (s->page) {
      pages_per_seq = cap / s->page;
      pool = s->b * pages_per_seq;
      kvn = size_t(pool) * s->page * kHkv * s->dh;
      std::vector<int32_t> perm(pool);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
      table = device_alloc<int32_t>(perm.size());
      check(cudaMemcpy(table, perm.data(), perm.size() * 4, cudaMemcpyHostToDevice), "table");
    } else {
      kvn = size_t(s->b) * cap * kHkv * s->dh;
    }
    for (int i = 0; i < kv_sets(*s); ++i) {
      k.push_back(device_alloc<__nv_bfloat16>(kvn));
      v.push_back(device_alloc<__nv_bfloat16>(kvn));
      fill(k.back(), kvn, 101 + i, 2.f);
      fill(v.back(), kvn, 202 + i, 1.f);
    }
    std::vector<int32_t> pre(s->b, s->prefix);
    prefix = device_alloc<int32_t>(s->b);
    check(cudaMemcpy(prefix, pre.data(), pre.size() * 4, cudaMemcpyHostToDevice), "prefix");
    // A random tree per sequence (parents close to their children: deep, narrow, like a draft
    // tree); row i's bits are its ancestors and itself.
    const int w = words(*s);
    std::vector<int32_t> m(size_t(s->b) * s->n * w, 0);
    std::mt19937 gen(3);
    for (int b = 0; b < s->b; ++b) {
      std::vector<int> parent(s->n, -1);
      for (int i = 0; i < s->n; ++i) {
        int32_t* row = &m[(size_t(b) * s->n + i) * w];
        if (i > 0) {
          parent[i] = std::max(0, i - 1 - static_cast<int>(gen() % 8));
          std::memcpy(row, &m[(size_t(b) * s->n + parent[i]) * w], size_t(w) * 4);
        }
        row[i / 32] |= static_cast<int32_t>(1u << (i % 32));
      }
    }
    mask = device_alloc<int32_t>(m.size());
    check(cudaMemcpy(mask, m.data(), m.size() * 4, cudaMemcpyHostToDevice), "mask");
    lse = device_alloc<float>(size_t(s->b) * kHq * s->n);
    if (max_splits > 1) {
      part_o = device_alloc<float>(size_t(max_splits) * s->b * kHq * s->n * s->dh);
      part_lse = device_alloc<float>(size_t(max_splits) * s->b * kHq * s->n);
    }
  }

  AttnParams params(int set, int splits, __nv_bfloat16* dst) const {
    AttnParams p{};
    const int cap = capacity(*s);
    p.q = q;
    p.q_strides = {int64_t(s->n) * kHq * s->dh, int64_t(kHq) * s->dh, s->dh};
    p.k_cache = k[set];
    p.v_cache = v[set];
    const int rows = s->page ? s->page : cap;
    p.k_cache_strides = p.v_cache_strides = {int64_t(rows) * kHkv * s->dh, int64_t(kHkv) * s->dh, s->dh};
    p.block_table = table;
    p.block_table_batch_stride = pages_per_seq;
    p.page_size = rows;
    p.cache_outer = s->page ? pool : s->b;
    p.prefix_lens = prefix;
    p.tree_mask = mask;
    p.tree_mask_batch_stride = int64_t(s->n) * words(*s);
    p.tree_mask_row_stride = words(*s);
    p.tail = jetspec::kTailMask;
    p.out = dst;
    p.out_strides = p.q_strides;
    p.lse = lse;
    p.partial_o = part_o;
    p.partial_lse = part_lse;
    p.batch = s->b;
    p.n = s->n;
    p.hq = kHq;
    p.hkv = kHkv;
    p.group = kHq / kHkv;
    p.splits = splits;
    p.scale = 1.0f / std::sqrt(float(s->dh));
    p.scale_log2 = 1.4426950408889634f * p.scale;  // what launch_tree_attention derives
    p.dtype = jetspec::kBFloat16;
    p.head_dim = s->dh;
    p.kernel = 0;
    return p;
  }

  void release() {
    for (void* x : {static_cast<void*>(q), static_cast<void*>(out), static_cast<void*>(ref),
                    static_cast<void*>(prefix), static_cast<void*>(mask),
                    static_cast<void*>(table), static_cast<void*>(lse),
                    static_cast<void*>(part_o), static_cast<void*>(part_lse)})
      if (x != nullptr) cudaFree(x);
    for (auto* x : k) cudaFree(x);
    for (auto* x : v) cudaFree(x);
    k.clear();
    v.clear();
  }
};

float bf16_to_float(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// max |out - ref| / max |ref| and ||out - ref|| / ||ref|| over the whole output.
void compare(const std::vector<uint16_t>& out, const std::vector<uint16_t>& ref, double* max_rel,
             double* rel_l2) {
  double num = 0, den = 0, mx = 0, mref = 0;
  bool nan = false;
  for (size_t i = 0; i < out.size(); ++i) {
    const double a = bf16_to_float(out[i]), b = bf16_to_float(ref[i]);
    nan = nan || std::isnan(a);
    num += (a - b) * (a - b);
    den += b * b;
    mx = std::max(mx, std::fabs(a - b));
    mref = std::max(mref, std::fabs(b));
  }
  *max_rel = nan ? NAN : mx / std::max(mref, 1e-30);
  *rel_l2 = nan ? NAN : std::sqrt(num / std::max(den, 1e-30));
}

// ---- ceilings ---------------------------------------------------------------------------------
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double copy_bandwidth() {  // bytes read + written per second, 1 GiB device-to-device copies
  const size_t bytes = size_t(1) << 30;
  void *a = nullptr, *b = nullptr;
  check(cudaMalloc(&a, bytes), "cudaMalloc (copy)");
  check(cudaMalloc(&b, bytes), "cudaMalloc (copy)");
  check(cudaMemset(a, 1, bytes), "memset");
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<double> t;
  for (int r = 0; r < 6; ++r) {
    cudaEventRecord(e0);
    check(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice), "copy");
    cudaEventRecord(e1);
    check(cudaEventSynchronize(e1), "copy sync");
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (r > 0) t.push_back(ms * 1e-3);
  }
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes / median(t);
}

// Dense bf16 GEMM peak (8192^3, fp32 accumulation) through cuBLAS found at run time (dlopen, so
// the binary needs no cuBLAS to build or start); 0 when none loads.
double gemm_peak(const std::string& path) {
  std::vector<std::string> names;
  if (!path.empty()) names.push_back(path);
  for (const char* n : {"libcublas.so", "libcublas.so.13", "libcublas.so.12"}) names.push_back(n);
  void* lib = nullptr;
  for (const auto& n : names)
    if ((lib = dlopen(n.c_str(), RTLD_NOW | RTLD_GLOBAL)) != nullptr) break;
  if (lib == nullptr) return 0.0;
  using Create = int (*)(void**);
  using Destroy = int (*)(void*);
  using GemmEx = int (*)(void*, int, int, int, int, int, const void*, const void*, int, int,
                         const void*, int, int, const void*, void*, int, int, int, int);
  auto create = reinterpret_cast<Create>(dlsym(lib, "cublasCreate_v2"));
  auto destroy = reinterpret_cast<Destroy>(dlsym(lib, "cublasDestroy_v2"));
  auto gemm = reinterpret_cast<GemmEx>(dlsym(lib, "cublasGemmEx"));
  if (!create || !destroy || !gemm) return 0.0;
  void* h = nullptr;
  if (create(&h) != 0) return 0.0;
  const int n = 8192;
  auto* a = device_alloc<__nv_bfloat16>(size_t(n) * n);
  auto* b = device_alloc<__nv_bfloat16>(size_t(n) * n);
  auto* c = device_alloc<__nv_bfloat16>(size_t(n) * n);
  fill_bf16<<<1024, 256>>>(a, size_t(n) * n, 5, 1.f);
  fill_bf16<<<1024, 256>>>(b, size_t(n) * n, 6, 1.f);
  const float alpha = 1.f, beta = 0.f;
  constexpr int kBf16 = 14, kCompute32F = 68, kDefaultAlgo = -1;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<double> t;
  for (int r = 0; r < 6; ++r) {
    cudaEventRecord(e0);
    const int st = gemm(h, 0, 0, n, n, n, &alpha, a, kBf16, n, b, kBf16, n, &beta, c, kBf16, n,
                        kCompute32F, kDefaultAlgo);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    if (st != 0) break;
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (r > 0) t.push_back(ms * 1e-3);
  }
  destroy(h);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return t.empty() ? 0.0 : 2.0 * double(n) * n * n / median(t);
}

// ---- one kernel at one shape --------------------------------------------------------------------
struct Row {
  std::string kernel, shape, status, note;
  int splits = 0, ctas = 0;
  double eager_us = NAN, graph_us = NAN, max_rel = NAN, rel_l2 = NAN;
};

std::string status_text(const Status& st) {
  return std::string(cudaGetErrorName(st.err)) + (st.msg.empty() ? "" : ": " + st.msg);
}

// Median time (µs) of `iters` launches rotating over the K/V sets: back to back (eager) or
// replayed from one captured graph.
bool time_kernel(const SweepKernel& k, const ShapeData& d, int splits, const Options& o,
                 cudaStream_t stream, Row& row) {
  const int sets = static_cast<int>(d.k.size());
  auto launch = [&](int i) { return k.launch(d.params(i % sets, splits, d.out), stream); };
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  // Warm up, then size the batch to about target_ms.
  for (int i = 0; i < 2; ++i) {
    const Status st = launch(i);
    if (!st.ok()) {
      row.status = "error";
      row.note = status_text(st);
      return false;
    }
  }
  cudaEventRecord(e0, stream);
  (void)launch(0);
  cudaEventRecord(e1, stream);
  if (cudaEventSynchronize(e1) != cudaSuccess) {
    row.status = "error";
    row.note = cudaGetErrorString(cudaGetLastError());
    return false;
  }
  float one = 0;
  cudaEventElapsedTime(&one, e0, e1);
  const int iters = std::clamp(static_cast<int>(o.target_ms / std::max(one, 1e-3f)), sets, 400);
  // The median over o.reps batches of `batch()` (iters launches), in µs a launch.
  auto timed = [&](auto batch) {
    std::vector<double> t;
    for (int r = 0; r < o.reps; ++r) {
      cudaEventRecord(e0, stream);
      batch();
      cudaEventRecord(e1, stream);
      cudaEventSynchronize(e1);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      t.push_back(ms * 1e3 / iters);
    }
    return median(t);
  };
  row.eager_us = timed([&] {
    for (int i = 0; i < iters; ++i) (void)launch(i);  // errors: the sync below
  });
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
    for (int i = 0; i < iters; ++i) (void)launch(i);  // errors: the sync below
    if (cudaStreamEndCapture(stream, &graph) == cudaSuccess &&
        cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess) {
      cudaGraphLaunch(exec, stream);  // warm-up
      row.graph_us = timed([&] { cudaGraphLaunch(exec, stream); });
    }
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
  cudaGetLastError();  // a capture that failed leaves its error; the eager time stands
  const cudaError_t sticky = cudaDeviceSynchronize();
  if (sticky != cudaSuccess) {
    row.status = "error";
    row.note = cudaGetErrorString(sticky);
    return false;
  }
  return true;
}

void print_plan(const Options& o) {
  std::printf("%-16s %4s %5s %4s %6s %6s %8s %9s %7s %s\n", "kernel", "Dh", "rows", "BN",
              "stages", "thr", "smem_KB", "CTAs/SM*", "pingpong", "what");
  for (const auto& k : registry()) {
    if (!in_list(o.only, k.name)) continue;
    std::printf("%-16s %4d %5d %4d %6d %6d %8.1f %9d %7s %s\n", k.name.c_str(), k.head_dim,
                k.rows, k.block_n, k.stages, k.threads, k.smem / 1024.0, k.ctas_declared,
                k.pingpong ? "yes" : "no", k.what.c_str());
  }
  std::printf("(* the CTAs per SM the launch bounds ask for; 0: none; the GPU run reports the "
              "occupancy calculator's)\n\n");
  std::printf("%-15s %3s %6s %4s %4s %5s %8s %9s %8s %5s\n", "shape", "B", "prefix", "N", "Dh",
              "page", "GFLOP", "MB", "bound", "sets");
  for (const Shape* shape : selected_shapes(o)) {
    const Shape& s = *shape;
    std::printf("%-15s %3d %6d %4d %4d %5d %8.2f %9.1f %8s %5d\n", s.name, s.b, s.prefix, s.n,
                s.dh, s.page, shape_flops(s) / 1e9, shape_bytes(s) / 1e6, s.bound, kv_sets(s));
  }
}

void dry_run(const Options& o) {
  print_plan(o);
  std::printf("\nplan (no GPU touched): kernel x shape, grid = tiles x (B * Hkv) x splits\n");
  std::printf("%-16s %-15s %6s %10s %12s\n", "kernel", "shape", "tiles", "base_CTAs", "K/V_MB");
  size_t combos = 0;
  for (const Shape* shape : selected_shapes(o)) {
    const Shape& s = *shape;
    for (const auto& k : registry()) {
      if (!in_list(o.only, k.name) || !runs_on(k, s)) continue;
      const long long tiles = (static_cast<long long>(s.n) * (kHq / kHkv) + k.rows - 1) / k.rows;
      std::printf("%-16s %-15s %6lld %10lld %12.1f\n", k.name.c_str(), s.name, tiles,
                  tiles * s.b * kHkv, kv_sets(s) * kv_set_bytes(s) / 1e6);
      ++combos;
    }
  }
  std::printf("%zu runs planned\n", combos);
}

const SweepKernel* find_kernel(const std::string& name) {
  for (const auto& k : registry())
    if (k.name == name) return &k;
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (o.list) {
    print_plan(o);
    return 0;
  }
  if (o.dry) {
    dry_run(o);
    return 0;
  }
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "device properties");
  if (prop.major != 9) die("the sweep's kernels are sm_90a code: it needs an H100 / H200");

  if (!o.profile.empty()) {  // ncu: one launch of one kernel at one shape
    const SweepKernel* k = find_kernel(o.profile);
    const Shape* s = nullptr;
    for (const auto& x : kShapes)
      if (o.profile_shape == x.name) s = &x;
    if (k == nullptr || s == nullptr || !runs_on(*k, *s)) die("--profile KERNEL --shape SHAPE");
    int splits = 1;
    if (!k->splits(s->b, s->n, kHq / kHkv, kHkv, capacity(*s), &splits).ok()) die("splits");
    ShapeData d;
    d.build(*s, splits);
    for (int i = 0; i < 2; ++i) (void)k->launch(d.params(0, splits, d.out), stream);
    check(cudaStreamSynchronize(stream), "warm-up");
    cudaProfilerStart();
    const Status st = k->launch(d.params(1 % d.k.size(), splits, d.out), stream);
    check(cudaStreamSynchronize(stream), "profiled launch");
    cudaProfilerStop();
    std::printf("profiled %s at %s: splits %d, %s\n", k->name.c_str(), s->name, splits,
                st.ok() ? "ok" : status_text(st).c_str());
    return st.ok() ? 0 : 1;
  }

  const double bw = copy_bandwidth();
  double peak = gemm_peak(o.cublas);
  const char* peak_from = "cuBLAS 8192^3 bf16";
  if (peak <= 0.0) {
    peak = (o.peak_tflops > 0 ? o.peak_tflops : 790.0) * 1e12;
    peak_from = o.peak_tflops > 0 ? "--peak-tflops" : "assumed 790 TFLOP/s (no cuBLAS loaded)";
  }
  std::printf("device: %s, %d SMs, L2 %.0f MB; copy %.0f GB/s; bf16 GEMM %.0f TFLOP/s (%s)\n",
              prop.name, prop.multiProcessorCount, prop.l2CacheSize / 1e6, bw / 1e9, peak / 1e12,
              peak_from);

  // A row's best time (eager or graph), TFLOP/s, GB/s and time over the floor.
  struct Metrics {
    double us, tflops, gbps, x_floor;
  };
  auto metrics = [&](const Row& r) {
    const Shape* s = nullptr;
    for (const auto& x : kShapes)
      if (r.shape == x.name) s = &x;
    const double t = std::isnan(r.graph_us) ? r.eager_us : std::min(r.eager_us, r.graph_us);
    const double floor_us = std::max(shape_flops(*s) / peak, shape_bytes(*s) / bw) * 1e6;
    return Metrics{t, shape_flops(*s) / t / 1e6, shape_bytes(*s) / t / 1e3, t / floor_us};
  };
  // The CSV (every field) gets each row as it is measured, flushed, so a run stopped by a time
  // limit (bench/attn_sweep.sh) keeps the rows it finished.
  FILE* csv = nullptr;
  if (!o.csv.empty()) {
    csv = std::fopen(o.csv.c_str(), "w");
    if (csv == nullptr) die(("cannot write " + o.csv).c_str());
    std::fprintf(csv, "kernel,shape,status,splits,ctas_per_sm,eager_us,graph_us,tflops,gbps,"
                      "x_floor,max_rel,rel_l2,copy_gbps,peak_tflops,note\n");
    std::fflush(csv);
  }
  std::vector<Row> rows;
  auto record = [&](const Row& r) {
    rows.push_back(r);
    if (csv == nullptr) return;
    const Metrics m = metrics(r);
    std::fprintf(csv, "%s,%s,%s,%d,%d,%.2f,%.2f,%.1f,%.0f,%.3f,%.3g,%.3g,%.0f,%.0f,\"%s\"\n",
                 r.kernel.c_str(), r.shape.c_str(), r.status.c_str(), r.splits, r.ctas, r.eager_us,
                 r.graph_us, m.tflops, m.gbps, m.x_floor, r.max_rel, r.rel_l2, bw / 1e9,
                 peak / 1e12, r.note.c_str());
    std::fflush(csv);
  };
  for (const Shape* shape : selected_shapes(o)) {
    const Shape& s = *shape;
    // Split counts first (they size the partial buffers), then the reference output.
    std::vector<std::pair<const SweepKernel*, int>> plan;
    int max_splits = 1;
    for (const auto& k : registry()) {
      if (!runs_on(k, s) || !(in_list(o.only, k.name) || k.name.rfind("mma", 0) == 0)) continue;
      int splits = 1;
      const Status st = k.splits(s.b, s.n, kHq / kHkv, kHkv, capacity(s), &splits);
      if (!st.ok()) splits = -1;
      plan.push_back({&k, splits});
      max_splits = std::max(max_splits, splits);
    }
    ShapeData d;
    d.build(s, max_splits);
    const SweepKernel* ref = find_kernel(s.dh == 64 ? "mma_d64" : "mma");
    const size_t out_n = size_t(s.b) * s.n * kHq * s.dh;
    d.ref_host.resize(out_n);
    const Status rst = ref->launch(d.params(0, 1, d.ref), stream);
    check(rst.ok() ? cudaStreamSynchronize(stream) : rst.err, "reference (mma.sync, 1 split)");
    check(cudaMemcpy(d.ref_host.data(), d.ref, out_n * 2, cudaMemcpyDeviceToHost), "ref copy");
    for (const auto& [k, splits] : plan) {
      if (!in_list(o.only, k->name)) continue;
      Row row;
      row.kernel = k->name;
      row.shape = s.name;
      row.splits = splits;
      if (!k->resident(&row.ctas).ok()) row.ctas = -1;
      if (splits < 1) {
        row.status = "error";
        row.note = "split planning failed";
        record(row);
        continue;
      }
      // Correctness first: set 0, poisoned output, compared with the reference.
      check(cudaMemset(d.out, 0xFF, out_n * 2), "poison");
      const Status st = k->launch(d.params(0, splits, d.out), stream);
      const cudaError_t sync = st.ok() ? cudaStreamSynchronize(stream) : st.err;
      if (!st.ok() || sync != cudaSuccess) {
        row.status = "error";
        row.note = st.ok() ? cudaGetErrorString(sync) : status_text(st);
        record(row);
        std::fprintf(stderr, "attn_sweep: %s at %s: %s\n", k->name.c_str(), s.name,
                     row.note.c_str());
        if (sync != cudaSuccess && cudaDeviceSynchronize() != cudaSuccess) {
          std::fprintf(stderr, "attn_sweep: the CUDA context is broken; stopping\n");
          goto report;
        }
        continue;
      }
      {
        std::vector<uint16_t> got(out_n);
        check(cudaMemcpy(got.data(), d.out, out_n * 2, cudaMemcpyDeviceToHost), "out copy");
        compare(got, d.ref_host, &row.max_rel, &row.rel_l2);
      }
      if (k->ablate) {
        row.status = "ablation";
      } else {
        row.status = row.rel_l2 < 1e-2 ? "pass" : "FAIL";
      }
      if (!time_kernel(*k, d, splits, o, stream, row)) {
        record(row);
        if (cudaDeviceSynchronize() != cudaSuccess) goto report;
        continue;
      }
      record(row);
    }
    d.release();
  }
report:
  if (csv != nullptr) std::fclose(csv);
  // The table (printed last: the reply carries the end of the output).
  if (!o.best.empty()) {
    FILE* f = std::fopen(o.best.c_str(), "w");
    if (f == nullptr) die(("cannot write " + o.best).c_str());
    for (const auto& s : kShapes) {
      const Row* best = nullptr;
      for (const auto& r : rows)
        if (r.shape == s.name && r.status == "pass" && (!best || r.eager_us < best->eager_us))
          best = &r;
      if (best) std::fprintf(f, "%s %s\n", s.name, best->kernel.c_str());
    }
    std::fclose(f);
  }
  std::printf("\n%-15s %-16s %8s %3s %3s %9s %9s %7s %7s %6s %9s\n", "shape", "kernel", "status",
              "spl", "cta", "eager_us", "graph_us", "TFLOP/s", "GB/s", "xfloor", "rel_l2");
  for (const auto& r : rows) {
    const Metrics m = metrics(r);
    std::printf("%-15s %-16s %8s %3d %3d %9.1f %9.1f %7.0f %7.0f %6.2f %9.2g %s\n",
                r.shape.c_str(), r.kernel.c_str(), r.status.c_str(), r.splits, r.ctas, r.eager_us,
                r.graph_us, m.tflops, m.gbps, m.x_floor, r.rel_l2, r.note.substr(0, 60).c_str());
  }
  bool failed = false;
  for (const auto& r : rows) failed = failed || r.status == "FAIL" || r.status == "error";
  return failed ? 1 : 0;
}
