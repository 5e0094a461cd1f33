"""cuda backend: log_softmax_topk (vocab-parallel per-depth log-softmax top-K)."""
from __future__ import annotations

from functools import lru_cache

import torch

from .. import buffers
from . import extension as ext
from .custom_op import custom_op


@lru_cache(maxsize=1024)
def topk_layout(b: int, d: int, k: int) -> buffers.Layout:
    """The two outputs in one buffer, packed: tokens int32 [B, D, K], logprobs float32
    [B, D, K]."""
    return buffers.layout(((b, d, k), torch.int32), ((b, d, k), torch.float32),
                          align=buffers.PACKED)


@custom_op("jetspec::log_softmax_topk", mutates_args=())
def _log_softmax_topk(logits: torch.Tensor, k: int) -> torch.Tensor:
    _C = ext.module()
    with ext.on_device(logits):
        b, d, v = logits.shape
        lay = topk_layout(b, d, k)
        # One allocation: the outputs, then (16-byte aligned) the workspace; the op returns the
        # outputs' bytes.
        work = -(-lay.nbytes // buffers.ALIGN) * buffers.ALIGN
        buf = torch.empty(work + _C.topk_workspace_bytes(b * d, v, k), dtype=torch.uint8,
                          device=logits.device)
        tokens, logprobs = buffers.addresses(buf, lay)
        _C.log_softmax_topk(logits=ext.ptr(logits), logits_batch_stride=logits.stride(0),
                            logits_row_stride=logits.stride(1), tokens=tokens, logprobs=logprobs,
                            workspace=buf.data_ptr() + work, batch=b, depth=d, vocab=v, k=k,
                            dtype=ext.dtype_code(logits), stream=ext.stream())
        return buf[:lay.nbytes] if buf.shape[0] > lay.nbytes else buf


@_log_softmax_topk.register_fake
def _(logits, k):
    b, d, _ = logits.shape
    return logits.new_empty(topk_layout.__wrapped__(b, d, k).nbytes, dtype=torch.uint8)


def log_softmax_topk(logits, k):
    """logits float [B, D, V] -> (tokens int32 [B, D, K], logprobs float32 [B, D, K]): disjoint,
    contiguous views of one buffer (:func:`topk_layout`)."""
    k = int(k)
    buf = _log_softmax_topk(logits, k)
    return tuple(buffers.carve(buf, topk_layout(logits.shape[0], logits.shape[1], k)))
