"""cuda backend: log_softmax_topk (vocab-parallel per-depth log-softmax top-K)."""
from __future__ import annotations

import torch

from . import extension as ext
from .custom_op import custom_op


@custom_op("jetspec::log_softmax_topk", mutates_args=())
def _log_softmax_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    _C = ext.module()
    with ext.on_device(logits.device):
        b, d, v = logits.shape
        tokens = torch.empty(b, d, k, device=logits.device, dtype=torch.int32)
        logprobs = torch.empty(b, d, k, device=logits.device, dtype=torch.float32)
        workspace = torch.empty(_C.topk_workspace_bytes(b * d, v, k), device=logits.device, dtype=torch.uint8)
        _C.log_softmax_topk(logits=logits.data_ptr(), logits_batch_stride=logits.stride(0),
                            logits_row_stride=logits.stride(1),
                            tokens=tokens.data_ptr(), logprobs=logprobs.data_ptr(),
                            workspace=workspace.data_ptr(),
                            batch=b, depth=d, vocab=v, k=k, dtype=ext.dtype_code(logits),
                            stream=ext.stream())
        return tokens, logprobs


@_log_softmax_topk.register_fake
def _(logits, k):
    b, d, _ = logits.shape
    return (logits.new_empty(b, d, k, dtype=torch.int32),
            logits.new_empty(b, d, k, dtype=torch.float32))


def log_softmax_topk(logits, k):
    """logits float [B, D, V] -> (tokens int32 [B, D, K], logprobs float32 [B, D, K])."""
    return _log_softmax_topk(logits, int(k))
