"""Triton ``draft_tree``: the chain ``log_softmax_topk`` -> ``build_tree`` (the backend interface's
chain, ``backend.CHAINS``): the two functions' launches, one device guard around both."""
from __future__ import annotations

from .build_tree import build_tree
from .log_softmax_topk import log_softmax_topk

__all__ = ["draft_tree"]


def draft_tree(logits, k, root_tokens, budget, algorithm):
    """logits float [B, D, V] -> build_tree's outputs on its per-depth top-K (tokens, parents,
    depths, scores, num_nodes, mask)."""
    return build_tree(*log_softmax_topk(logits, k), root_tokens, budget, algorithm)
