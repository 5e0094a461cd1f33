"""Tree and Verdict types, and converters to other engines' tree formats.

A :class:`Tree` is a batch of draft trees of fixed capacity ``N`` (= budget); see DESIGN.md
section 3 for the fields. The converters run on whatever device the tree is on and are meant
for interop and debugging, not for the decoding hot path.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

import torch

from . import checks

__all__ = ["Tree", "Verdict", "Commit", "mask_words"]


def mask_words(n: int) -> int:
    """Number of int32 words per mask row for ``n`` nodes."""
    return (n + 31) // 32


def _unpack_bits(mask: torch.Tensor, n: int) -> torch.Tensor:
    """int32 ``[..., W]`` words -> bool ``[..., n]`` (bit j % 32 of word j // 32)."""
    bits = torch.arange(32, device=mask.device, dtype=torch.int64)
    words = mask.to(torch.int64) & 0xFFFFFFFF
    dense = ((words.unsqueeze(-1) >> bits) & 1).bool()
    return dense.flatten(-2)[..., :n]


@dataclass
class Tree:
    """A batch of draft trees.

    Attributes
    ----------
    tokens : int32 [B, N]     token of each node; node 0 is the root (the anchor)
    parents : int32 [B, N]    parent index, -1 for the root and padding
    depths : int32 [B, N]     root 0, padding -1
    scores : float32 [B, N]   cumulative draft log-prob, padding -inf
    num_nodes : int32 [B]     valid nodes per tree
    mask : int32 [B, N, W]    packed ancestor-or-self bits, W = ceil(N / 32)
    max_depth : int           static bound on the depth (verification output width - 1)
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    scores: torch.Tensor
    num_nodes: torch.Tensor
    mask: torch.Tensor
    max_depth: int

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def capacity(self) -> int:
        return self.tokens.shape[1]

    def _check_prefix_lens(self, prefix_lens, device=None) -> None:
        """``prefix_lens``: int32/int64 [B], one per tree (never broadcast from fewer)."""
        checks.tensor("prefix_lens", prefix_lens, dtypes=(torch.int32, torch.int64), shape=[self.batch_size],
                 device=device, last_contiguous=False)

    def positions(self, prefix_lens: torch.Tensor) -> torch.Tensor:
        """int32 [B, N] positions ``prefix_lens[b] + depths[b, i]`` (padding rows at the prefix).

        ``prefix_lens``: int32/int64 [B] on the tree's device, >= 0, and small enough that every
        position fits in int32.
        """
        self._check_prefix_lens(prefix_lens, self.tokens.device)
        checks.value_range("prefix_lens", prefix_lens, 0, checks.INT32_MAX - max(self.capacity - 1, 0))
        return (prefix_lens.to(torch.int32)[:, None] + self.depths.clamp_min(0)).to(torch.int32)

    def dense_mask(self) -> torch.Tensor:
        """bool [B, N, N]: entry (i, j) is True iff node j is node i or one of its ancestors."""
        return _unpack_bits(self.mask, self.capacity)

    def to_flashinfer_mask(self, prefix_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """FlashInfer's packed custom mask for batch prefill over prefix + tree.

        Request b has ``qo_len = N`` rows and ``kv_len = prefix_lens[b] + N`` columns; its
        row-major bool matrix (prefix all visible, tree part = :meth:`dense_mask`) is packed
        little-endian within bytes and padded to a whole byte. ``prefix_lens``: int32/int64 [B],
        >= 0, on any device (it is read on the host).

        Returns
        -------
        packed : uint8 [sum_b ceil(N * kv_len_b / 8)]
        indptr : int32 [B + 1]   byte offset of each request's segment
        """
        self._check_prefix_lens(prefix_lens)
        lens = prefix_lens.tolist()
        if lens and min(lens) < 0:
            raise ValueError(f"prefix_lens must be >= 0, got min {min(lens)}")
        n = self.capacity
        dense = self.dense_mask()
        segments, sizes = [], []
        weights = (2 ** torch.arange(8, device=dense.device)).to(torch.uint8)
        for b, plen in enumerate(lens):
            full = torch.cat([torch.ones(n, plen, dtype=torch.bool, device=dense.device), dense[b]], 1)
            flat = full.flatten()
            pad = (-flat.numel()) % 8
            flat = torch.cat([flat, flat.new_zeros(pad)]).view(-1, 8).to(torch.uint8)
            segments.append((flat * weights).sum(1, dtype=torch.uint8))
            sizes.append(segments[-1].numel())
        indptr = torch.tensor([0] + sizes, device=dense.device).cumsum(0).to(torch.int32)
        packed = torch.cat(segments) if segments else weights.new_empty(0)
        return packed, indptr

    def to_sglang(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """SGLang's ``retrive_index, retrive_next_token, retrive_next_sibling`` (int64 [B, N]).

        ``retrive_index[b, i] = b * N + i`` for valid nodes; ``next_token`` is the lowest-index
        child, ``next_sibling`` the next higher-index node with the same parent; -1 for none and
        for padding rows.
        """
        b_sz, n = self.tokens.shape
        dev = self.tokens.device
        idx = torch.arange(n, device=dev)
        valid = idx[None, :] < self.num_nodes[:, None].to(torch.int64)
        parents = self.parents.to(torch.int64)
        is_child = (parents[:, None, :] == idx[None, :, None]) & valid[:, None, :]   # [B, p, c]
        none = torch.full((b_sz, n, n), n, device=dev, dtype=torch.int64)
        first_child = torch.where(is_child, idx[None, None, :], none).min(-1).values
        same_parent = (parents[:, :, None] == parents[:, None, :]) & valid[:, None, :] & \
            (idx[None, None, :] > idx[None, :, None]) & (parents[:, :, None] >= 0)    # [B, i, j]
        next_sib = torch.where(same_parent, idx[None, None, :], none).min(-1).values
        neg = torch.full_like(first_child, -1)
        next_token = torch.where((first_child < n) & valid, first_child, neg)
        next_sibling = torch.where((next_sib < n) & valid, next_sib, neg)
        index = torch.where(valid, torch.arange(b_sz, device=dev)[:, None] * n + idx[None, :], neg)
        return index, next_token, next_sibling

    def to_sglang_bitpacked(self) -> torch.Tensor:
        """SGLang's ``QLEN_ONLY_BITPACKING`` rows for N <= 32: [B * N] of uint8 (N <= 8),
        int16 (N <= 16) or int32, bit j of row i set iff node j is i or an ancestor of i."""
        n = self.capacity
        if n > 32:
            raise ValueError(f"QLEN_ONLY_BITPACKING needs a tree capacity <= 32, got {n}")
        rows = self.mask[..., 0].reshape(-1)
        if n <= 8:
            return rows.to(torch.uint8)
        if n <= 16:
            return (rows & 0xFFFF).to(torch.int32).to(torch.int16)
        return rows

    def pretty(self, b: int | None = None, decode: Optional[Callable[[int], str]] = None) -> str:
        """A readable drawing of tree ``b`` (every tree when None); ``decode`` maps token -> text."""
        if b is not None:
            checks.integer("b", b, lo=0, hi=self.batch_size - 1)
        if decode is not None and not callable(decode):
            raise TypeError(f"decode must be callable (token id -> str), got {type(decode).__name__}")
        batches = range(self.batch_size) if b is None else [b]
        tok = self.tokens.cpu().tolist()
        par = self.parents.cpu().tolist()
        dep = self.depths.cpu().tolist()
        sco = self.scores.float().cpu().tolist()
        num = self.num_nodes.cpu().tolist()
        lines = []
        for bb in batches:
            n = num[bb]
            depth = max(dep[bb][:n]) if n else 0
            lines.append(f"tree {bb}: {n} nodes (capacity {self.capacity}), depth {depth}")
            children: dict[int, list[int]] = {}
            for i in range(1, n):
                children.setdefault(par[bb][i], []).append(i)

            def label(i: int) -> str:
                t = tok[bb][i]
                text = f" {decode(t)!r}" if decode is not None else ""
                return f"[{i}] tok {t}{text}  logp {sco[bb][i]:.3f}"

            stack = [(0, "", True, True)]
            while stack:
                i, indent, last, root = stack.pop()
                lines.append(label(i) if root else f"{indent}{'└─ ' if last else '├─ '}{label(i)}")
                kids = children.get(i, [])
                sub = "" if root else indent + ("   " if last else "│  ")
                for k, c in reversed(list(enumerate(kids))):
                    stack.append((c, sub, k == len(kids) - 1, False))
        return "\n".join(lines)


class Verdict(NamedTuple):
    """Result of :func:`jetspec_kernels.verify_tree`.

    accept_len : int32 [B]            draft tokens accepted (root excluded)
    path : int32 [B, max_depth + 1]   accepted node indices, root first, -1 padded
    bonus : int32 [B]                 the target's token after the accepted path
    emitted : int32 [B, max_depth + 1] accepted tokens then the bonus, -1 padded
    """

    accept_len: torch.Tensor
    path: torch.Tensor
    bonus: torch.Tensor
    emitted: torch.Tensor


class Commit(NamedTuple):
    """Result of :func:`jetspec_kernels.commit_kv`.

    prefix_lens : int32 [B]                    new prefix lengths (prefix + accept_len + 1)
    hidden : [B, max_depth + 1, Hh] or None    rows of ``hidden`` along the path, zero after it
    """

    prefix_lens: torch.Tensor
    hidden: Optional[torch.Tensor]
