// pybind11 module jetspec_kernels._C: torch-free. Takes raw device pointers (data_ptr() integers),
// sizes and a stream handle, so it does not depend on the installed torch's C++ ABI.
#include <pybind11/pybind11.h>

#include <climits>
#include <cstdint>
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

// ---- Launcher arguments ------------------------------------------------------------------------
// Each launcher declares its arguments once, as a list of fields (FIELD / PARAM below): that list
// is its Python signature (positional order and keyword names), how each argument is converted,
// and where it is stored; a missing, unknown, repeated or mistyped argument is a TypeError naming
// it. _C.FIELDS exports the lists (tests check them against params.h).

// "jetspec_kernels._C.<op>: argument '<name>' must be <type>, got <Python type>".
[[noreturn]] void wrong_type(const char* op, const char* name, const char* type, py::handle h) {
  throw py::type_error(op_prefix(op) + "argument '" + name + "' must be " + type + ", got " +
                       std::string(py::str(py::type::handle_of(h).attr("__name__"))));
}

bool is_integer(py::handle h) { return PyIndex_Check(h.ptr()) && !PyBool_Check(h.ptr()); }

long long integer(py::handle h, const char* op, const char* name, const char* type) {
  if (!is_integer(h)) wrong_type(op, name, type, h);
  py::int_ i = py::reinterpret_steal<py::int_>(PyNumber_Index(h.ptr()));
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow) throw py::value_error(op_prefix(op) + "argument '" + name + "' does not fit int64");
  return v;
}

// A device pointer (or stream handle) that converts to whatever pointer type its field has.
struct DevicePtr {
  std::uintptr_t v;
  template <typename T>
  operator T*() const { return reinterpret_cast<T*>(v); }
};

// The argument kinds: a Python type name and a conversion (raising for the wrong type).
struct Pointer {
  static constexpr const char* type = "int (device pointer, 0 = absent)";
  static DevicePtr get(py::handle h, const char* op, const char* name) {
    const long long v = integer(h, op, name, "int (device pointer)");
    if (v < 0) throw py::value_error(op_prefix(op) + "argument '" + name + "' is negative");
    return DevicePtr{static_cast<std::uintptr_t>(v)};
  }
};
struct Int {
  static constexpr const char* type = "int";
  static int get(py::handle h, const char* op, const char* name) {
    const long long v = integer(h, op, name, type);
    if (v < INT32_MIN || v > INT32_MAX)
      throw py::value_error(op_prefix(op) + "argument '" + name + "' = " + std::to_string(v) +
                            " does not fit int32");
    return static_cast<int>(v);
  }
};
struct Int64 {
  static constexpr const char* type = "int";
  static int64_t get(py::handle h, const char* op, const char* name) {
    return integer(h, op, name, type);
  }
};
struct Double {
  static constexpr const char* type = "float";
  static double get(py::handle h, const char* op, const char* name) {
    if (!PyFloat_Check(h.ptr()) && !is_integer(h)) wrong_type(op, name, type, h);
    return py::cast<double>(h);
  }
};
struct Float {
  static constexpr const char* type = "float";
  static float get(py::handle h, const char* op, const char* name) {
    return static_cast<float>(Double::get(h, op, name));
  }
};
struct Flag {
  static constexpr const char* type = "bool";
  static int get(py::handle h, const char* op, const char* name) {
    if (!PyBool_Check(h.ptr())) wrong_type(op, name, type, h);
    return h.ptr() == Py_True ? 1 : 0;
  }
};
// Strides of dims 0..2 of a 4-d tensor (dim 3 is contiguous).
struct Strides {
  static constexpr const char* type = "list[int] (strides of dims 0..2)";
  static jetspec::Strides4 get(py::handle h, const char* op, const char* name) {
    if (!PyList_Check(h.ptr()) && !PyTuple_Check(h.ptr())) wrong_type(op, name, type, h);
    const py::sequence s = py::reinterpret_borrow<py::sequence>(h);
    if (s.size() < 3) {
      throw std::invalid_argument(op_prefix(op) + name + " needs 3 strides, got " +
                                  std::to_string(s.size()));
    }
    const std::string each = std::string(name) + "[i]";
    return jetspec::Strides4{integer(s[0], op, each.c_str(), "int"),
                             integer(s[1], op, each.c_str(), "int"),
                             integer(s[2], op, each.c_str(), "int")};
  }
};

template <typename Call>
struct Field {
  const char* name;
  const char* type;
  bool in_params;  // a member of the launcher's Params struct (call.p) of the same name
  bool optional;   // may be left out: stays 0 / null
  void (*store)(Call&, py::handle, const char* op);
};

// A member `name` of the Params struct (call.p), or of the call itself (a launch argument outside
// Params: dtype, stream, ...); OPTIONAL_PARAM may be left out.
#define PARAM(Kind, name) \
  {#name, Kind::type, true, false, [](auto& c, py::handle h, const char* op) { c.p.name = Kind::get(h, op, #name); }}
#define OPTIONAL_PARAM(Kind, name) \
  {#name, Kind::type, true, true, [](auto& c, py::handle h, const char* op) { c.p.name = Kind::get(h, op, #name); }}
#define FIELD(Kind, name) \
  {#name, Kind::type, false, false, [](auto& c, py::handle h, const char* op) { c.name = Kind::get(h, op, #name); }}

template <typename Call>
struct Launcher {
  const char* op;
  const char* params;                 // the Params struct's name ("" when there is none)
  std::vector<Field<Call>> fields;
  std::vector<const char*> derived;   // Params members the launcher computes from other fields
  jetspec::Status (*run)(Call&);
  const char* doc;

  void operator()(const py::args& args, const py::kwargs& kwargs) const {
    const size_t n = fields.size();
    if (args.size() > n) {
      throw py::type_error(op_prefix(op) + "takes " + std::to_string(n) + " arguments, got " +
                           std::to_string(args.size()) + " positional");
    }
    Call c{};
    std::vector<char> seen(n, 0);
    for (size_t i = 0; i < args.size(); ++i) {
      fields[i].store(c, args[i], op);
      seen[i] = 1;
    }
    for (auto [key, value] : kwargs) {
      const std::string name = py::str(key);
      size_t i = 0;
      while (i < n && name != fields[i].name) ++i;
      if (i == n) throw py::type_error(op_prefix(op) + "unexpected argument '" + name + "'");
      if (seen[i]) throw py::type_error(op_prefix(op) + "got multiple values for argument '" + name + "'");
      fields[i].store(c, value, op);
      seen[i] = 1;
    }
    for (size_t i = 0; i < n; ++i) {
      if (!seen[i] && !fields[i].optional)
        throw py::type_error(op_prefix(op) + "missing argument '" + fields[i].name + "'");
    }
    check(run(c), op);
  }

  // "op(name: type, ...) -> None" and the doc; the pybind signature itself is (*args, **kwargs).
  std::string docstring() const {
    std::string s = std::string(op) + "(";
    for (size_t i = 0; i < fields.size(); ++i) {
      s += std::string(i ? ", " : "") + fields[i].name + ": " + fields[i].type;
      if (fields[i].optional) s += " = 0";
    }
    return s + ") -> None\n\n" + doc;
  }

  void define(py::module_& m, py::dict& table) const {
    m.def(op, [self = *this](py::args a, py::kwargs k) { self(a, k); }, docstring().c_str());
    py::list rows;
    for (const Field<Call>& f : fields)
      rows.append(py::make_tuple(f.name, f.type, f.in_params, f.optional));
    py::list computed;
    for (const char* d : derived) computed.append(d);
    table[op] = py::dict(py::arg("fields") = py::tuple(rows), py::arg("params") = params,
                         py::arg("derived") = py::tuple(computed));
  }
};

// ---- The launchers -------------------------------------------------------------------------------

struct PackMaskCall {
  const int32_t* parents;
  const int32_t* num_nodes;
  int32_t* mask;
  int batch, n, words;
  cudaStream_t stream;
};

struct RopeCall {
  jetspec::RopeParams p;
  int dtype, cache_dtype;
  cudaStream_t stream;
};

struct SampleFilterCall {
  jetspec::SampleFilterParams p;
  int dtype;
  cudaStream_t stream;
};

struct TargetTokenCall {
  jetspec::TargetTokenParams p;
  int dtype;
  cudaStream_t stream;
};

struct VerifyWalkCall {
  jetspec::VerifyWalkParams p;
  cudaStream_t stream;
};

struct CommitCall {
  jetspec::CommitParams p;
  int cache_elem_bytes, hidden_elem_bytes;
  cudaStream_t stream;
};

struct TopkCall {
  jetspec::TopkParams p;
  int dtype;
  cudaStream_t stream;
};

struct HiddenTopkCall {
  jetspec::HiddenTopkParams p;
  int dtype;
  cudaStream_t stream;
};

struct BuildTreeCall {
  jetspec::BuildTreeParams p;
  cudaStream_t stream;
};

struct AttnCall {
  jetspec::AttnParams p;
  float scale;
  int dtype, head_dim;
  cudaStream_t stream;
};

const Launcher<PackMaskCall> kPackMask{
    "pack_mask", "",
    {FIELD(Pointer, parents), FIELD(Pointer, num_nodes), FIELD(Pointer, mask), FIELD(Int, batch),
     FIELD(Int, n), FIELD(Int, words), FIELD(Pointer, stream)},
    {},
    [](PackMaskCall& c) {
      return jetspec::launch_pack_mask(c.parents, c.num_nodes, c.mask, c.batch, c.n, c.words,
                                       c.stream);
    },
    "int32 parents [B,N], num_nodes [B] -> int32 mask [B,N,W] (device pointers)."};

const Launcher<RopeCall> kRope{
    "qk_norm_rope_append", "RopeParams",
    {PARAM(Pointer, q), PARAM(Pointer, k), PARAM(Pointer, v), PARAM(Pointer, q_norm_w),
     PARAM(Pointer, k_norm_w), PARAM(Pointer, positions), PARAM(Pointer, cache_start),
     PARAM(Pointer, q_out), PARAM(Pointer, k_cache), PARAM(Pointer, v_cache),
     PARAM(Pointer, block_table), PARAM(Strides, sq), PARAM(Strides, sk), PARAM(Strides, sv),
     PARAM(Strides, sc), PARAM(Strides, svc), PARAM(Int64, bt_stride), PARAM(Int, batch),
     PARAM(Int, n), PARAM(Int, hq), PARAM(Int, hkv), PARAM(Int, dh), PARAM(Int, page_size),
     PARAM(Double, theta), PARAM(Float, eps), FIELD(Int, dtype), FIELD(Int, cache_dtype),
     FIELD(Pointer, stream)},
    {},
    [](RopeCall& c) {
      if ((c.p.q == nullptr) != (c.p.q_out == nullptr))
        return jetspec::bad_input("q and q_out must both be set or both be 0");
      return jetspec::launch_qk_norm_rope_append(c.p, c.dtype, c.cache_dtype, c.stream);
    },
    "Per-head RMSNorm + RoPE of q, k; k (normed, rotated) and v written into the cache. "
    "q = 0 (with q_out = 0, q_norm_w = 0) appends K/V only."};

const Launcher<SampleFilterCall> kSampleFilter{
    "verify_sample_filter", "SampleFilterParams",
    {PARAM(Pointer, logits), PARAM(Int64, s0), PARAM(Int64, s1), PARAM(Pointer, num_nodes),
     PARAM(Pointer, temperature), PARAM(Pointer, top_k), PARAM(Pointer, top_p),
     PARAM(Pointer, thr_x), PARAM(Pointer, thr_id), PARAM(Int, batch), PARAM(Int, n),
     PARAM(Int, vocab), PARAM(Flag, vec), FIELD(Int, dtype), FIELD(Pointer, stream)},
    {},
    [](SampleFilterCall& c) { return jetspec::launch_sample_filter(c.p, c.dtype, c.stream); },
    "Per node: the last token the top-k (top_k [B] or 0) then top-p (top_p [B] or 0) filters "
    "keep, as thresholds thr_x / thr_id [B * N] (temperature [B]; <= 0 keeps every token)."};

const Launcher<TargetTokenCall> kTargetTokens{
    "verify_target_tokens", "TargetTokenParams",
    {PARAM(Pointer, logits), PARAM(Int64, s0), PARAM(Int64, s1), PARAM(Pointer, num_nodes),
     PARAM(Pointer, seed), PARAM(Pointer, offset), PARAM(Pointer, part_v), PARAM(Pointer, part_i),
     PARAM(Int, batch), PARAM(Int, n), PARAM(Int, vocab), PARAM(Int, splits),
     PARAM(Int, split_len), PARAM(Flag, vec), PARAM(Pointer, temperature), PARAM(Pointer, thr_x),
     PARAM(Pointer, thr_id), FIELD(Int, dtype), FIELD(Pointer, stream)},
    {},
    [](TargetTokenCall& c) { return jetspec::launch_target_tokens(c.p, c.dtype, c.stream); },
    "Per (valid node, vocab split): the best logit (temperature 0 or null) or seeded Gumbel-max "
    "value over the tokens kept by thr_x / thr_id (when given) and its token, into part_v / "
    "part_i [B * N, splits]."};

const Launcher<VerifyWalkCall> kVerifyWalk{
    "verify_walk", "VerifyWalkParams",
    {PARAM(Pointer, tokens), PARAM(Pointer, parents), PARAM(Pointer, num_nodes),
     PARAM(Pointer, target), PARAM(Int64, target_stride), PARAM(Pointer, part_v),
     PARAM(Pointer, part_i), PARAM(Int, splits), PARAM(Pointer, accept_len), PARAM(Pointer, path),
     PARAM(Pointer, bonus), PARAM(Pointer, emitted), PARAM(Int, batch), PARAM(Int, n),
     PARAM(Int, cols), FIELD(Pointer, stream)},
    {},
    [](VerifyWalkCall& c) { return jetspec::launch_verify_walk(c.p, c.stream); },
    "Acceptance walk: accept_len, path, bonus, emitted."};

const Launcher<CommitCall> kCommit{
    "commit_kv", "CommitParams",
    {PARAM(Pointer, k_cache), PARAM(Pointer, v_cache), PARAM(Strides, sk), PARAM(Strides, sv),
     PARAM(Pointer, block_table), PARAM(Int64, bt_stride), PARAM(Pointer, prefix_lens),
     PARAM(Pointer, path), PARAM(Pointer, accept_len), PARAM(Pointer, new_prefix_lens),
     PARAM(Pointer, hidden), PARAM(Int64, sh0), PARAM(Int64, sh1), PARAM(Pointer, hidden_rows),
     PARAM(Int, batch), PARAM(Int, cols), PARAM(Int, hkv), PARAM(Int, dh), PARAM(Int, page_size),
     PARAM(Int, hidden_dim), FIELD(Int, cache_elem_bytes), FIELD(Int, hidden_elem_bytes),
     FIELD(Pointer, stream)},
    {},
    [](CommitCall& c) {
      return jetspec::launch_commit_kv(c.p, c.cache_elem_bytes, c.hidden_elem_bytes, c.stream);
    },
    "Move the accepted path's K/V to contiguous slots in place; gather hidden rows."};

const Launcher<TopkCall> kTopk{
    "log_softmax_topk", "TopkParams",
    {PARAM(Pointer, logits), PARAM(Int64, s0), PARAM(Int64, s1), PARAM(Pointer, tokens),
     PARAM(Pointer, logprobs), PARAM(Pointer, workspace), PARAM(Int, batch), PARAM(Int, depth),
     PARAM(Int, vocab), PARAM(Int, k), FIELD(Int, dtype), FIELD(Pointer, stream)},
    {},
    [](TopkCall& c) { return jetspec::launch_log_softmax_topk(c.p, c.dtype, c.stream); },
    "Per-row log-softmax over the vocabulary and its top-k (tokens int32, log-probs fp32)."};

const Launcher<HiddenTopkCall> kHiddenTopk{
    "hidden_topk", "HiddenTopkParams",
    {PARAM(Pointer, hidden), PARAM(Int64, sh0), PARAM(Int64, sh1), PARAM(Pointer, weight),
     PARAM(Int64, sw0), PARAM(Pointer, tokens), PARAM(Pointer, logprobs),
     PARAM(Pointer, workspace), PARAM(Int, batch), PARAM(Int, depth), PARAM(Int, hidden_dim),
     PARAM(Int, vocab), PARAM(Int, k), FIELD(Int, dtype), FIELD(Pointer, stream)},
    {},
    [](HiddenTopkCall& c) { return jetspec::launch_hidden_topk(c.p, c.dtype, c.stream); },
    "Top-k of log_softmax(hidden @ weight^T) per row without materialising the logits."};

const Launcher<BuildTreeCall> kBuildTree{
    "build_tree", "BuildTreeParams",
    {PARAM(Pointer, topk_tokens), PARAM(Pointer, topk_logprobs), PARAM(Pointer, root_tokens),
     PARAM(Pointer, tokens), PARAM(Pointer, parents), PARAM(Pointer, depths),
     PARAM(Pointer, scores), PARAM(Pointer, num_nodes), PARAM(Pointer, mask), PARAM(Int, batch),
     PARAM(Int, depth), PARAM(Int, k), PARAM(Int, budget), PARAM(Int, words),
     PARAM(Int, algorithm), FIELD(Pointer, stream), OPTIONAL_PARAM(Pointer, steps)},
    {},
    [](BuildTreeCall& c) { return jetspec::launch_build_tree(c.p, c.stream); },
    "Draft tree (algorithm 0 topn, 1 accum_logp) from per-depth top-k, one CTA per sequence. "
    "steps: int32 [B] or 0 (absent): topn's selection steps per sequence (tests)."};

const Launcher<AttnCall> kTreeAttention{
    "tree_attention", "AttnParams",
    {PARAM(Pointer, q), PARAM(Strides, sq), PARAM(Pointer, k_cache), PARAM(Pointer, v_cache),
     PARAM(Strides, sk), PARAM(Strides, sv), PARAM(Pointer, block_table), PARAM(Int64, bt_stride),
     PARAM(Int, page_size), PARAM(Int, cache_outer), PARAM(Pointer, prefix_lens),
     PARAM(Pointer, tree_mask), PARAM(Int64, sm0), PARAM(Int64, sm1), PARAM(Int, tail),
     PARAM(Pointer, out), PARAM(Strides, so), PARAM(Pointer, lse), PARAM(Pointer, part_o),
     PARAM(Pointer, part_lse), PARAM(Int, batch), PARAM(Int, n), PARAM(Int, hq), PARAM(Int, hkv),
     PARAM(Int, splits), FIELD(Float, scale), FIELD(Int, dtype), FIELD(Int, head_dim),
     PARAM(Int, kernel), FIELD(Pointer, stream)},
    {"group", "scale_log2"},
    [](AttnCall& c) {
      c.p.group = c.p.hkv > 0 ? c.p.hq / c.p.hkv : 0;
      c.p.scale_log2 = c.scale * 1.4426950408889634f;
      return jetspec::launch_tree_attention(c.p, c.dtype, c.head_dim, c.stream);
    },
    "Prefix + tree-masked (tail 0) / causal (1) / full (2) attention, split-KV over splits; "
    "kernel 0 auto, 1 mma.sync, 2 wgmma (sm_90a), 3 warp-specialised wgmma with TMA loads "
    "(sm_90a; page sizes multiple of 8), 4 the Hopper family (sm_90a; head dims 64, 128, others "
    "run mma.sync; page sizes multiple of 8)."};

#undef PARAM
#undef OPTIONAL_PARAM
#undef FIELD

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
  d["rope_max_head_dim"] = kRopeMaxHeadDim;
  d["attn_head_dims"] = ints(kAttnHeadDims);
  d["wgmma_head_dims"] = ints(kWgmmaHeadDims);
  d["attn_rows"] = kAttnRows;
  d["attn_ctas_per_sm"] = kAttnCtasPerSm;
  d["attn_tma_wide_rows"] = kAttnTmaWideRows;
  d["attn_tma_wide_ctas_per_sm"] = kAttnTmaWideCtasPerSm;
  d["attn_tma_page_multiple"] = kAttnTmaPageMultiple;
  d["row_align_bytes"] = kRowAlignBytes;
  d["hidden_topk_multiple"] = kHiddenTopkMultiple;
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
      "tree_attention_hopper_splits",
      [](int batch, int n, int hq, int hkv, int capacity, int dtype, int head_dim) {
        int splits = 1;
        check(jetspec::tree_attention_hopper_splits(batch, n, hq, hkv, capacity, dtype, head_dim,
                                                    &splits),
              "tree_attention_hopper_splits");
        return splits;
      },
      py::arg("batch"), py::arg("n"), py::arg("hq"), py::arg("hkv"), py::arg("capacity"),
      py::arg("dtype"), py::arg("head_dim"),
      "Split-KV count of tree_attention kernel 4 (hopper) for these shapes on the current device, "
      "from the kernel's occupancy and the wave efficiency (capacity: keys a sequence can hold).");

  // Every launcher: positional or keyword arguments, as its field list declares them.
  py::dict fields;
  kPackMask.define(m, fields);
  kRope.define(m, fields);
  kSampleFilter.define(m, fields);
  kTargetTokens.define(m, fields);
  kVerifyWalk.define(m, fields);
  kCommit.define(m, fields);
  kTopk.define(m, fields);
  kHiddenTopk.define(m, fields);
  kBuildTree.define(m, fields);
  kTreeAttention.define(m, fields);
  m.attr("FIELDS") = fields;

  py::dict enums;
  define_enum<jetspec::DType>(m, enums, "DType", jetspec::kDTypeNames);
  define_enum<jetspec::AttnTail>(m, enums, "AttnTail", jetspec::kAttnTailNames);
  define_enum<jetspec::AttnKernel>(m, enums, "AttnKernel", jetspec::kAttnKernelNames);
  define_enum<jetspec::TreeAlgorithm>(m, enums, "TreeAlgorithm", jetspec::kTreeAlgorithmNames);
  m.attr("ENUMS") = enums;
  m.attr("LIMITS") = limits();
}
