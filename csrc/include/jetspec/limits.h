// The enums and limits of the launchers' contract, in one torch-free, CUDA-free header: the
// kernels use them, bindings.cpp exports them as _C.ENUMS / _C.LIMITS, and the Python side reads
// them from there (tests/test_cuda_boundary.py checks that jetspec_kernels/limits.py agrees).
#pragma once

namespace jetspec {

// Element types the kernels are instantiated for; the bindings pass one of these codes.
enum DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// What the N tail keys of tree_attention show each query: the packed tree mask, causal, or all.
enum AttnTail : int { kTailMask = 0, kTailCausal = 1, kTailFull = 2 };

// Which attention kernel: auto (wgmma where the device and head dim allow, else mma.sync), or
// one of them: mma.sync, wgmma with cp.async loads, or the Hopper family (attention_hopper.cuh:
// TMA producer, ping-pong consumers, 128-key blocks; head dims other than 64 / 128 run mma.sync).
// An sm_90a kernel where it cannot run is an error. 3 was a retired kernel's code: the others
// keep theirs, so results and messages recorded with them still read the same.
enum AttnKernel : int { kAttnAuto = 0, kAttnMma = 1, kAttnWgmma = 2, kAttnHopper = 4 };

enum TreeAlgorithm : int { kTreeTopn = 0, kTreeAccumLogp = 1 };

// An enumerator's Python-side name (the strings the ops take, e.g. tail="causal").
struct EnumName {
  const char* name;
  int value;
};

inline constexpr EnumName kDTypeNames[] = {
    {"float32", kFloat32}, {"float16", kFloat16}, {"bfloat16", kBFloat16}};
inline constexpr EnumName kAttnTailNames[] = {
    {"mask", kTailMask}, {"causal", kTailCausal}, {"full", kTailFull}};
inline constexpr EnumName kAttnKernelNames[] = {
    {"auto", kAttnAuto}, {"mma", kAttnMma}, {"wgmma", kAttnWgmma}, {"hopper", kAttnHopper}};
inline constexpr EnumName kTreeAlgorithmNames[] = {
    {"topn", kTreeTopn}, {"accum_logp", kTreeAccumLogp}};

// build_tree: the topn key packs a parent position in 12 bits and a rank in 6 (TopnKey).
constexpr int kMaxBudget = 4096;
constexpr int kMaxTopk = 64;
// verify_walk: tokens, parents and targets of at most this many nodes are staged in shared
// memory (12 bytes a node: 48 KB, the most without an opt-in).
constexpr int kWalkMaxNodes = 4096;
// verify_sample_filter with top-p: masses (< vocab * 2**32) stay exact in float64
// (python_ref.sampling.MAX_TOP_P_VOCAB).
constexpr int kTopPMaxVocab = 1 << 21;
// qk_norm_rope_append: 32 lanes x kRopeMaxPairsPerLane rotated pairs per head.
constexpr int kRopeMaxHeadDim = 512;

// tree_attention: head dims of the mma.sync kernel and of the sm_90a wgmma / Hopper kernels.
inline constexpr int kAttnHeadDims[] = {64, 128, 256};
inline constexpr int kWgmmaHeadDims[] = {64, 128};
// Packed rows per warpgroup (per CTA of the mma.sync and wgmma kernels) and the CTAs per SM
// those kernels are sized for.
constexpr int kAttnRows = 64;
constexpr int kAttnCtasPerSm = 2;
// The Hopper family's TMA copies load whole 8-row boxes of a paged cache.
constexpr int kAttnTmaPageMultiple = 8;
// cp.async / TMA rows: K/V rows start on these boundaries (bytes).
constexpr int kRowAlignBytes = 16;

}  // namespace jetspec
