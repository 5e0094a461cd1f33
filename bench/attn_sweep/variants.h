// The Hopper attention variants the sweep times (bf16; csrc/include/jetspec/attention_hopper.cuh):
// Variant<I> for I < kSweepVariantCount, one translation unit each (variant.cu, built with
// -DJETSPEC_SWEEP_VARIANT=I, so `make -j` compiles them in parallel). The Makefile reads
// kSweepVariantCount from this file. Names say what differs from the library's choice
// (HopperWide / HopperSmall): "wide" is HopperWide<128>, "small" HopperSmall<128>.
#pragma once
#include "jetspec/attention_hopper.cuh"

namespace jetspec_sweep {

using jetspec::HopperAttnCfg;
using jetspec::kAblateLoads;
using jetspec::kAblatePv;
using jetspec::kAblateSoftmax;

constexpr int kSweepVariantCount = 16;

template <int I> struct Variant;
#define JETSPEC_SWEEP_VARIANT_DEF(I, NAME, HD, WHAT, ...)          \
  template <> struct Variant<I> {                                   \
    static constexpr const char* kName = NAME;                      \
    static constexpr const char* kWhat = WHAT;                      \
    static constexpr int kHeadDim = HD;                             \
    using Cfg = __VA_ARGS__;                                        \
  };
//                        index, name,            Dh, what, HopperAttnCfg<WGS, BN, STAGES, PINGPONG, FAST_EXP, CTAS, ABLATE>
JETSPEC_SWEEP_VARIANT_DEF(0, "wide", 128, "library choice, > 64 rows", HopperAttnCfg<2, 128, 2>)
JETSPEC_SWEEP_VARIANT_DEF(1, "wide_nopp", 128, "no ping-pong", HopperAttnCfg<2, 128, 2, false>)
JETSPEC_SWEEP_VARIANT_DEF(2, "wide_s3", 128, "3 stages", HopperAttnCfg<2, 128, 3>)
JETSPEC_SWEEP_VARIANT_DEF(3, "wide_bn64", 128, "64-key blocks, 4 stages", HopperAttnCfg<2, 64, 4>)
JETSPEC_SWEEP_VARIANT_DEF(4, "wide_exp2f", 128, "exp2f, no folded FMA", HopperAttnCfg<2, 128, 2, true, false>)
JETSPEC_SWEEP_VARIANT_DEF(5, "wide_nosoftmax", 128, "ablation: no mask/softmax", HopperAttnCfg<2, 128, 2, true, true, 1, kAblateSoftmax>)
JETSPEC_SWEEP_VARIANT_DEF(6, "wide_noloads", 128, "ablation: no K/V loads", HopperAttnCfg<2, 128, 2, true, true, 1, kAblateLoads>)
JETSPEC_SWEEP_VARIANT_DEF(7, "wide_nopv", 128, "ablation: no P V GEMM", HopperAttnCfg<2, 128, 2, true, true, 1, kAblatePv>)
JETSPEC_SWEEP_VARIANT_DEF(8, "small", 128, "library choice, <= 64 rows", HopperAttnCfg<1, 64, 4>)
JETSPEC_SWEEP_VARIANT_DEF(9, "small_bn128", 128, "128-key blocks, 2 stages", HopperAttnCfg<1, 128, 2>)
JETSPEC_SWEEP_VARIANT_DEF(10, "small_bn128_s3", 128, "128-key blocks, 3 stages", HopperAttnCfg<1, 128, 3>)
JETSPEC_SWEEP_VARIANT_DEF(11, "small_2cta", 128, "2 stages, 2 CTAs/SM", HopperAttnCfg<1, 64, 2, true, true, 2>)
JETSPEC_SWEEP_VARIANT_DEF(12, "small_noloads", 128, "ablation: no K/V loads", HopperAttnCfg<1, 64, 4, true, true, 1, kAblateLoads>)
JETSPEC_SWEEP_VARIANT_DEF(13, "small_exp2f", 128, "exp2f, no folded FMA", HopperAttnCfg<1, 64, 4, true, false>)
JETSPEC_SWEEP_VARIANT_DEF(14, "wide_d64", 64, "library choice, Dh 64", HopperAttnCfg<2, 128, 3>)
JETSPEC_SWEEP_VARIANT_DEF(15, "small_d64", 64, "library choice, Dh 64, 2 CTAs/SM", HopperAttnCfg<1, 64, 4, true, true, 2>)
#undef JETSPEC_SWEEP_VARIANT_DEF

}  // namespace jetspec_sweep

namespace jetspec_sweep {
// The library's choices are in the sweep under these names.
static_assert(std::is_same_v<Variant<0>::Cfg, jetspec::HopperWide<128>>, "wide");
static_assert(std::is_same_v<Variant<8>::Cfg, jetspec::HopperSmall<128>>, "small");
static_assert(std::is_same_v<Variant<14>::Cfg, jetspec::HopperWide<64>>, "wide_d64");
static_assert(std::is_same_v<Variant<15>::Cfg, jetspec::HopperSmall<64>>, "small_d64");
}  // namespace jetspec_sweep
