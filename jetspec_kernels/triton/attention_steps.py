"""The Triton attention kernels' shared steps: where a key's K and V rows are (contiguous or paged
caches), and one online-softmax update over a block of keys. ``tree_attention`` and the exact
mode's ``exact_attention`` both run them, so a block is the same arithmetic in either."""
from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["LOG2E", "LN2", "kv_offsets", "attend_block"]

LOG2E = 1.4426950408889634
LN2 = tl.constexpr(0.6931471805599453)   # natural-log LSE = base-2 LSE * ln 2


@triton.jit
def kv_offsets(pos, valid, b, kv_head, bt_ptr, block_table_batch_stride, page_size,
               k_batch_stride, k_row_stride, k_head_stride,
               v_batch_stride, v_row_stride, v_head_stride,
               PAGED: tl.constexpr, SAME_KV_STRIDES: tl.constexpr):
    """Element offsets of the key rows and of the value rows at logical positions ``pos`` of
    sequence ``b`` (V's strides may differ from K's, e.g. V rows padded wider). A cache's batch
    stride is its dim 0's: the sequence's, or the page's when paged."""
    if PAGED:
        c0 = tl.load(bt_ptr + b * block_table_batch_stride + pos // page_size, mask=valid,
                     other=0).to(tl.int64)
        c1 = (pos % page_size).to(tl.int64)
    else:
        c0 = b.to(tl.int64)
        c1 = pos.to(tl.int64)
    k_off = c0 * k_batch_stride + c1 * k_row_stride + kv_head * k_head_stride
    if SAME_KV_STRIDES:     # the usual layouts: no second offset vector kept live
        return k_off, k_off
    v_off = c0 * v_batch_stride + c1 * v_row_stride + kv_head * v_head_stride
    return k_off, v_off


@triton.jit
def attend_block(acc, m_i, l_i, q, k_ptr, v_ptr, k_off, v_off, key_ok, visible, offs_d,
                 qk_scale_log2, INPUT_PRECISION: tl.constexpr):
    """One online-softmax step over a block of keys; ``visible`` is [BLOCK_M, BLOCK_N] bool."""
    k = tl.load(k_ptr + k_off[:, None] + offs_d[None, :], mask=key_ok[:, None], other=0.0)
    v = tl.load(v_ptr + v_off[:, None] + offs_d[None, :], mask=key_ok[:, None], other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * qk_scale_log2
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # A row that has seen no visible key yet keeps m = -inf; subtract 0 instead to avoid inf - inf.
    m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_sub)
    p = tl.exp2(s - m_sub[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=INPUT_PRECISION)
    return acc, m_new, l_i
