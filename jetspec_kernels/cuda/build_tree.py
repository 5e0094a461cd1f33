"""cuda backend: build_tree (one CTA per sequence)."""
from __future__ import annotations

import torch

from .. import checks
from ..tree import mask_words
from . import extension as ext
from .custom_op import custom_op


@custom_op("jetspec::build_tree", mutates_args=())
def _build_tree(topk_tokens: torch.Tensor, topk_logprobs: torch.Tensor, root_tokens: torch.Tensor,
                budget: int, algorithm: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                      torch.Tensor, torch.Tensor, torch.Tensor]:
    _C = ext.module()
    with ext.on_device(topk_tokens.device):
        b, d, k = topk_tokens.shape
        dev = topk_tokens.device
        n, w = budget, mask_words(budget)
        tt = checks.as_dtype(topk_tokens, torch.int32).contiguous()
        tl = checks.as_dtype(topk_logprobs, torch.float32).contiguous()
        root = checks.as_dtype(root_tokens, torch.int32).contiguous()
        tokens = torch.empty(b, n, device=dev, dtype=torch.int32)
        parents = torch.empty(b, n, device=dev, dtype=torch.int32)
        depths = torch.empty(b, n, device=dev, dtype=torch.int32)
        scores = torch.empty(b, n, device=dev, dtype=torch.float32)
        num_nodes = torch.empty(b, device=dev, dtype=torch.int32)
        mask = torch.empty(b, n, w, device=dev, dtype=torch.int32)
        _C.build_tree(topk_tokens=tt.data_ptr(), topk_logprobs=tl.data_ptr(),
                      root_tokens=root.data_ptr(), tokens=tokens.data_ptr(),
                      parents=parents.data_ptr(), depths=depths.data_ptr(),
                      scores=scores.data_ptr(), num_nodes=num_nodes.data_ptr(),
                      mask=mask.data_ptr(),
                      batch=b, depth=d, k=k, budget=n, words=w,
                      algorithm=ext.enum("TreeAlgorithm")[algorithm], stream=ext.stream())
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
