"""cuda backend: hidden_topk (the top-K of log_softmax(hidden @ lm_head_weight.T), vocab-parallel,
without materialising the logits)."""
from __future__ import annotations

import torch

from . import extension as ext
from .custom_op import custom_op
from .supports import supports


@custom_op("jetspec::hidden_topk", mutates_args=())
def _hidden_topk(hidden: torch.Tensor, lm_head_weight: torch.Tensor,
                 k: int) -> tuple[torch.Tensor, torch.Tensor]:
    _C = ext.module()
    with ext.on_device(hidden.device):
        b, d, h = hidden.shape
        v = lm_head_weight.shape[0]
        # Layout decisions read data_ptr(), so they live inside the op (opaque to torch.compile).
        if not ext.aligned16(lm_head_weight):
            raise ValueError("lm_head_weight rows must start on 16-byte boundaries for the cuda backend "
                             f"(strides {lm_head_weight.stride()}, data_ptr % 16 = "
                             f"{lm_head_weight.data_ptr() % 16})")
        if not ext.aligned16(hidden):
            hidden = hidden.clone(memory_format=torch.contiguous_format)
        tokens = torch.empty(b, d, k, device=hidden.device, dtype=torch.int32)
        logprobs = torch.empty(b, d, k, device=hidden.device, dtype=torch.float32)
        workspace = torch.empty(_C.hidden_topk_workspace_bytes(b * d, v, k), device=hidden.device,
                         dtype=torch.uint8)
        _C.hidden_topk(hidden=ext.ptr(hidden), hidden_batch_stride=hidden.stride(0),
                       hidden_row_stride=hidden.stride(1),
                       weight=ext.ptr(lm_head_weight), weight_row_stride=lm_head_weight.stride(0),
                       tokens=ext.ptr(tokens), logprobs=ext.ptr(logprobs), workspace=ext.ptr(workspace),
                       batch=b, depth=d, hidden_dim=h, vocab=v, k=k,
                       dtype=ext.dtype_code(hidden), stream=ext.stream())
        return tokens, logprobs


@_hidden_topk.register_fake
def _(hidden, lm_head_weight, k):
    b, d, _ = hidden.shape
    return (hidden.new_empty(b, d, k, dtype=torch.int32),
            hidden.new_empty(b, d, k, dtype=torch.float32))


def hidden_topk(hidden, lm_head_weight, k):
    """hidden fp16/bf16 [B, D, H], lm_head_weight [V, H] -> (tokens int32 [B, D, K], logprobs
    float32 [B, D, K]): the top-K of log_softmax(hidden @ lm_head_weight.T) in fp32, without
    materialising the logits. A ``hidden`` that :func:`supports` refuses is a
    BackendUnavailableError (lm_head_weight's row alignment is checked on its pointer)."""
    ext.require(supports("hidden_topk", hidden=hidden))
    return _hidden_topk(hidden, lm_head_weight, int(k))
