"""Reference pack_mask: a tree's ancestor-or-self mask, dense and bit-packed, and back."""

import torch

__all__ = ["pack_mask", "unpack_mask", "dense_mask", "ancestors"]


def ancestors(parents_row, i):
    """Node ``i`` and its ancestors (``[i, parent(i), ..., 0]``) from one row of ``parents``."""
    p = parents_row.tolist() if torch.is_tensor(parents_row) else list(parents_row)
    out = [i]
    j = int(p[i])
    while j >= 0:
        out.append(j)
        j = int(p[j])
    return out


def dense_mask(parents, num_nodes):
    """Dense ancestor-or-self mask.

    Parameters
    ----------
    parents : int ``[B, N]``; num_nodes : int ``[B]``

    Returns
    -------
    bool ``[B, N, N]``: ``[b, i, j]`` is True iff j == i or (i < num_nodes[b] and j is an
    ancestor of i). Padding rows have only their own entry.
    """
    B, N = parents.shape
    par = parents.detach().cpu().tolist()
    nn_ = num_nodes.detach().cpu().tolist()
    out = [[[False] * N for _ in range(N)] for _ in range(B)]
    for b in range(B):
        for i in range(N):
            for j in (ancestors(par[b], i) if i < nn_[b] else [i]):
                out[b][i][j] = True
    return torch.tensor(out, dtype=torch.bool).reshape(B, N, N).to(parents.device)


def _pack_dense(dense):
    """bool ``[B, N, N']`` -> int32 ``[B, N, ceil(N'/32)]`` (bit j%32 of word j//32)."""
    B, N, M = dense.shape
    W = (M + 31) // 32
    d = torch.zeros(B, N, W * 32, dtype=torch.int64)
    d[:, :, :M] = dense.detach().cpu()
    words = (d.view(B, N, W, 32) << torch.arange(32)).sum(-1)     # bit j % 32 of word j // 32
    # two's complement: bit 31 makes the int32 word negative
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words)
    return words.to(torch.int32).to(dense.device)


def pack_mask(parents, num_nodes):
    """Bit-packed ancestor-or-self mask.

    Parameters
    ----------
    parents : int ``[B, N]`` (``-1`` for root / padding); num_nodes : int ``[B]``

    Returns
    -------
    int32 ``[B, N, W]``, ``W = ceil(N / 32)``: bit ``j % 32`` of ``mask[b, i, j // 32]`` is set
    iff j == i or j is an ancestor of i; a padding row (``i >= num_nodes[b]``) has only its own bit.
    """
    return _pack_dense(dense_mask(parents, num_nodes))


def unpack_mask(mask, n=None):
    """int32 ``[B, N, W]`` packed mask -> bool ``[B, N, n]`` (``n`` defaults to ``N``)."""
    B, N, W = mask.shape
    n = N if n is None else n
    m = mask.detach().cpu().to(torch.int64) & 0xFFFFFFFF
    j = torch.arange(n)
    return ((m[:, :, j // 32] >> (j % 32)) & 1).bool().to(mask.device)
