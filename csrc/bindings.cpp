// pybind11 module jetspec_kernels._C: torch-free. Takes raw device pointers (data_ptr() integers),
// sizes and a stream handle, so it does not depend on the installed torch's C++ ABI.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "jetspec/api.h"
#include "jetspec/arch_list.h"

namespace py = pybind11;

namespace {

std::string op_prefix(const char* op) { return std::string("jetspec_kernels._C.") + op + ": "; }

// A launcher's failure as a Python exception naming the op: refused input is a ValueError (the
// launcher's message names the argument, its value and the limit), a request this device or
// build cannot run a RuntimeError saying why, a failed CUDA call a RuntimeError with the error.
void check(const jetspec::Status& st, const char* op) {
  if (st.ok()) return;
  if (st.kind == jetspec::Status::kBadInput) throw std::invalid_argument(op_prefix(op) + st.msg);
  if (st.kind == jetspec::Status::kUnsupported) throw std::runtime_error(op_prefix(op) + st.msg);
  throw std::runtime_error(jetspec::cat(op_prefix(op), st.msg, st.msg.empty() ? "" : ": ",
                                       "CUDA error ", static_cast<int>(st.err), " (",
                                       cudaGetErrorName(st.err), "): ", cudaGetErrorString(st.err)));
}

template <typename T>
T* ptr(std::uintptr_t p) { return reinterpret_cast<T*>(p); }

cudaStream_t stream_of(std::uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

using U = std::uintptr_t;
using I64s = std::vector<int64_t>;

// Strides of dims 0..2 of a 4-d tensor (dim 3 is contiguous): argument `name` of op `op`.
jetspec::Strides4 strides4(const I64s& s, const char* name, const char* op) {
  if (s.size() < 3) {
    throw std::invalid_argument(op_prefix(op) + name + " needs 3 strides, got " +
                                std::to_string(s.size()));
  }
  return jetspec::Strides4{s[0], s[1], s[2]};
}

int device_count() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
    cudaGetLastError();
    return 0;
  }
  check(err, "device_count");
  return n;
}

// The CUDA version the driver supports / this module's (static) runtime is, as 1000 * major +
// 10 * minor; 0 when there is no driver.
int driver_version() {
  int v = 0;
  if (cudaDriverGetVersion(&v) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return v;
}

int runtime_version() {
  int v = 0;
  check(cudaRuntimeGetVersion(&v), "runtime_version");
  return v;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "jetspec_kernels CUDA kernels (torch-free: raw pointers, sizes, strides, stream)";
  m.def("built_archs", [] { return std::string(JETSPEC_CUDA_ARCHS); },
        "CUDA architectures this module was compiled for, comma-separated (e.g. '90a,80').");
  m.def(
      "supports_arch",
      [](int sm, const std::string& archs) { return jetspec::arch_list_supports(archs, sm); },
      py::arg("sm"), py::arg("archs") = std::string(JETSPEC_CUDA_ARCHS),
      "Whether code built for `archs` (default: this module's) runs on compute capability sm "
      "(e.g. 90).");
  m.def("wgmma_built", &jetspec::arch_list_sm90_is_90a,
        py::arg("archs") = std::string(JETSPEC_CUDA_ARCHS),
        "Whether code built for `archs` (default: this module's) holds the sm_90a wgmma kernels "
        "wherever it runs on sm_90: '90a' is its only sm_90 entry.");
  m.def("driver_version", &driver_version,
        "CUDA version the installed driver supports (1000 * major + 10 * minor); 0 without one.");
  m.def("runtime_version", &runtime_version,
        "CUDA runtime version this module links (1000 * major + 10 * minor).");
  m.def("device_count", &device_count,
        "Number of visible CUDA devices; 0 (not an error) when there is no device or driver.");
  m.def(
      "pack_mask",
      [](std::uintptr_t parents, std::uintptr_t num_nodes, std::uintptr_t mask, int batch, int n,
         int words, std::uintptr_t stream) {
        check(jetspec::launch_pack_mask(ptr<const int32_t>(parents), ptr<const int32_t>(num_nodes),
                                        ptr<int32_t>(mask), batch, n, words, stream_of(stream)),
              "pack_mask");
      },
      py::arg("parents"), py::arg("num_nodes"), py::arg("mask"), py::arg("batch"), py::arg("n"),
      py::arg("words"), py::arg("stream"),
      "int32 parents [B,N], num_nodes [B] -> int32 mask [B,N,W] (device pointers).");

  m.def(
      "qk_norm_rope_append",
      [](U q, U k, U v, U q_norm_w, U k_norm_w, U positions, U cache_start, U q_out, U k_cache,
         U v_cache, U block_table, const I64s& sq, const I64s& sk, const I64s& sv, const I64s& sc,
         const I64s& svc, int64_t bt_stride, int batch, int n, int hq, int hkv, int dh,
         int page_size, double theta, float eps, int dtype, int cache_dtype, U stream) {
        if ((q == 0) != (q_out == 0))
          throw std::invalid_argument(op_prefix("qk_norm_rope_append") +
                                      "q and q_out must both be set or both be 0");
        jetspec::RopeParams p{};
        p.q = ptr<const void>(q);
        p.k = ptr<const void>(k);
        p.v = ptr<const void>(v);
        p.q_norm_w = ptr<const float>(q_norm_w);
        p.k_norm_w = ptr<const float>(k_norm_w);
        p.positions = ptr<const int32_t>(positions);
        p.cache_start = ptr<const int32_t>(cache_start);
        p.q_out = ptr<void>(q_out);
        p.k_cache = ptr<void>(k_cache);
        p.v_cache = ptr<void>(v_cache);
        p.block_table = ptr<const int32_t>(block_table);
        p.sq = strides4(sq, "sq", "qk_norm_rope_append");
        p.sk = strides4(sk, "sk", "qk_norm_rope_append");
        p.sv = strides4(sv, "sv", "qk_norm_rope_append");
        p.sc = strides4(sc, "sc", "qk_norm_rope_append");
        p.svc = strides4(svc, "svc", "qk_norm_rope_append");
        p.bt_stride = bt_stride;
        p.batch = batch;
        p.n = n;
        p.hq = hq;
        p.hkv = hkv;
        p.dh = dh;
        p.page_size = page_size;
        p.theta = theta;
        p.eps = eps;
        check(jetspec::launch_qk_norm_rope_append(p, dtype, cache_dtype, stream_of(stream)),
              "qk_norm_rope_append");
      },
      "Per-head RMSNorm + RoPE of q, k; k (normed, rotated) and v written into the cache. "
      "q = 0 (with q_out = 0, q_norm_w = 0) appends K/V only.");
  m.def(
      "verify_sample_filter",
      [](U logits, int64_t s0, int64_t s1, U num_nodes, U temperature, U top_k, U top_p, U thr_x,
         U thr_id, int batch, int n, int vocab, bool vec, int dtype, U stream) {
        jetspec::SampleFilterParams p{};
        p.logits = ptr<const void>(logits);
        p.s0 = s0;
        p.s1 = s1;
        p.num_nodes = ptr<const int32_t>(num_nodes);
        p.temperature = ptr<const float>(temperature);
        p.top_k = ptr<const int32_t>(top_k);
        p.top_p = ptr<const float>(top_p);
        p.thr_x = ptr<float>(thr_x);
        p.thr_id = ptr<int32_t>(thr_id);
        p.batch = batch;
        p.n = n;
        p.vocab = vocab;
        p.vec = vec ? 1 : 0;
        check(jetspec::launch_sample_filter(p, dtype, stream_of(stream)), "verify_sample_filter");
      },
      "Per node: the last token top-k (top_k [B] or 0) then top-p (top_p [B] or 0) keep, as "
      "thresholds thr_x / thr_id [B * N] (temperature [B]; <= 0 keeps every token).");
  m.def(
      "verify_target_tokens",
      [](U logits, int64_t s0, int64_t s1, U num_nodes, U seed, U offset, U part_v, U part_i,
         int batch, int n, int vocab, int splits, int split_len, bool vec, U temperature,
         U thr_x, U thr_id, int dtype, U stream) {
        jetspec::TargetTokenParams p{};
        p.logits = ptr<const void>(logits);
        p.s0 = s0;
        p.s1 = s1;
        p.num_nodes = ptr<const int32_t>(num_nodes);
        p.seed = ptr<const int64_t>(seed);
        p.offset = ptr<const int64_t>(offset);
        p.part_v = ptr<float>(part_v);
        p.part_i = ptr<int32_t>(part_i);
        p.batch = batch;
        p.n = n;
        p.vocab = vocab;
        p.splits = splits;
        p.split_len = split_len;
        p.vec = vec ? 1 : 0;
        p.temperature = ptr<const float>(temperature);
        p.thr_x = ptr<const float>(thr_x);
        p.thr_id = ptr<const int32_t>(thr_id);
        check(jetspec::launch_target_tokens(p, dtype, stream_of(stream)), "verify_target_tokens");
      },
      "Per (valid node, vocab split): the best logit (temperature 0 or null) or seeded Gumbel-max "
      "value over the tokens kept by thr_x / thr_id (when given) and its token, into part_v / "
      "part_i [B * N, splits].");
  m.def(
      "verify_walk",
      [](U tokens, U parents, U num_nodes, U target, int64_t target_stride, U part_v, U part_i,
         int splits, U accept_len, U path, U bonus, U emitted, int batch, int n, int cols,
         U stream) {
        jetspec::VerifyWalkParams p{};
        p.tokens = ptr<const int32_t>(tokens);
        p.parents = ptr<const int32_t>(parents);
        p.num_nodes = ptr<const int32_t>(num_nodes);
        p.target = ptr<const int32_t>(target);
        p.target_stride = target_stride;
        p.part_v = ptr<const float>(part_v);
        p.part_i = ptr<const int32_t>(part_i);
        p.splits = splits;
        p.accept_len = ptr<int32_t>(accept_len);
        p.path = ptr<int32_t>(path);
        p.bonus = ptr<int32_t>(bonus);
        p.emitted = ptr<int32_t>(emitted);
        p.batch = batch;
        p.n = n;
        p.cols = cols;
        check(jetspec::launch_verify_walk(p, stream_of(stream)), "verify_walk");
      },
      "Acceptance walk: accept_len, path, bonus, emitted.");
  m.def(
      "commit_kv",
      [](U k_cache, U v_cache, const I64s& sk, const I64s& sv, U block_table, int64_t bt_stride,
         U prefix_lens, U path, U accept_len, U new_prefix_lens, U hidden, int64_t sh0,
         int64_t sh1, U hidden_rows, int batch, int cols, int hkv, int dh, int page_size,
         int hidden_dim, int cache_elem_bytes, int hidden_elem_bytes, U stream) {
        jetspec::CommitParams p{};
        p.k_cache = ptr<void>(k_cache);
        p.v_cache = ptr<void>(v_cache);
        p.sk = strides4(sk, "sk", "commit_kv");
        p.sv = strides4(sv, "sv", "commit_kv");
        p.block_table = ptr<const int32_t>(block_table);
        p.bt_stride = bt_stride;
        p.prefix_lens = ptr<const int32_t>(prefix_lens);
        p.path = ptr<const int32_t>(path);
        p.accept_len = ptr<const int32_t>(accept_len);
        p.new_prefix_lens = ptr<int32_t>(new_prefix_lens);
        p.hidden = ptr<const void>(hidden);
        p.sh0 = sh0;
        p.sh1 = sh1;
        p.hidden_rows = ptr<void>(hidden_rows);
        p.batch = batch;
        p.cols = cols;
        p.hkv = hkv;
        p.dh = dh;
        p.page_size = page_size;
        p.hidden_dim = hidden_dim;
        check(jetspec::launch_commit_kv(p, cache_elem_bytes, hidden_elem_bytes, stream_of(stream)),
              "commit_kv");
      },
      "Move the accepted path's K/V to contiguous slots in place; gather hidden rows.");
  m.def("topk_workspace_bytes", &jetspec::topk_workspace_bytes, py::arg("rows"), py::arg("vocab"),
        py::arg("k"), "Workspace bytes log_softmax_topk needs for rows x vocab and top-k.");
  m.def(
      "log_softmax_topk",
      [](U logits, int64_t s0, int64_t s1, U tokens, U logprobs, U workspace, int batch, int depth,
         int vocab, int k, int dtype, U stream) {
        jetspec::TopkParams p{};
        p.logits = ptr<const void>(logits);
        p.s0 = s0;
        p.s1 = s1;
        p.tokens = ptr<int32_t>(tokens);
        p.logprobs = ptr<float>(logprobs);
        p.workspace = ptr<void>(workspace);
        p.batch = batch;
        p.depth = depth;
        p.vocab = vocab;
        p.k = k;
        check(jetspec::launch_log_softmax_topk(p, dtype, stream_of(stream)), "log_softmax_topk");
      },
      "Per-row log-softmax over the vocabulary and its top-k (tokens int32, log-probs fp32).");
  m.def(
      "hidden_topk_workspace_bytes",
      [](long long rows, int vocab, int k) {
        size_t bytes = 0;
        check(jetspec::hidden_topk_workspace_bytes(rows, vocab, k, &bytes),
              "hidden_topk_workspace_bytes");
        return bytes;
      },
      py::arg("rows"), py::arg("vocab"), py::arg("k"),
      "Workspace bytes hidden_topk needs for rows x vocab and top-k on the current device.");
  m.def(
      "hidden_topk",
      [](U hidden, int64_t sh0, int64_t sh1, U weight, int64_t sw0, U tokens, U logprobs,
         U workspace, int batch, int depth, int hidden_dim, int vocab, int k, int dtype, U stream) {
        jetspec::HiddenTopkParams p{};
        p.hidden = ptr<const void>(hidden);
        p.sh0 = sh0;
        p.sh1 = sh1;
        p.weight = ptr<const void>(weight);
        p.sw0 = sw0;
        p.tokens = ptr<int32_t>(tokens);
        p.logprobs = ptr<float>(logprobs);
        p.workspace = ptr<void>(workspace);
        p.batch = batch;
        p.depth = depth;
        p.hidden_dim = hidden_dim;
        p.vocab = vocab;
        p.k = k;
        check(jetspec::launch_hidden_topk(p, dtype, stream_of(stream)), "hidden_topk");
      },
      "Top-k of log_softmax(hidden @ weight^T) per row without materialising the logits.");
  m.def(
      "build_tree",
      [](U topk_tokens, U topk_logprobs, U root_tokens, U tokens, U parents, U depths, U scores,
         U num_nodes, U mask, int batch, int depth, int k, int budget, int words, int algorithm,
         U stream, U steps) {
        jetspec::BuildTreeParams p{};
        p.topk_tokens = ptr<const int32_t>(topk_tokens);
        p.topk_logprobs = ptr<const float>(topk_logprobs);
        p.root_tokens = ptr<const int32_t>(root_tokens);
        p.tokens = ptr<int32_t>(tokens);
        p.parents = ptr<int32_t>(parents);
        p.depths = ptr<int32_t>(depths);
        p.scores = ptr<float>(scores);
        p.num_nodes = ptr<int32_t>(num_nodes);
        p.mask = ptr<int32_t>(mask);
        p.steps = ptr<int32_t>(steps);
        p.batch = batch;
        p.depth = depth;
        p.k = k;
        p.budget = budget;
        p.words = words;
        p.algorithm = algorithm;
        check(jetspec::launch_build_tree(p, stream_of(stream)), "build_tree");
      },
      py::arg("topk_tokens"), py::arg("topk_logprobs"), py::arg("root_tokens"), py::arg("tokens"),
      py::arg("parents"), py::arg("depths"), py::arg("scores"), py::arg("num_nodes"),
      py::arg("mask"), py::arg("batch"), py::arg("depth"), py::arg("k"), py::arg("budget"),
      py::arg("words"), py::arg("algorithm"), py::arg("stream"), py::arg("steps") = U{0},
      "Draft tree (algorithm 0 topn, 1 accum_logp) from per-depth top-k, one CTA per sequence. "
      "steps: int32 [B] or 0 (absent): topn's selection steps per sequence (tests).");
  m.def(
      "tree_attention",
      [](U q, const I64s& sq, U k_cache, U v_cache, const I64s& sk, const I64s& sv, U block_table,
         int64_t bt_stride, int page_size, int cache_outer, U prefix_lens, U tree_mask,
         int64_t sm0, int64_t sm1, int tail, U out, const I64s& so, U lse, U part_o, U part_lse,
         int batch, int n, int hq, int hkv, int splits, float scale, int dtype, int head_dim,
         int kernel, U stream) {
        jetspec::AttnParams p{};
        p.q = ptr<const void>(q);
        p.sq = strides4(sq, "sq", "tree_attention");
        p.k_cache = ptr<const void>(k_cache);
        p.v_cache = ptr<const void>(v_cache);
        p.sk = strides4(sk, "sk", "tree_attention");
        p.sv = strides4(sv, "sv", "tree_attention");
        p.block_table = ptr<const int32_t>(block_table);
        p.bt_stride = bt_stride;
        p.page_size = page_size;
        p.cache_outer = cache_outer;
        p.prefix_lens = ptr<const int32_t>(prefix_lens);
        p.tree_mask = ptr<const int32_t>(tree_mask);
        p.sm0 = sm0;
        p.sm1 = sm1;
        p.tail = tail;
        p.out = ptr<void>(out);
        p.so = strides4(so, "so", "tree_attention");
        p.lse = ptr<float>(lse);
        p.part_o = ptr<float>(part_o);
        p.part_lse = ptr<float>(part_lse);
        p.batch = batch;
        p.n = n;
        p.hq = hq;
        p.hkv = hkv;
        p.group = hkv > 0 ? hq / hkv : 0;
        p.splits = splits;
        p.scale_log2 = scale * 1.4426950408889634f;
        p.kernel = kernel;
        check(jetspec::launch_tree_attention(p, dtype, head_dim, stream_of(stream)),
              "tree_attention");
      },
      "Prefix + tree-masked (tail 0) / causal (1) / full (2) attention, split-KV over splits; "
      "kernel 0 auto, 1 mma.sync, 2 wgmma (sm_90a), 3 warp-specialised wgmma with TMA loads "
      "(sm_90a; page sizes multiple of 8).");
}
