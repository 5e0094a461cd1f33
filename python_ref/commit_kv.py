"""Reference KV commit: compact the accepted path's K/V and gather its hidden rows."""

import torch

from ._common import cache_location

__all__ = ["commit_kv"]


def commit_kv(k_cache, v_cache, prefix_lens, path, accept_len, block_table=None, hidden=None):
    """Move the accepted nodes' K/V to contiguous positions, in place.

    Parameters
    ----------
    k_cache, v_cache : ``[B, L_max, Hkv, Dh]`` or paged ``[num_pages, page_size, Hkv, Dh]``
    prefix_lens : int ``[B]``
    path : int32 ``[B, max_depth + 1]`` (root first, increasing, -1 padded; ``path[b, i] >= i``)
    accept_len : int32 ``[B]``
    block_table : int32 ``[B, max_pages]`` or None
    hidden : ``[B, N, Hh]`` or None (per-tree-node hidden states)

    Returns
    -------
    new_prefix_lens : int32 ``[B]`` = ``prefix_lens + accept_len + 1``
    hidden_rows : ``[B, max_depth + 1, Hh]`` in ``hidden``'s dtype (or None):
        ``hidden_rows[b, i] = hidden[b, path[b, i]]`` for ``i <= accept_len[b]``, zero after.

    For ``i = 0..accept_len[b]`` in increasing order, slot ``prefix_lens[b] + path[b, i]`` is
    copied to slot ``prefix_lens[b] + i``. Increasing order is overlap-safe: a later source
    ``path[j] >= j > i`` is never a slot already written. Other slots are left unchanged.
    """
    B, C = path.shape
    page_size = k_cache.shape[1]
    pre = prefix_lens.detach().cpu().tolist()
    pth = path.detach().cpu().tolist()
    acc = accept_len.detach().cpu().tolist()
    for b in range(B):
        for i in range(acc[b] + 1):
            src = cache_location(pre[b] + pth[b][i], b, block_table, page_size)
            dst = cache_location(pre[b] + i, b, block_table, page_size)
            if src != dst:
                k_cache[dst] = k_cache[src].clone()
                v_cache[dst] = v_cache[src].clone()
    new_prefix = (prefix_lens.to(torch.int64) + accept_len.to(torch.int64) + 1).to(torch.int32)

    hidden_rows = None
    if hidden is not None:
        hidden_rows = torch.zeros(B, C, hidden.shape[-1], dtype=hidden.dtype, device=hidden.device)
        for b in range(B):
            for i in range(acc[b] + 1):
                hidden_rows[b, i] = hidden[b, pth[b][i]]
    return new_prefix, hidden_rows
