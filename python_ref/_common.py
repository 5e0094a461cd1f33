"""Small helpers shared by the reference implementations (not part of the public API)."""

import torch


def compute_dtype(*tensors):
    """float64 if any given tensor is float64, else float32 (the python_ref convention)."""
    for t in tensors:
        if t is not None and torch.is_tensor(t) and t.dtype == torch.float64:
            return torch.float64
    return torch.float32


def cache_location(p, b, block_table, page_size):
    """Map logical position ``p`` of sequence ``b`` to (first index, second index) in a cache.

    Contiguous caches ``[B, L_max, H, D]`` -> ``(b, p)``;
    paged caches ``[num_pages, page_size, H, D]`` -> ``(block_table[b, p // page_size], p % page_size)``.
    """
    if block_table is None:
        return b, p
    return int(block_table[b, p // page_size]), p % page_size


def cache_indices(slots, block_table, page_size):
    """Vectorised :func:`cache_location`: int64 ``slots [B, N]`` -> index tensors (i0, i1) ``[B, N]``."""
    B = slots.shape[0]
    if block_table is None:
        return torch.arange(B, device=slots.device)[:, None].expand_as(slots), slots
    return block_table.to(torch.long).gather(1, slots // page_size), slots % page_size
