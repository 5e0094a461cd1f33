"""cuda backend: build_tree (one CTA per sequence)."""
from __future__ import annotations

import torch

from .. import checks
from ..tree import mask_words
from . import extension as ext
from .custom_op import custom_op

_TREE_OUTPUTS = (torch.int32, torch.int32, torch.int32, torch.float32)  # tokens parents depths scores


def launch(topk_tokens: int, topk_logprobs: int, root_tokens, batch: int, depth: int, k: int,
           budget: int, algorithm: str):
    """Queue the kernel on the current stream (inside :data:`ext.on_device`) on per-depth top-K at
    device addresses ``topk_tokens`` (int32 [B, D, K], contiguous) and ``topk_logprobs``
    (float32, the same); ``root_tokens`` int32 [B] contiguous. Returns the outputs it fills:
    (tokens, parents, depths, scores, num_nodes, mask)."""
    dev = root_tokens.device
    w = mask_words(budget)
    tokens, parents, depths, scores = (torch.empty(batch, budget, device=dev, dtype=t)
                                       for t in _TREE_OUTPUTS)
    num_nodes = torch.empty(batch, device=dev, dtype=torch.int32)
    mask = torch.empty(batch, budget, w, device=dev, dtype=torch.int32)
    ext.module().build_tree(
        topk_tokens=topk_tokens, topk_logprobs=topk_logprobs, root_tokens=root_tokens.data_ptr(),
        tokens=tokens.data_ptr(), parents=parents.data_ptr(), depths=depths.data_ptr(),
        scores=scores.data_ptr(), num_nodes=num_nodes.data_ptr(), mask=mask.data_ptr(),
        batch=batch, depth=depth, k=k, budget=budget, words=w,
        algorithm=ext.enum("TreeAlgorithm")[algorithm], stream=ext.stream())
    return tokens, parents, depths, scores, num_nodes, mask


def fake_outputs(like, batch: int, budget: int):
    """Empty tensors shaped as :func:`launch`'s outputs, on ``like``'s device (fake kernels)."""
    i32 = dict(dtype=torch.int32)
    return (*(like.new_empty(batch, budget, dtype=t) for t in _TREE_OUTPUTS),
            like.new_empty(batch, **i32), like.new_empty(batch, budget, mask_words(budget), **i32))


@custom_op("jetspec::build_tree", mutates_args=())
def _build_tree(topk_tokens: torch.Tensor, topk_logprobs: torch.Tensor, root_tokens: torch.Tensor,
                budget: int, algorithm: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                      torch.Tensor, torch.Tensor, torch.Tensor]:
    with ext.on_device(topk_tokens.device):
        tt = checks.as_dtype(topk_tokens, torch.int32).contiguous()
        tl = checks.as_dtype(topk_logprobs, torch.float32).contiguous()
        root = checks.as_dtype(root_tokens, torch.int32).contiguous()
        return launch(tt.data_ptr(), tl.data_ptr(), root, *tt.shape, budget, algorithm)


@_build_tree.register_fake
def _(topk_tokens, topk_logprobs, root_tokens, budget, algorithm):
    return fake_outputs(topk_tokens, topk_tokens.shape[0], budget)


def build_tree(topk_tokens, topk_logprobs, root_tokens, budget, algorithm):
    """Per-depth top-K [B, D, K] -> (tokens, parents, depths, scores, num_nodes, mask).

    Bit-exact with python_ref.build_tree given log-probs sorted descending along K.
    """
    return _build_tree(topk_tokens, topk_logprobs, root_tokens, int(budget), algorithm)
