"""cuda backend: log_softmax_topk (vocab-parallel per-depth log-softmax top-K)."""
from __future__ import annotations

import torch

from . import _util as U


@torch.library.custom_op("jetspec::log_softmax_topk", mutates_args=())
def _log_softmax_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    from .. import _C
    with U.on_device(logits):
        b, d, v = logits.shape
        tokens = torch.empty(b, d, k, device=logits.device, dtype=torch.int32)
        logprobs = torch.empty(b, d, k, device=logits.device, dtype=torch.float32)
        ws = torch.empty(_C.topk_workspace_bytes(b * d, v, k), device=logits.device, dtype=torch.uint8)
        _C.log_softmax_topk(logits=U.ptr(logits), s0=logits.stride(0), s1=logits.stride(1),
                            tokens=U.ptr(tokens), logprobs=U.ptr(logprobs), workspace=U.ptr(ws),
                            batch=b, depth=d, vocab=v, k=k, dtype=U.dtype_code(logits),
                            stream=U.stream())
        return tokens, logprobs


@_log_softmax_topk.register_fake
def _(logits, k):
    b, d, _ = logits.shape
    return (logits.new_empty(b, d, k, dtype=torch.int32),
            logits.new_empty(b, d, k, dtype=torch.float32))


def log_softmax_topk(logits, k):
    """logits float [B, D, V] -> (tokens int32 [B, D, K], logprobs float32 [B, D, K])."""
    return _log_softmax_topk(logits, int(k))
