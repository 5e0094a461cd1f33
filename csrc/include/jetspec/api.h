// Host-callable launchers compiled in the .cu files; bindings.cpp includes only this header.
// Every launcher takes its params struct (params.h: the fields _C.<op> takes, declared once) and a
// stream, checks its arguments and its launch, and returns a Status (status.h): the CUDA error,
// and for refused input a message naming the argument, its value and the limit.
#pragma once
#include <cstddef>
#include <cstdint>

#include "jetspec/params.h"
#include "jetspec/status.h"

namespace jetspec {

Status launch_pack_mask(const PackMaskParams& p, cudaStream_t stream);

// q/k/v dtype and cache dtype may differ (the cache receives rounded fp32 results).
Status launch_qk_norm_rope_append(const QkNormRopeAppendParams& p, cudaStream_t stream);

Status launch_sample_filter(const SampleFilterParams& p, cudaStream_t stream);
Status launch_target_tokens(const TargetTokenParams& p, cudaStream_t stream);
Status launch_verify_walk(const VerifyWalkParams& p, cudaStream_t stream);

Status launch_commit_kv(const CommitKvParams& p, cudaStream_t stream);

// Fused residual add + RMSNorm over rows; any hidden size, float32, float16 or bfloat16.
Status launch_rms_norm(const RmsNormParams& p, cudaStream_t stream);

// SwiGLU's silu(gate) * up over the rows of [R, 2I]; any I, float32, float16 or bfloat16.
Status launch_silu_mul(const SiluMulParams& p, cudaStream_t stream);

size_t topk_workspace_bytes(long long rows, int vocab, int k);
Status launch_log_softmax_topk(const LogSoftmaxTopkParams& p, cudaStream_t stream);
// hidden and weight float16 or bfloat16; the workspace size depends on the current device.
Status launch_build_tree(const BuildTreeParams& p, cudaStream_t stream);

// dtype float16 or bfloat16; head_dim 64, 128 or 256.
Status launch_tree_attention(const AttnParams& p, cudaStream_t stream);
// The split count kernel 4 (hopper) picks for these shapes on a GPU of `sms` SMs (its CTAs per
// SM from the current device's occupancy calculator; wave efficiency); capacity = the keys one
// sequence's cache can hold. 1 where it would not run.
Status tree_attention_hopper_splits(int batch, int n, int hq, int hkv, int capacity, int dtype,
                                    int head_dim, int sms, int* splits);

}  // namespace jetspec
