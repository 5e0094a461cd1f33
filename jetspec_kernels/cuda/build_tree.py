"""cuda backend: build_tree (one CTA per sequence)."""
from __future__ import annotations

import torch

from ..tree import mask_words
from . import _util as U


@torch.library.custom_op("jetspec::build_tree", mutates_args=())
def _build_tree(topk_tokens: torch.Tensor, topk_logprobs: torch.Tensor, root_tokens: torch.Tensor,
                budget: int, algorithm: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                      torch.Tensor, torch.Tensor, torch.Tensor]:
    from .. import _C
    with U.on_device(topk_tokens):
        b, d, k = topk_tokens.shape
        dev = topk_tokens.device
        n, w = budget, mask_words(budget)
        tt = topk_tokens.to(torch.int32).contiguous()
        tl = topk_logprobs.to(torch.float32).contiguous()
        root = root_tokens.to(torch.int32).contiguous()
        tokens = torch.empty(b, n, device=dev, dtype=torch.int32)
        parents = torch.empty(b, n, device=dev, dtype=torch.int32)
        depths = torch.empty(b, n, device=dev, dtype=torch.int32)
        scores = torch.empty(b, n, device=dev, dtype=torch.float32)
        num_nodes = torch.empty(b, device=dev, dtype=torch.int32)
        mask = torch.empty(b, n, w, device=dev, dtype=torch.int32)
        _C.build_tree(topk_tokens=U.ptr(tt), topk_logprobs=U.ptr(tl), root_tokens=U.ptr(root),
                      tokens=U.ptr(tokens), parents=U.ptr(parents), depths=U.ptr(depths),
                      scores=U.ptr(scores), num_nodes=U.ptr(num_nodes), mask=U.ptr(mask),
                      batch=b, depth=d, k=k, budget=n, words=w,
                      algorithm=U.enum("TreeAlgorithm")[algorithm], stream=U.stream())
        return tokens, parents, depths, scores, num_nodes, mask


@_build_tree.register_fake
def _(topk_tokens, topk_logprobs, root_tokens, budget, algorithm):
    b = topk_tokens.shape[0]
    i32 = dict(dtype=torch.int32)
    return (topk_tokens.new_empty(b, budget, **i32), topk_tokens.new_empty(b, budget, **i32),
            topk_tokens.new_empty(b, budget, **i32),
            topk_tokens.new_empty(b, budget, dtype=torch.float32),
            topk_tokens.new_empty(b, **i32), topk_tokens.new_empty(b, budget, mask_words(budget), **i32))


def build_tree(topk_tokens, topk_logprobs, root_tokens, budget, algorithm):
    """Per-depth top-K [B, D, K] -> (tokens, parents, depths, scores, num_nodes, mask).

    Bit-exact with python_ref.build_tree given log-probs sorted descending along K.
    """
    return _build_tree(topk_tokens, topk_logprobs, root_tokens, int(budget), algorithm)
