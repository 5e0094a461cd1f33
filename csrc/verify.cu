// verify_tree: target tokens per node (fp32 / fp16 / bf16 logits) and the acceptance walk.
#include "jetspec/api.h"
#include "jetspec/verify.cuh"

namespace jetspec {

namespace {
// The launchers' own checks (verify.cuh returns a bare CUDA error), with the argument named.
Status check_target_tokens(const TargetTokenParams& p) {
  JETSPEC_RETURN_IF_FAILED(check_range("batch", p.batch, 0));
  JETSPEC_RETURN_IF_FAILED(check_range("n", p.n, 0));
  const long long rows = static_cast<long long>(p.batch) * p.n;
  if (rows == 0) return Status();
  if (rows > 0x7fffffffLL) return bad_input("batch * n = ", rows, " exceeds 2147483647");
  JETSPEC_RETURN_IF_FAILED(check_range("vocab", p.vocab, 1));
  JETSPEC_RETURN_IF_FAILED(check_range("splits", p.splits, 1, 65535));  // grid y
  JETSPEC_RETURN_IF_FAILED(check_range("split_len", p.split_len, 1));
  const long long covered = static_cast<long long>(p.splits) * p.split_len;
  if (covered < p.vocab) {
    return bad_input("splits ", p.splits, " * split_len ", p.split_len, " = ", covered,
                     " do not cover vocab ", p.vocab);
  }
  if (p.vec && p.split_len % 8 != 0)
    return bad_input("split_len ", p.split_len, " is not a multiple of 8 (vec)");
  if (!(p.temperature >= 0.f)) return bad_input("temperature ", p.temperature, " is not >= 0");
  if (p.temperature > 0.f && (p.seed == nullptr || p.offset == nullptr))
    return bad_input("temperature ", p.temperature, " needs seed and offset");
  return Status();
}

Status check_verify_walk(const VerifyWalkParams& p) {
  JETSPEC_RETURN_IF_FAILED(check_range("batch", p.batch, 0));
  if (p.batch == 0) return Status();
  // At least the root; at most what the walk stages in 48 KB of shared memory (the Python layer
  // sends larger trees to another backend).
  JETSPEC_RETURN_IF_FAILED(check_range("n", p.n, 1, kWalkMaxNodes));
  JETSPEC_RETURN_IF_FAILED(check_range("cols", p.cols, 1));
  if (p.target == nullptr) {
    if (p.part_v == nullptr || p.part_i == nullptr)
      return bad_input("target = 0 needs part_v and part_i");
    JETSPEC_RETURN_IF_FAILED(check_range("splits", p.splits, 1));
  }
  return Status();
}
}  // namespace

Status launch_target_tokens(const TargetTokenParams& p, int logits_dtype, cudaStream_t stream) {
  if (logits_dtype != kFloat32 && logits_dtype != kFloat16 && logits_dtype != kBFloat16)
    return bad_dtype("dtype", logits_dtype, kAllDtypes);
  JETSPEC_RETURN_IF_FAILED(check_target_tokens(p));
  switch (logits_dtype) {
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
