// qk_norm_rope_append: instantiations for every (q dtype, cache dtype) pair.
#include "jetspec/api.h"
#include "jetspec/qk_norm_rope_append.cuh"

namespace jetspec {

namespace {
template <typename T>
Status rope_for_cache(const QkNormRopeAppendParams& p, cudaStream_t stream) {
  switch (p.cache_dtype) {
    case kFloat32: return qk_norm_rope_append<T, float>(p, stream);
    case kFloat16: return qk_norm_rope_append<T, __half>(p, stream);
    case kBFloat16: return qk_norm_rope_append<T, __nv_bfloat16>(p, stream);
    default: return bad_dtype("cache_dtype", p.cache_dtype, kAllDtypes);
  }
}
}  // namespace

Status launch_qk_norm_rope_append(const QkNormRopeAppendParams& p, cudaStream_t stream) {
  switch (p.dtype) {
    case kFloat32: return rope_for_cache<float>(p, stream);
    case kFloat16: return rope_for_cache<__half>(p, stream);
    case kBFloat16: return rope_for_cache<__nv_bfloat16>(p, stream);
    default: return bad_dtype("dtype", p.dtype, kAllDtypes);
  }
}

}  // namespace jetspec
