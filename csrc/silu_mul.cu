// silu_mul: the argument checks and one instantiation per element type.
#include "jetspec/api.h"
#include "jetspec/silu_mul.cuh"

namespace jetspec {

Status launch_silu_mul(const SiluMulParams& p, cudaStream_t stream) {
  JETSPEC_RETURN_IF_FAILED(check_range("rows", p.rows, 0));
  JETSPEC_RETURN_IF_FAILED(check_range("inner", p.inner, 1));
  JETSPEC_RETURN_IF_FAILED(check_range("x_row_stride", p.x_row_stride, 0));
  if (p.dtype != kFloat32 && p.dtype != kFloat16 && p.dtype != kBFloat16)
    return bad_dtype("dtype", p.dtype, kAllDtypes);
  if (p.rows == 0) return cudaSuccess;
  if (p.x == nullptr || p.out == nullptr)
    return bad_input("x and out are required (rows ", p.rows, ")");
  switch (p.dtype) {
    case kFloat32: return silu_mul<float>(p, stream);
    case kFloat16: return silu_mul<__half>(p, stream);
    default: return silu_mul<__nv_bfloat16>(p, stream);
  }
}

}  // namespace jetspec
