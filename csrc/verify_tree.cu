// verify_tree: filter thresholds and target tokens per node (fp32 / fp16 / bf16 logits) and the
// acceptance walk.
#include "jetspec/api.h"
#include "jetspec/verify_tree.cuh"

namespace jetspec {

namespace {
// The launchers' own checks (verify_tree.cuh returns a bare CUDA error), with the argument named.
Status check_target_tokens(const TargetTokenParams& p) {
  JETSPEC_RETURN_IF_FAILED(check_range("batch", p.batch, 0));
  JETSPEC_RETURN_IF_FAILED(check_range("n", p.n, 0));
  const long long rows = static_cast<long long>(p.batch) * p.n;
  if (rows == 0) return Status();
  if (rows > kMaxGridX) return bad_input("batch * n = ", rows, " exceeds ", kMaxGridX);
  JETSPEC_RETURN_IF_FAILED(check_range("vocab", p.vocab, 1));
  JETSPEC_RETURN_IF_FAILED(check_range("splits", p.splits, 1, kMaxGridYZ));  // grid y
  JETSPEC_RETURN_IF_FAILED(check_range("split_len", p.split_len, 1));
  const long long covered = static_cast<long long>(p.splits) * p.split_len;
  if (covered < p.vocab) {
    return bad_input("splits ", p.splits, " * split_len ", p.split_len, " = ", covered,
                     " do not cover vocab ", p.vocab);
  }
  if (p.vec && p.split_len % 8 != 0)
    return bad_input("split_len ", p.split_len, " is not a multiple of 8 (vec)");
  // Temperatures are device values (graph-capturable): only their presence is checked here.
  if (p.temperature != nullptr && (p.seed == nullptr || p.offset == nullptr))
    return bad_input("temperature needs seed and offset");
  if (p.thr_x != nullptr && (p.thr_id == nullptr || p.temperature == nullptr))
    return bad_input("thr_x needs thr_id and temperature");
  return Status();
}

Status check_sample_filter(const SampleFilterParams& p) {
  JETSPEC_RETURN_IF_FAILED(check_range("batch", p.batch, 0));
  JETSPEC_RETURN_IF_FAILED(check_range("n", p.n, 0));
  const long long rows = static_cast<long long>(p.batch) * p.n;
  if (rows == 0) return Status();
  if (rows > kMaxGridX) return bad_input("batch * n = ", rows, " exceeds ", kMaxGridX);
  JETSPEC_RETURN_IF_FAILED(
      check_range("vocab", p.vocab, 1, p.top_p != nullptr ? kTopPMaxVocab : 0x7fffffff));
  if (p.temperature == nullptr || p.thr_x == nullptr || p.thr_id == nullptr)
    return bad_input("temperature, thr_x and thr_id are required");
  return Status();
}

Status check_verify_walk(const VerifyWalkParams& p) {
  JETSPEC_RETURN_IF_FAILED(check_range("batch", p.batch, 0));
  if (p.batch == 0) return Status();
  // At least the root; at most what the walk stages in shared memory (the Python layer sends
  // larger trees to another backend).
  JETSPEC_RETURN_IF_FAILED(check_range("n", p.n, 1, kWalkMaxNodes));
  JETSPEC_RETURN_IF_FAILED(check_range("cols", p.cols, 1));
  if (p.target == nullptr) {
    if (p.partial_value == nullptr || p.partial_token == nullptr)
      return bad_input("target = 0 needs partial_value and partial_token");
    JETSPEC_RETURN_IF_FAILED(check_range("splits", p.splits, 1));
  }
  return Status();
}
}  // namespace

Status launch_sample_filter(const SampleFilterParams& p, cudaStream_t stream) {
  if (p.dtype != kFloat32 && p.dtype != kFloat16 && p.dtype != kBFloat16)
    return bad_dtype("dtype", p.dtype, kAllDtypes);
  JETSPEC_RETURN_IF_FAILED(check_sample_filter(p));
  switch (p.dtype) {
    case kFloat32: return sample_filter<float>(p, stream);
    case kFloat16: return sample_filter<__half>(p, stream);
    default: return sample_filter<__nv_bfloat16>(p, stream);
  }
}

Status launch_target_tokens(const TargetTokenParams& p, cudaStream_t stream) {
  if (p.dtype != kFloat32 && p.dtype != kFloat16 && p.dtype != kBFloat16)
    return bad_dtype("dtype", p.dtype, kAllDtypes);
  JETSPEC_RETURN_IF_FAILED(check_target_tokens(p));
  switch (p.dtype) {
    case kFloat32: return target_tokens<float>(p, stream);
    case kFloat16: return target_tokens<__half>(p, stream);
    default: return target_tokens<__nv_bfloat16>(p, stream);
  }
}

Status launch_verify_walk(const VerifyWalkParams& p, cudaStream_t stream) {
  JETSPEC_RETURN_IF_FAILED(check_verify_walk(p));
  return verify_walk(p, stream);
}

}  // namespace jetspec
