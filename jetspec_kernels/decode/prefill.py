"""Prefill, shared by both loops: prompts to tensors, the prompt forward, the first new token."""
from __future__ import annotations

import torch

from ..ops.verify_tree import verify_tree
from ..tree import Tree
from .arguments import Sampling
from .output import TokenBuffer

__all__ = ["pad_prompts", "next_token", "prefill"]


def pad_prompts(prompt_ids, device):
    """int64 [B, T] right-padded with 0, and int32 [B] lengths (``prompt_ids`` already checked)."""
    lens = [len(p) for p in prompt_ids]
    tokens = torch.zeros(len(prompt_ids), max(lens), dtype=torch.int64)
    for b, p in enumerate(prompt_ids):
        tokens[b, :len(p)] = torch.as_tensor(p, dtype=torch.int64)
    return tokens.to(device), torch.tensor(lens, dtype=torch.int32, device=device)


def _root_tree(tokens: torch.Tensor) -> Tree:
    """A batch of one-node trees (just the root); verifying it samples one token per sequence."""
    b, dev = tokens.shape[0], tokens.device
    i32 = torch.int32
    return Tree(tokens=tokens.to(i32)[:, None].contiguous(),
                parents=torch.full((b, 1), -1, dtype=i32, device=dev),
                depths=torch.zeros(b, 1, dtype=i32, device=dev),
                scores=torch.zeros(b, 1, dtype=torch.float32, device=dev),
                num_nodes=torch.ones(b, dtype=i32, device=dev),
                mask=torch.ones(b, 1, 1, dtype=i32, device=dev), max_depth=0)


def next_token(logits, sampling: Sampling, seed, offset):
    """int32 [B]: argmax of logits [B, V] (ties to the lower id), or a (filtered) sample drawn with
    the same keyed Gumbel noise as :func:`verify_tree` (node 0 of a one-node tree)."""
    if sampling.greedy:
        return torch.argmax(logits, dim=-1).to(torch.int32)
    tree = _root_tree(torch.zeros(logits.shape[0], dtype=torch.int32, device=logits.device))
    return verify_tree(tree, logits[:, None, :], seed=seed, offset=offset, **sampling.kwargs()).bonus


def prefill(target, tokens, lens, cache, sampling: Sampling, seed, out: TokenBuffer, taps=()):
    """Run the prompts (int64 [B, T], lengths int32 [B]) through ``target``, writing their K/V into
    ``cache``; draw the first new token (sample offset 0) and emit it into ``out``.

    Returns ``(token int32 [B], the tapped hidden states of ``taps`` or None)``."""
    logits, tapped = target.prefill(tokens, lens, cache, taps=taps)
    token = next_token(logits, sampling, seed, torch.zeros_like(seed))
    out.emit(token[:, None], torch.ones_like(lens))
    return token, tapped
