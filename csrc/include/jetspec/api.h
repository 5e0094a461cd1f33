// Host-callable launchers compiled in the .cu files; bindings.cpp includes only this header.
// Every launcher checks its launch and returns the CUDA error (cudaSuccess on success);
// dtype codes are jetspec::DType values (0 float32, 1 float16, 2 bfloat16).
#pragma once
#ifdef JETSPEC_CPU_SIM
#include "cuda_sim.h"
#else
#include <cuda_runtime.h>
#endif
#include <cstddef>
#include <cstdint>

#include "jetspec/params.h"

namespace jetspec {

cudaError_t launch_pack_mask(const int32_t* parents, const int32_t* num_nodes, int32_t* mask,
                             int batch, int n, int words, cudaStream_t stream);

// q/k/v dtype and cache dtype may differ (the cache receives rounded fp32 results).
cudaError_t launch_qk_norm_rope_append(const RopeParams& p, int dtype, int cache_dtype,
                                       cudaStream_t stream);

cudaError_t launch_target_tokens(const TargetTokenParams& p, int logits_dtype, cudaStream_t stream);
cudaError_t launch_verify_walk(const VerifyWalkParams& p, cudaStream_t stream);

// Element sizes in bytes (2 or 4): the copies are raw.
cudaError_t launch_commit_kv(const CommitParams& p, int cache_elem_bytes, int hidden_elem_bytes,
                             cudaStream_t stream);

size_t topk_workspace_bytes(long long rows, int vocab, int k);
cudaError_t launch_log_softmax_topk(const TopkParams& p, int logits_dtype, cudaStream_t stream);
// hidden and weight float16 or bfloat16; the workspace size depends on the current device.
cudaError_t hidden_topk_workspace_bytes(long long rows, int vocab, int k, size_t* bytes);
cudaError_t launch_hidden_topk(const HiddenTopkParams& p, int dtype, cudaStream_t stream);
cudaError_t launch_build_tree(const BuildTreeParams& p, cudaStream_t stream);

// dtype float16 or bfloat16; head_dim 64, 128 or 256.
cudaError_t launch_tree_attention(const AttnParams& p, int dtype, int head_dim, cudaStream_t stream);

}  // namespace jetspec
