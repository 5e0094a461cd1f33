// The sweep harness's registry: every kernel it times (the Hopper variants of variants.h, one
// translation unit each, and today's kernels from baselines.cu) registers one SweepKernel.
#pragma once
#include <string>
#include <vector>

#include "jetspec/attention_hopper.cuh"

namespace jetspec_sweep {

struct SweepKernel {
  std::string name, what;
  int head_dim;
  bool hopper;                 // a variant of the Hopper family (else one of today's kernels)
  int wgs, block_n, stages, ctas_declared, ablate, rows, threads;
  bool pingpong, fast_exp;
  size_t smem;
  // Launch (splits in p) and the split count for a launch of `batch` x `n` rows over `capacity`
  // keys (the family: occupancy + wave rule; today's kernels: jetspec_kernels/cuda/tree_attention.py's
  // choose_splits).
  jetspec::Status (*launch)(const jetspec::AttnParams& p, cudaStream_t stream);
  jetspec::Status (*splits)(int batch, int n, int group, int hkv, int capacity, int* splits);
  jetspec::Status (*resident)(int* ctas);  // CTAs per SM (occupancy calculator)
};

inline std::vector<SweepKernel>& registry() {
  static std::vector<SweepKernel> kernels;
  return kernels;
}

struct Register {
  explicit Register(const SweepKernel& k) { registry().push_back(k); }
};

}  // namespace jetspec_sweep
