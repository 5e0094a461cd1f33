"""Triton ``hidden_topk``: the per-depth log-softmax top-K of ``hidden @ lm_head_weight.T`` without
materialising the logits. The partial kernel computes a block of rows' logits for one vocabulary
chunk with ``tl.dot`` (fp32 accumulation) and reduces them at once; the partials and the merge are
``triton/log_softmax_topk.py``'s.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .log_softmax_topk import merge_partials, write_partials

__all__ = ["hidden_topk"]


@triton.jit
def _hidden_partial_kernel(h_ptr, w_ptr, hidden_batch_stride, hidden_row_stride, weight_row_stride,
                           D, H, V, M, C,
                           pm_ptr, ps_ptr, pk_ptr, K, KP: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
                           IEEE: tl.constexpr):
    """Grid ``[cdiv(B*D, BLOCK_M), C]``: logits of BLOCK_M rows x BLOCK_V vocabulary entries by
    ``tl.dot`` (fp32 accumulation), reduced at once to partials; the tile never leaves the chip."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    chunk = tl.program_id(1)
    rows_ok = rows < M
    b = rows // D
    d = rows % D
    h_row = h_ptr + b.to(tl.int64) * hidden_batch_stride + d.to(tl.int64) * hidden_row_stride
    tok = chunk * BLOCK_V + tl.arange(0, BLOCK_V)
    tok_ok = tok < V
    w_col = w_ptr + tok.to(tl.int64) * weight_row_stride
    acc = tl.zeros([BLOCK_M, BLOCK_V], tl.float32)
    for h0 in range(0, H, BLOCK_H):
        hh = h0 + tl.arange(0, BLOCK_H)
        hv = tl.load(h_row[:, None] + hh[None, :],
                     mask=rows_ok[:, None] & (hh[None, :] < H), other=0.0)
        wv = tl.load(w_col[None, :] + hh[:, None],
                     mask=tok_ok[None, :] & (hh[:, None] < H), other=0.0)
        if IEEE:
            acc = tl.dot(hv, wv, acc, input_precision="ieee")
        else:
            acc = tl.dot(hv, wv, acc)
    valid = rows_ok[:, None] & tok_ok[None, :]
    write_partials(acc, tok[None, :], valid, rows, rows_ok, chunk, C, pm_ptr, ps_ptr, pk_ptr,
                    K, KP)



def hidden_topk(hidden, lm_head_weight, k, *, block_v=None):
    """Top-K of ``log_softmax(hidden @ lm_head_weight.T)`` without materialising the logits.

    Parameters
    ----------
    hidden : float32/float16/bfloat16 ``[B, D, H]``, last dim contiguous
    lm_head_weight : same dtype ``[V, H]``, last dim contiguous
    k : int, ``1 <= k <= min(MAX_TOPK, V)`` (jetspec_kernels.limits)
    block_v : int, optional
        Vocabulary entries per program (a power of two >= 16; default 128).

    Returns
    -------
    topk_tokens : int32 ``[B, D, k]``; topk_logprobs : float32 ``[B, D, k]`` (as
    :func:`log_softmax_topk` of the fp32-accumulated logits).
    """
    B, D, H = hidden.shape
    V = lm_head_weight.shape[0]
    M = B * D
    bv = block_v or 128
    C = triton.cdiv(V, bv)
    KP = max(2, triton.next_power_of_2(k))
    fp32 = hidden.dtype == torch.float32
    block_m = 16 if M <= 16 else 32
    block_h = 32 if fp32 else 64
    dev = hidden.device
    pm = torch.empty(M, C, dtype=torch.float32, device=dev)
    ps = torch.empty(M, C, dtype=torch.float32, device=dev)
    pk = torch.empty(M, C, KP, dtype=torch.int64, device=dev)
    if M:
        grid = (triton.cdiv(M, block_m), C)
        _hidden_partial_kernel[grid](hidden, lm_head_weight, hidden.stride(0), hidden.stride(1),
                                     lm_head_weight.stride(0), D, H, V, M, C, pm, ps, pk, k,
                                     KP=KP, BLOCK_M=block_m, BLOCK_V=bv, BLOCK_H=block_h,
                                     IEEE=fp32, num_warps=4)
    return merge_partials(pm, ps, pk, (B, D), k, dev)
