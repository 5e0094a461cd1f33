"""The exact mode's MoE routing on triton (``models.moe.exact_moe``): a program per token computes
its softmax over the E router logits, picks the top k and renormalises them, so a token's
experts and weights follow its own logits alone (no library kernel chosen by T; ties to the
lower expert id). FMA contraction off, as the other exact kernels."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import checks
from .sizes import next_power_of_2

__all__ = ["route_rows"]


@triton.jit
def _route_rows(logit_ptr, w_ptr, e_ptr, E, K: tl.constexpr, NORM: tl.constexpr,
                BLOCK: tl.constexpr, BLOCK_K: tl.constexpr):
    """Grid ``[T]``: softmax of the row's E logits in float32 (``exp(x - max) / sum``), then k
    rounds of (largest probability, lowest id among equals; NaN ranks first), the chosen
    probabilities summed in choice order in float32 and divided when ``NORM``; weights rounded
    to the logits' dtype. A row with a NaN (or an inf) logit: NaN weights, ids 0 .. k-1 (torch's
    softmax makes every probability NaN), never an id past E."""
    r = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    x = tl.load(logit_ptr + r * E + c, mask=c < E, other=float("-inf")).to(tl.float32)
    p = tl.exp(x - tl.max(x, axis=0))
    p = p / tl.sum(p, axis=0)
    # the ranking key: NaN first (as torch.topk; a NaN logit makes the whole row NaN), lanes
    # past E never chosen
    key = tl.where(c < E, tl.where(p != p, float("inf"), p), -1.0)
    kc = tl.arange(0, BLOCK_K)
    weights = tl.zeros([BLOCK_K], tl.float32)
    ids = tl.zeros([BLOCK_K], tl.int64)
    total = tl.zeros([], tl.float32)                 # 0 + the first choice: the first choice
    for j in tl.static_range(K):
        best = tl.max(key, axis=0)
        pick = tl.min(tl.where(key == best, c, BLOCK), axis=0)
        w = tl.where(best == float("inf"), float("nan"), best)    # no probability is inf
        weights = tl.where(kc == j, w, weights)
        ids = tl.where(kc == j, pick.to(tl.int64), ids)
        total = total + w
        key = tl.where(c == pick, -2.0, key)
    if NORM:
        weights = weights / total
    tl.store(w_ptr + r * K + kc, weights.to(w_ptr.dtype.element_ty), mask=kc < K)
    tl.store(e_ptr + r * K + kc, ids, mask=kc < K)


def route_rows(logits: torch.Tensor, top_k: int, norm_topk_prob: bool):
    """Top-k routing of every row of the router's ``logits [T, E]`` (float32 / bf16 / fp16).

    Returns ``(weights [T, k]`` in the logits' dtype (renormalised over the k when
    ``norm_topk_prob``), ``experts`` int64 ``[T, k]``, most probable first, ties to the lower
    id, NaN first as torch.topk ranks it): ``models.moe.route_logits``' semantics, a row's bits
    its own whatever T is.
    """
    t, e = logits.shape
    checks.integer("top_k", top_k, lo=1, hi=e)
    weights = torch.empty(t, top_k, dtype=logits.dtype, device=logits.device)
    experts = torch.empty(t, top_k, dtype=torch.int64, device=logits.device)
    if t:
        _route_rows[(t,)](logits.contiguous(), weights, experts, e, K=top_k,
                          NORM=bool(norm_topk_prob), BLOCK=next_power_of_2(e),
                          BLOCK_K=next_power_of_2(top_k), num_warps=4, enable_fp_fusion=False)
    return weights, experts
