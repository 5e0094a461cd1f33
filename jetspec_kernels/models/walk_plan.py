"""The exact mode's walk plan (``triton.exact_gated_delta.walk``): the order a Gated DeltaNet
walk steps a batch of trees' nodes in, and which kept slot each step's state comes from and goes
to. Torch ops on the device, no host read (graph-capturable)."""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import checks

__all__ = ["WalkPlan", "chain_plan", "tree_plan"]


class WalkPlan(NamedTuple):
    """The order a walk steps a batch's nodes in and where each step's state comes from and goes.

    order : int32 [B, N]   step i steps node ``order[b, i]`` (the counts' valid nodes first)
    src : int32 [B, N]     step i's starting state: -1 the committed one (a root), -2 the
                           previous step's (still in registers), s >= 0 kept slot s
    dst : int32 [B, N]     the kept slot step i's state is stored into, -1 none
    num_slots : int        kept slots a sequence's v-head needs (the walk's scratch)
    """

    order: torch.Tensor
    src: torch.Tensor
    dst: torch.Tensor
    num_slots: int


def chain_plan(b, n, device) -> WalkPlan:
    """The plan of ``b`` chains of ``n`` nodes (a prompt, a commit): node i after node i - 1, the
    first from the committed state, nothing kept."""
    step = torch.arange(n, dtype=torch.int32, device=device).expand(b, n).contiguous()
    src = torch.where(step == 0, -1, -2).to(torch.int32)
    return WalkPlan(step, src, torch.full_like(step, -1), 0)


def _sum_where(mask, weights):
    """``sum_j mask[b, i, j] * weights[b, j]`` in int32 (exact; no matmul unit's rounding; N and
    its sums fit)."""
    return torch.where(mask, weights.to(torch.int32)[:, None, :], 0).sum(-1, dtype=torch.int32)


def tree_plan(parents, counts, max_depth=None) -> WalkPlan:
    """The walk's plan for forests ``parents int32 [B, N]`` (-1: a root; a parent precedes its
    child) of ``counts [B]`` nodes (None: N each): depth first, children in index order, so a
    node's first child continues from its state in registers, and only a node with two or more
    children (a branch point) keeps its state, in slot = the number of branch points above it.
    A slot is reused once its branch point's subtree is walked, so a sequence's v-head keeps at
    most ``min(max_depth, (N - 1) // 2)`` states (``max_depth``: a bound on every node's depth,
    as ``Tree.max_depth``; None: N's bound alone), not N.

    Device tensors in, device tensors out, no host read (graph-capturable); [B, N, N] bool and
    int32 temporaries (their peak ~18 bytes a B N^2). A tree too deep for ``max_depth``'s
    slots (a branch point at depth ``max_depth`` or deeper; a deeper tree whose branch points
    fit runs correctly): ``ValueError`` where value checks run (``checks.values_checked``);
    elsewhere the walk gives NaN for the nodes whose state would need a slot past the scratch
    (never another node's state)."""
    b, n = parents.shape
    bound = (n - 1) // 2
    if max_depth is not None:
        bound = min(checks.integer("max_depth", max_depth, lo=0), bound)
    dev = parents.device
    if n == 1:                          # one node a sequence (a decode step): nothing to order
        return chain_plan(b, 1, dev)
    idx = torch.arange(n, device=dev)
    valid = (idx < n if counts is None else idx < counts.long()[:, None]).expand(b, n)
    par = torch.where(valid, parents.long(), -1)
    # ancestors-or-self anc[b, v, a], by pointer doubling: log2(N) gathers of rows
    anc = torch.eye(n, dtype=torch.bool, device=dev) & valid[:, :, None]
    jump = par
    for _ in range(max(n - 1, 0).bit_length()):
        at = jump.clamp(min=0)
        anc = anc | (anc.gather(1, at[:, :, None].expand(-1, -1, n)) & (jump >= 0)[:, :, None])
        jump = torch.where(jump >= 0, jump.gather(1, at), -1)
    size = anc.sum(1, dtype=torch.int32)             # nodes in a node's subtree, itself included
    before = (par[:, :, None] == par[:, None, :]) & (idx[None, :] < idx[:, None]) \
        & valid[:, :, None] & valid[:, None, :]      # [b, a, s]: s a sibling of a before it
    # preorder rank: sum over a node's ancestors-or-self of 1 + its earlier siblings' subtrees
    pre = torch.where(valid, _sum_where(anc, _sum_where(before, size) + 1) - 1, idx)
    order = torch.empty_like(pre).scatter_(1, pre, idx.expand(b, n).contiguous())
    kids = torch.zeros(b, n + 1, dtype=torch.long, device=dev)
    kids.scatter_add_(1, par + 1, valid.long())         # column 0: roots' and padding's
    branch = kids[:, 1:] >= 2
    slot = torch.where(branch, _sum_where(anc, branch.long()) - branch.long(), -1)
    if checks.values_checked(parents) and bool((slot >= bound).any()):
        raise ValueError(f"max_depth {max_depth} is less than a tree's depth (a node at depth "
                         f"{max_depth} or deeper has children)")
    p = par.gather(1, order)
    prev = torch.cat([order.new_full((b, 1), -1), order[:, :-1]], dim=1)
    src = torch.where(p < 0, -1, torch.where(p == prev, -2, slot.gather(1, p.clamp(min=0))))
    dst = slot.gather(1, order)
    i32 = (lambda t: t.to(torch.int32).contiguous())
    return WalkPlan(i32(order), i32(src), i32(dst), max(bound, 0))
