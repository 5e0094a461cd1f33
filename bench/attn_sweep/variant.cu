// One Hopper variant of variants.h (index JETSPEC_SWEEP_VARIANT), registered for the sweep.
#include "sweep.h"
#include "variants.h"

#ifndef JETSPEC_SWEEP_VARIANT
#error "build with -DJETSPEC_SWEEP_VARIANT=<index into variants.h>"
#endif

namespace jetspec_sweep {
namespace {
using V = Variant<JETSPEC_SWEEP_VARIANT>;
using T = __nv_bfloat16;
constexpr int HD = V::kHeadDim;
using Cfg = V::Cfg;

jetspec::Status launch(const jetspec::AttnParams& p, cudaStream_t stream) {
  return jetspec::tree_attention_hopper_variant<T, HD, Cfg>(p, stream);
}
jetspec::Status splits(int batch, int n, int group, int hkv, int capacity, int* out) {
  int sms = 0;
  JETSPEC_RETURN_IF_FAILED(jetspec::current_sm_count(&sms));
  return jetspec::hopper_splits_for<T, HD, Cfg>(batch, n, group, hkv, capacity, 32, sms, out);
}
jetspec::Status resident(int* ctas) { return jetspec::hopper_resident_ctas<T, HD, Cfg>(ctas); }

const Register reg(SweepKernel{V::kName, V::kWhat, HD, true, Cfg::kWgs, Cfg::kBlockN,
                               Cfg::kStages, Cfg::kCtasPerSm, Cfg::kAblate, Cfg::kRows,
                               Cfg::kThreads, Cfg::kPingPong, Cfg::kFastExp,
                               jetspec::attention_hopper_smem_bytes<HD, Cfg>(), &launch, &splits,
                               &resident});
}  // namespace
}  // namespace jetspec_sweep
