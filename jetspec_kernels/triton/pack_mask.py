"""Triton ``pack_mask``: the bit-packed ancestor-or-self mask of trees given by parent indices.

The mask is built by an ancestor walk over tiles of rows: every row sets the bit of its current
node and steps to the parent until all rows reach the root. :func:`mask_tile` also writes the
mask of ``build_tree`` (triton/build_tree.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["pack_mask", "mask_layout", "mask_tile"]


def mask_layout(n):
    """(W, WP, ROWS): mask words, their power-of-two padding, and rows per mask tile."""
    w = triton.cdiv(n, 32)
    wp = triton.next_power_of_2(w)
    rows = max(1, min(triton.next_power_of_2(n), 4096 // wp))
    return w, wp, rows


@triton.jit
def mask_tile(par_row, num, mask_row, r0, N, W, ROWS: tl.constexpr, WP: tl.constexpr):
    """Write mask rows ``r0 .. r0+ROWS-1`` of one tree from its parents (``par_row``)."""
    rows = r0 + tl.arange(0, ROWS)
    ok = rows < N
    ww = tl.arange(0, WP)[None, :]
    words = tl.zeros([ROWS, WP], tl.int64)
    node = tl.where(ok, rows, -1)
    first = ok
    while tl.max(node, axis=0) >= 0:
        live = node >= 0
        nd = tl.maximum(node, 0)
        bit = tl.where(live, tl.full([ROWS], 1, tl.int64) << (nd % 32).to(tl.int64), 0)
        words = words | tl.where(ww == (nd // 32)[:, None], bit[:, None], 0)
        # a padding row (i >= num) stops after its own bit
        walk = live & ((rows < num) | ~first)
        nxt = tl.load(par_row + node, mask=walk, other=-1)
        node = tl.where(walk, nxt, -1)
        first = rows < 0
    # the int64 -> int32 cast keeps the low 32 bits: bit 31 becomes the sign
    tl.store(mask_row + rows[:, None].to(tl.int64) * W + ww, words.to(tl.int32),
             mask=ok[:, None] & (ww < W))


@triton.jit
def _pack_mask_kernel(par_ptr, num_ptr, mask_ptr, N, W, ROWS: tl.constexpr, WP: tl.constexpr):
    """Grid ``[B, cdiv(N, ROWS)]``: one tile of mask rows."""
    b = tl.program_id(0).to(tl.int64)
    num = tl.load(num_ptr + b)
    mask_tile(par_ptr + b * N, num, mask_ptr + b * N * W, tl.program_id(1) * ROWS, N, W,
               ROWS, WP)



def pack_mask(parents, num_nodes):
    """Bit-packed ancestor-or-self mask.

    Parameters
    ----------
    parents : int32 ``[B, N]``, ``-1`` for the root and padding, ``parents[b, i] < i``
    num_nodes : int32 ``[B]``; rows ``i >= num_nodes[b]`` get only their own bit

    Returns
    -------
    mask : int32 ``[B, N, ceil(N / 32)]``; bit ``j % 32`` of word ``j // 32`` of row i is set iff
    j is i or an ancestor of i
    """
    B, N = parents.shape
    W, WP, ROWS = mask_layout(N)
    parents = parents.contiguous()
    mask = torch.empty(B, N, W, dtype=torch.int32, device=parents.device)
    if B and N:
        _pack_mask_kernel[(B, triton.cdiv(N, ROWS))](parents, num_nodes.contiguous(), mask,
                                                     N, W, ROWS=ROWS, WP=WP, num_warps=4)
    return mask

