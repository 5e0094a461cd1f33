"""cuda backend: build_tree (one CTA per sequence)."""
from __future__ import annotations

from functools import lru_cache

import torch

from .. import buffers
from ..tree import mask_words
from . import extension as ext
from .custom_op import custom_op

_I32, _F32 = torch.int32, torch.float32


@lru_cache(maxsize=1024)
def tree_layout(b: int, n: int) -> buffers.Layout:
    """The six outputs in one buffer, packed: mask int32 [B, N, W] (first: on the buffer's own
    alignment), tokens, parents, depths int32 [B, N], scores float32 [B, N], num_nodes int32 [B]."""
    return buffers.layout(((b, n, mask_words(n)), _I32), ((b, n), _I32), ((b, n), _I32),
                          ((b, n), _I32), ((b, n), _F32), ((b,), _I32), align=buffers.PACKED)


@custom_op("jetspec::build_tree", mutates_args=())
def _build_tree(topk_tokens: torch.Tensor, topk_logprobs: torch.Tensor, root_tokens: torch.Tensor,
                budget: int, algorithm: str) -> torch.Tensor:
    _C = ext.module()
    with ext.on_device(topk_tokens):
        b, d, k = topk_tokens.shape
        lay = tree_layout(b, budget)
        tt = topk_tokens.to(torch.int32).contiguous()
        tl = topk_logprobs.to(torch.float32).contiguous()
        root = root_tokens.to(torch.int32).contiguous()
        buf = buffers.empty(lay, topk_tokens.device)
        mask, tokens, parents, depths, scores, num_nodes = buffers.addresses(buf, lay)
        _C.build_tree(topk_tokens=ext.ptr(tt), topk_logprobs=ext.ptr(tl), root_tokens=ext.ptr(root),
                      tokens=tokens, parents=parents, depths=depths, scores=scores,
                      num_nodes=num_nodes, mask=mask, batch=b, depth=d, k=k, budget=budget,
                      words=lay.parts[0].shape[2],
                      algorithm=ext.enum("TreeAlgorithm")[algorithm], stream=ext.stream())
        return buf


@_build_tree.register_fake
def _(topk_tokens, topk_logprobs, root_tokens, budget, algorithm):
    lay = tree_layout.__wrapped__(topk_tokens.shape[0], budget)
    return topk_tokens.new_empty(lay.nbytes, dtype=torch.uint8)


def build_tree(topk_tokens, topk_logprobs, root_tokens, budget, algorithm):
    """Per-depth top-K [B, D, K] -> (tokens, parents, depths, scores, num_nodes, mask): disjoint,
    contiguous views of one buffer (:func:`tree_layout`).

    Bit-exact with python_ref.build_tree given log-probs sorted descending along K.
    """
    budget = int(budget)
    buf = _build_tree(topk_tokens, topk_logprobs, root_tokens, budget, algorithm)
    mask, *rest = buffers.carve(buf, tree_layout(topk_tokens.shape[0], budget))
    return (*rest, mask)
