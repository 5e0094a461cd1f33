"""Reference log_softmax_topk: the per-depth top-K candidates a draft tree is built from."""

import torch

from ._common import compute_dtype

__all__ = ["log_softmax_topk"]


def log_softmax_topk(logits, k):
    """Per-depth log-softmax over the full vocabulary, then the top-K.

    Parameters
    ----------
    logits : float tensor ``[B, D, V]`` (any float dtype)
    k : int, ``1 <= k <= V``

    Returns
    -------
    topk_tokens : int32 ``[B, D, K]``, sorted by descending log-prob, ties to the lower token id
    topk_logprobs : ``[B, D, K]`` in the compute dtype (float64 for float64 logits, else float32)
    """
    k = int(k)
    V = logits.shape[-1]
    if not 1 <= k <= V:
        raise ValueError(f"k must be in [1, V={V}], got {k}")
    cd = compute_dtype(logits)
    logp = torch.log_softmax(logits.to(cd), dim=-1)
    # A stable descending sort keeps equal values in increasing token order.
    vals, idx = torch.sort(logp, dim=-1, descending=True, stable=True)
    return idx[..., :k].to(torch.int32).contiguous(), vals[..., :k].contiguous()
