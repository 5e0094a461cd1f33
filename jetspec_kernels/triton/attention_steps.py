"""The Triton attention kernels' shared steps: where a key's K and V rows are (contiguous or paged
caches), one online-softmax update over a block of keys, and the combine of split-KV partials. ``tree_attention`` and the exact
mode's ``exact_attention`` both run them, so a block is the same arithmetic in either."""
from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["LOG2E", "LN2", "kv_offsets", "attend_block", "merge_splits"]

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


@triton.jit
def merge_splits(part_o_ptr, part_lse_ptr, out_ptr, lse_ptr, r, mine, splits, rows, max_splits, N,
                 HQ, o_batch_stride, o_row_stride, o_head_stride, lse_batch_stride,
                 lse_head_stride, lse_row_stride, HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr,
                 STORE_LSE: tl.constexpr):
    """Rows ``r = (b * N + i) * HQ + head`` where ``mine``: their first ``splits`` partials
    (normalised output, base-2 LSE; ``[S, rows]``) combined in split order into ``out`` and
    natural-log ``lse``. ``splits``: one count for all rows, or each row's own (a row's result
    then does not depend on ``max_splits``, the loop's bound)."""
    offs_d = tl.arange(0, HEAD_DIM)
    acc = tl.zeros([BLOCK_R, HEAD_DIM], dtype=tl.float32)
    m = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    w_sum = tl.zeros([BLOCK_R], dtype=tl.float32)
    for s in range(0, max_splits):
        take = mine & (s < splits)
        row = r.to(tl.int64) + s * rows
        lse_s = tl.load(part_lse_ptr + row, mask=take, other=float("-inf"))
        o_s = tl.load(part_o_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], mask=take[:, None],
                      other=0.0)
        m_new = tl.maximum(m, lse_s)
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_sub)
        w = tl.exp2(lse_s - m_sub)
        acc = tl.where(take[:, None], acc * alpha[:, None] + w[:, None] * o_s, acc)
        w_sum = tl.where(take, w_sum * alpha + w, w_sum)
        m = tl.where(take, m_new, m)
    no_key = w_sum == 0.0       # NaN (a split's NaN lse) stays NaN
    o = tl.where(no_key[:, None], 0.0, acc / tl.where(no_key, 1.0, w_sum)[:, None])
    head = r % HQ
    row_i = (r // HQ) % N
    b = r // (HQ * N)
    o_off = (b.to(tl.int64) * o_batch_stride + row_i.to(tl.int64) * o_row_stride
             + head.to(tl.int64) * o_head_stride)
    tl.store(out_ptr + o_off[:, None] + offs_d[None, :], o.to(out_ptr.dtype.element_ty),
             mask=mine[:, None])
    if STORE_LSE:
        lse2 = tl.where(no_key, float("-inf"), m + tl.log2(tl.where(no_key, 1.0, w_sum)))
        l_off = b.to(tl.int64) * lse_batch_stride + head.to(tl.int64) * lse_head_stride \
            + row_i.to(tl.int64) * lse_row_stride
        tl.store(lse_ptr + l_off, lse2 * LN2, mask=mine)
