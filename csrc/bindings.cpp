// pybind11 module jetspec_kernels._C: torch-free. Takes raw device pointers (data_ptr() integers),
// sizes and a stream handle, so it does not depend on the installed torch's C++ ABI.
#include <pybind11/pybind11.h>

#include <string>

#include "jetspec/api.h"
#include "jetspec/arch_list.h"
#include "jetspec/launcher_args.h"

namespace py = pybind11;

namespace {

using jetspec::bind::check;
using jetspec::bind::define_launcher;

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

// ---- The launchers -------------------------------------------------------------------------------

void define_launchers(py::module_& m, py::dict& t) {
  using namespace jetspec;
  define_launcher<PackMaskParams>(
      m, t, "pack_mask", {JETSPEC_PACK_MASK_FIELDS(JETSPEC_BIND_FIELD)}, launch_pack_mask,
      "int32 parents [B,N], num_nodes [B] -> int32 mask [B,N,W].");
  define_launcher<QkNormRopeAppendParams>(
      m, t, "qk_norm_rope_append", {JETSPEC_QK_NORM_ROPE_APPEND_FIELDS(JETSPEC_BIND_FIELD)},
      launch_qk_norm_rope_append,
      "Per-head RMSNorm + RoPE of q, k; k (normed, rotated) and v written into the cache. "
      "q = 0 (with q_out = 0, q_norm_w = 0) appends K/V only; q_norm_w = k_norm_w = 0: no norm. "
      "rotary_dim: 0 (absent) rotates whole heads, else the first rotary_dim dims.",
      {"rotary_dim"});
  define_launcher<SampleFilterParams>(
      m, t, "verify_sample_filter", {JETSPEC_SAMPLE_FILTER_FIELDS(JETSPEC_BIND_FIELD)},
      launch_sample_filter,
      "Per node: the last token the top-k (top_k [B] or 0) then top-p (top_p [B] or 0) filters "
      "keep, as thresholds thr_x / thr_id [B * N] (temperature [B]; <= 0 keeps every token).");
  define_launcher<TargetTokenParams>(
      m, t, "verify_target_tokens", {JETSPEC_TARGET_TOKEN_FIELDS(JETSPEC_BIND_FIELD)},
      launch_target_tokens,
      "Per (valid node, vocab split): the best logit (temperature 0 or null) or seeded "
      "Gumbel-max value over the tokens kept by thr_x / thr_id (when given) and its token, into "
      "partial_value / partial_token [B * N, splits].");
  define_launcher<VerifyWalkParams>(
      m, t, "verify_walk", {JETSPEC_VERIFY_WALK_FIELDS(JETSPEC_BIND_FIELD)}, launch_verify_walk,
      "Acceptance walk: accept_len, path, bonus, emitted. temperature: float32 [B] or 0 "
      "(absent: every row greedy); rows with T > 0 take the first agreeing sibling, the others "
      "the longest agreeing chain.",
      {"temperature"});
  define_launcher<CommitKvParams>(
      m, t, "commit_kv", {JETSPEC_COMMIT_KV_FIELDS(JETSPEC_BIND_FIELD)}, launch_commit_kv,
      "Move the accepted path's K/V to contiguous slots in place; gather hidden rows.");
  define_launcher<RmsNormParams>(
      m, t, "rms_norm", {JETSPEC_RMS_NORM_FIELDS(JETSPEC_BIND_FIELD)}, launch_rms_norm,
      "Per row of x [R, H]: h = x + residual (residual = 0: h = x) rounded to dtype, into total "
      "(0: not written), and out = weight * (h / sqrt(mean(h^2) + eps)), the normalised row "
      "rounded to dtype before the weight multiplies it (Qwen3RMSNorm).");
  define_launcher<SiluMulParams>(
      m, t, "silu_mul", {JETSPEC_SILU_MUL_FIELDS(JETSPEC_BIND_FIELD)}, launch_silu_mul,
      "Per row of x [R, 2I] (gate = x[:, :I], up = x[:, I:]): out [R, I] = rnd(rnd(silu(gate)) "
      "* up), silu(g) = g / (1 + exp(-g)) in float32, each product rounded to dtype (SwiGLU).");
  define_launcher<LogSoftmaxTopkParams>(
      m, t, "log_softmax_topk", {JETSPEC_LOG_SOFTMAX_TOPK_FIELDS(JETSPEC_BIND_FIELD)},
      launch_log_softmax_topk,
      "Per-row log-softmax over the vocabulary and its top-k (tokens int32, log-probs fp32).");
  define_launcher<BuildTreeParams>(
      m, t, "build_tree", {JETSPEC_BUILD_TREE_FIELDS(JETSPEC_BIND_FIELD)}, launch_build_tree,
      "Draft tree (algorithm 0 topn, 1 accum_logp) from per-depth top-k, one CTA per sequence. "
      "steps: int32 [B] or 0 (absent): topn's selection steps per sequence (tests).",
      {"steps"});
  define_launcher<AttnParams>(
      m, t, "tree_attention", {JETSPEC_ATTN_FIELDS(JETSPEC_BIND_FIELD)}, launch_tree_attention,
      "Prefix + tree-masked (tail 0) / causal (1) / full (2) attention, split-KV over splits; "
      "kernel 0 auto, 1 mma.sync, 2 wgmma (sm_90a), 4 the Hopper family (sm_90a; head dims 64, "
      "128, others run mma.sync; page sizes multiple of 8).");
}

#undef JETSPEC_BIND_FIELD

// ---- Enums and limits (limits.h) ----------------------------------------------------------------

template <typename E, size_t N>
void define_enum(py::module_& m, py::dict& table, const char* name,
                 const jetspec::EnumName (&names)[N]) {
  py::enum_<E> e(m, name, py::module_local());
  py::dict values;
  for (const jetspec::EnumName& n : names) {
    e.value(n.name, static_cast<E>(n.value));
    values[n.name] = n.value;
  }
  table[name] = values;
}

template <size_t N>
py::tuple ints(const int (&values)[N]) {
  py::list out;
  for (int v : values) out.append(v);
  return py::tuple(out);
}

py::dict limits() {
  using namespace jetspec;
  py::dict d;
  d["max_budget"] = kMaxBudget;
  d["max_topk"] = kMaxTopk;
  d["walk_max_nodes"] = kWalkMaxNodes;
  d["top_p_max_vocab"] = kTopPMaxVocab;
  d["rope_max_head_dim"] = kRopeMaxHeadDim;
  d["attn_head_dims"] = ints(kAttnHeadDims);
  d["wgmma_head_dims"] = ints(kWgmmaHeadDims);
  d["attn_rows"] = kAttnRows;
  d["attn_ctas_per_sm"] = kAttnCtasPerSm;
  d["attn_tma_page_multiple"] = kAttnTmaPageMultiple;
  d["row_align_bytes"] = kRowAlignBytes;
  return d;
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
  m.def("topk_workspace_bytes", &jetspec::topk_workspace_bytes, py::arg("rows"), py::arg("vocab"),
        py::arg("k"), "Workspace bytes log_softmax_topk needs for rows x vocab and top-k.");
  m.def(
      "tree_attention_hopper_splits",
      [](int batch, int n, int hq, int hkv, int capacity, int dtype, int head_dim, int sms) {
        int splits = 1;
        check(jetspec::tree_attention_hopper_splits(batch, n, hq, hkv, capacity, dtype, head_dim,
                                                    sms, &splits),
              "tree_attention_hopper_splits");
        return splits;
      },
      py::arg("batch"), py::arg("n"), py::arg("hq"), py::arg("hkv"), py::arg("capacity"),
      py::arg("dtype"), py::arg("head_dim"), py::arg("sms"),
      "Split-KV count of tree_attention kernel 4 (hopper) for these shapes on a GPU of `sms` SMs, "
      "from the kernel's occupancy on the current device and the wave efficiency (capacity: keys "
      "a sequence can hold).");

  // Every launcher: positional or keyword arguments, as its params.h field list declares them.
  py::dict fields;
  define_launchers(m, fields);
  m.attr("FIELDS") = fields;

  py::dict enums;
  define_enum<jetspec::DType>(m, enums, "DType", jetspec::kDTypeNames);
  define_enum<jetspec::AttnTail>(m, enums, "AttnTail", jetspec::kAttnTailNames);
  define_enum<jetspec::AttnKernel>(m, enums, "AttnKernel", jetspec::kAttnKernelNames);
  define_enum<jetspec::TreeAlgorithm>(m, enums, "TreeAlgorithm", jetspec::kTreeAlgorithmNames);
  m.attr("ENUMS") = enums;
  m.attr("LIMITS") = limits();
}
