"""cuda backend: log_softmax_topk (vocab-parallel per-depth log-softmax top-K)."""
from __future__ import annotations

import torch

from . import extension as ext
from .custom_op import custom_op


def workspace_bytes(logits, k: int) -> int:
    """Bytes of scratch space :func:`launch` needs for ``logits`` [B, D, V] and ``k``."""
    b, d, v = logits.shape
    return ext.module().topk_workspace_bytes(b * d, v, k)


def launch(logits, k: int, tokens: int, logprobs: int, workspace: int) -> None:
    """Queue the kernel on the current stream: ``tokens`` / ``logprobs`` / ``workspace`` are
    device addresses of int32 [B, D, K], float32 [B, D, K] and :func:`workspace_bytes` bytes
    (inside :data:`ext.on_device`)."""
    b, d, v = logits.shape
    ext.module().log_softmax_topk(
        logits=logits.data_ptr(), logits_batch_stride=logits.stride(0),
        logits_row_stride=logits.stride(1), tokens=tokens, logprobs=logprobs,
        workspace=workspace, batch=b, depth=d, vocab=v, k=k, dtype=ext.dtype_code(logits),
        stream=ext.stream())


@custom_op("jetspec::log_softmax_topk", mutates_args=())
def _log_softmax_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    with ext.on_device(logits.device):
        b, d, _ = logits.shape
        tokens = torch.empty(b, d, k, device=logits.device, dtype=torch.int32)
        logprobs = torch.empty(b, d, k, device=logits.device, dtype=torch.float32)
        workspace = torch.empty(workspace_bytes(logits, k), device=logits.device, dtype=torch.uint8)
        launch(logits, k, tokens.data_ptr(), logprobs.data_ptr(), workspace.data_ptr())
        return tokens, logprobs


@_log_softmax_topk.register_fake
def _(logits, k):
    b, d, _ = logits.shape
    return (logits.new_empty(b, d, k, dtype=torch.int32),
            logits.new_empty(b, d, k, dtype=torch.float32))


def log_softmax_topk(logits, k):
    """logits float [B, D, V] -> (tokens int32 [B, D, K], logprobs float32 [B, D, K])."""
    return _log_softmax_topk(logits, int(k))
