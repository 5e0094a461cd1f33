"""Triton kernels for ``commit_kv``: compact the accepted path's K/V in place, gather hidden rows.

Overlap safety of the in-place move (slot ``p + path[i]`` -> slot ``p + i`` for ``i <= a``,
with ``path`` increasing, so ``path[i] >= i``). Programs split the work by (sequence, kv-head
block); they touch disjoint elements, so only the order inside one program matters. Each program
walks ``i = 0, 1, ..., a`` in increasing order, and its source and destination tiles use the same
index tensors (they differ by a scalar slot offset), so every element ``(h, d)`` is loaded and
stored by the same thread in program order.
- No read after write: at step ``i`` the source slot ``p + path[i] >= p + i`` lies above every
  slot written so far (``p + j``, ``j < i``), so no source was overwritten before it is read.
- Write after read: slot ``p + j`` may be the source of an earlier step ``i < j``
  (``path[i] == j``); step ``j``'s store follows step ``i``'s load (and its store, which consumes
  the loaded value) in program order, so the old value was already taken.
Paged caches: one sequence's logical slots map to distinct physical slots, so the same holds.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["commit_kv"]


@triton.jit
def _commit_kv_kernel(
    kc_ptr, vc_ptr, pre_ptr, path_ptr, acc_ptr, bt_ptr, new_ptr,
    HKV, page_size,
    k_cache_batch_stride, k_cache_row_stride, k_cache_head_stride,
    v_cache_batch_stride, v_cache_row_stride, v_cache_head_stride,
    path_batch_stride, block_table_batch_stride,
    DH: tl.constexpr, BD: tl.constexpr, BH: tl.constexpr, PAGED: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    hb = tl.program_id(1)
    pre = tl.load(pre_ptr + b).to(tl.int64)
    acc = tl.load(acc_ptr + b)
    if hb == 0:
        tl.store(new_ptr + b, (pre + acc + 1).to(tl.int32))

    h = hb * BH + tl.arange(0, BH)[:, None]
    d = tl.arange(0, BD)[None, :]
    tile_mask = (h < HKV) & (d < DH)
    k_off = h * k_cache_head_stride + d
    v_off = h * v_cache_head_stride + d
    for i in range(0, acc + 1):
        src = tl.load(path_ptr + b * path_batch_stride + i).to(tl.int64)
        ps = pre + src
        pd = pre + i
        if PAGED:
            s0 = tl.load(bt_ptr + b * block_table_batch_stride + ps // page_size).to(tl.int64)
            s1 = ps % page_size
            d0 = tl.load(bt_ptr + b * block_table_batch_stride + pd // page_size).to(tl.int64)
            d1 = pd % page_size
        else:
            s0 = b
            s1 = ps
            d0 = b
            d1 = pd
        # a node already in place needs no copy; the compare is made full-shape because the
        # interpreter types (bool tile & bool scalar) as int32, which tl.load rejects as a mask
        m = tile_mask & (tl.zeros([BH, BD], tl.int64) + src != i)
        kt = tl.load(kc_ptr + s0 * k_cache_batch_stride + s1 * k_cache_row_stride + k_off, mask=m)
        vt = tl.load(vc_ptr + s0 * v_cache_batch_stride + s1 * v_cache_row_stride + v_off, mask=m)
        tl.store(kc_ptr + d0 * k_cache_batch_stride + d1 * k_cache_row_stride + k_off, kt, mask=m)
        tl.store(vc_ptr + d0 * v_cache_batch_stride + d1 * v_cache_row_stride + v_off, vt, mask=m)


@triton.jit
def _gather_hidden_kernel(hid_ptr, path_ptr, acc_ptr, out_ptr, HH,
                          hidden_batch_stride, hidden_row_stride, path_batch_stride,
                          out_batch_stride, out_row_stride, BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1)
    acc = tl.load(acc_ptr + b)
    live = i <= acc
    row = tl.load(path_ptr + b * path_batch_stride + i, mask=live, other=0).to(tl.int64)
    for h0 in range(0, HH, BLOCK):
        h = h0 + tl.arange(0, BLOCK)
        # rows after accept_len read nothing and store zeros (full-shape mask: see above)
        x = tl.load(hid_ptr + b * hidden_batch_stride + row * hidden_row_stride + h,
                    mask=(h < HH) & (h * 0 + i <= acc), other=0.0)
        tl.store(out_ptr + b * out_batch_stride + i * out_row_stride + h, x, mask=h < HH)


def launch(k_cache, v_cache, prefix_lens, path, accept_len, block_table, hidden, new_lens,
           hidden_rows):
    """Run the kernels, writing ``new_lens`` (int32 ``[B]``) and, when ``hidden`` is given,
    ``hidden_rows`` (``[B, M, Hh]``, last dim contiguous); the caches are updated in place."""
    B, M = path.shape
    if B == 0:
        return
    HKV, DH = k_cache.shape[2], k_cache.shape[3]
    bd = triton.next_power_of_2(DH)
    bh = min(triton.next_power_of_2(max(HKV, 1)), max(1, 4096 // bd))
    paged = block_table is not None
    bt = block_table if paged else path           # dummy pointer, never read when not paged
    _commit_kv_kernel[(B, max(1, triton.cdiv(HKV, bh)))](
        k_cache, v_cache, prefix_lens, path, accept_len, bt, new_lens,
        HKV, k_cache.shape[1],
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        path.stride(0), bt.stride(0) if paged else 0,
        DH=DH, BD=bd, BH=bh, PAGED=paged,
    )
    if hidden is not None:
        HH = hidden.shape[2]
        _gather_hidden_kernel[(B, M)](
            hidden, path, accept_len, hidden_rows, HH,
            hidden.stride(0), hidden.stride(1), path.stride(0),
            hidden_rows.stride(0), hidden_rows.stride(1),
            BLOCK=min(triton.next_power_of_2(max(HH, 1)), 4096),
        )


def commit_kv(k_cache, v_cache, prefix_lens, path, accept_len, block_table, hidden):
    """Move slot ``prefix_lens[b] + path[b, i]`` to ``prefix_lens[b] + i``, ``i <= accept_len[b]``.

    Parameters
    ----------
    k_cache, v_cache : ``[B, L, Hkv, Dh]`` or paged ``[P, page_size, Hkv, Dh]`` (updated in place)
    prefix_lens : int32 ``[B]``
    path : int32 ``[B, M]`` (root first, increasing, -1 padded); accept_len : int32 ``[B]``
    block_table : int32 ``[B, max_pages]`` or None
    hidden : float ``[B, N, Hh]`` or None (any strides, last dim contiguous)

    Returns
    -------
    new_prefix_lens : int32 ``[B]`` = ``prefix_lens + accept_len + 1``
    hidden_rows : hidden.dtype ``[B, M, Hh]`` (``hidden[b, path[b, i]]`` for ``i <= accept_len[b]``,
        zero after), or None when ``hidden`` is None.
    """
    B, M = path.shape
    new_lens = torch.empty(B, dtype=torch.int32, device=path.device)
    rows = None
    if hidden is not None:
        rows = torch.empty((B, M, hidden.shape[2]), dtype=hidden.dtype, device=hidden.device)
    launch(k_cache, v_cache, prefix_lens, path, accept_len, block_table, hidden, new_lens, rows)
    return new_lens, rows
