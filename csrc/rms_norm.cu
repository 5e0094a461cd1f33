// rms_norm: the argument checks and one instantiation per element type.
#include "jetspec/api.h"
#include "jetspec/rms_norm.cuh"

namespace jetspec {

Status launch_rms_norm(const RmsNormParams& p, cudaStream_t stream) {
  JETSPEC_RETURN_IF_FAILED(check_range("rows", p.rows, 0));
  JETSPEC_RETURN_IF_FAILED(check_range("hidden", p.hidden, 1));
  JETSPEC_RETURN_IF_FAILED(check_range("x_row_stride", p.x_row_stride, 0));
  if (p.residual != nullptr)
    JETSPEC_RETURN_IF_FAILED(check_range("residual_row_stride", p.residual_row_stride, 0));
  if (!(p.eps > 0.f)) return bad_input("eps ", p.eps, " is not positive");
  if (p.dtype != kFloat32 && p.dtype != kFloat16 && p.dtype != kBFloat16)
    return bad_dtype("dtype", p.dtype, kAllDtypes);
  if (p.rows == 0) return cudaSuccess;
  if (p.x == nullptr || p.weight == nullptr || p.out == nullptr)
    return bad_input("x, weight and out are required (rows ", p.rows, ")");
  switch (p.dtype) {
    case kFloat32: return rms_norm<float>(p, stream);
    case kFloat16: return rms_norm<__half>(p, stream);
    default: return rms_norm<__nv_bfloat16>(p, stream);
  }
}

}  // namespace jetspec
