// qk_norm_rope_append: instantiations for every (q dtype, cache dtype) pair.
#include "jetspec/api.h"
#include "jetspec/rope.cuh"

namespace jetspec {

namespace {
template <typename T>
Status rope_for_cache(const RopeParams& p, int cache_dtype, cudaStream_t stream) {
  switch (cache_dtype) {
    case kFloat32: return qk_norm_rope_append<T, float>(p, stream);
    case kFloat16: return qk_norm_rope_append<T, __half>(p, stream);
    case kBFloat16: return qk_norm_rope_append<T, __nv_bfloat16>(p, stream);
    default: return bad_dtype("cache_dtype", cache_dtype, kAllDtypes);
  }
}
}  // namespace

// dtype: that of k and v (and of q and q_out when p.q is set); cache_dtype: k_cache / v_cache.
Status launch_qk_norm_rope_append(const RopeParams& p, int dtype, int cache_dtype,
                                  cudaStream_t stream) {
  switch (dtype) {
    case kFloat32: return rope_for_cache<float>(p, cache_dtype, stream);
    case kFloat16: return rope_for_cache<__half>(p, cache_dtype, stream);
    case kBFloat16: return rope_for_cache<__nv_bfloat16>(p, cache_dtype, stream);
    default: return bad_dtype("dtype", dtype, kAllDtypes);
  }
}

}  // namespace jetspec
