"""cuda backend: draft_tree, the chain log_softmax_topk -> build_tree as one custom op.

The same two kernels as the two functions, queued back to back: one device guard, one eager
fast-path test and one backend choice a call instead of two, and the top-K (which the caller
never sees) with the top-K kernel's scratch space in one allocation instead of three: less
host time per eager call.
"""
from __future__ import annotations

import torch

from .. import checks
from . import extension as ext
from .build_tree import fake_outputs
from .build_tree import launch as launch_tree
from .log_softmax_topk import launch as launch_topk
from .log_softmax_topk import workspace_bytes
from .custom_op import custom_op


@custom_op("jetspec::draft_tree", mutates_args=())
def _draft_tree(logits: torch.Tensor, k: int, root_tokens: torch.Tensor, budget: int,
                algorithm: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                         torch.Tensor, torch.Tensor]:
    with ext.on_device(logits.device):
        b, d, _ = logits.shape
        _scratch, (tokens, logprobs, workspace) = ext.workspaces(
            logits.device, 4 * b * d * k, 4 * b * d * k, workspace_bytes(logits, k))
        launch_topk(logits, k, tokens, logprobs, workspace)
        root = checks.as_dtype(root_tokens, torch.int32).contiguous()
        return launch_tree(tokens, logprobs, root, b, d, k, budget, algorithm)


@_draft_tree.register_fake
def _(logits, k, root_tokens, budget, algorithm):
    return fake_outputs(logits, logits.shape[0], budget)


def draft_tree(logits, k, root_tokens, budget, algorithm):
    """logits float [B, D, V] -> build_tree's outputs on its per-depth top-K (tokens, parents,
    depths, scores, num_nodes, mask): ``build_tree(*log_softmax_topk(logits, k), root_tokens,
    budget, algorithm)``, bit for bit."""
    return _draft_tree(logits, int(k), root_tokens, int(budget), algorithm)
