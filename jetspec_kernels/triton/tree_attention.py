"""Triton ``tree_attention``: GQA-packed, split-KV flash attention over a prefix plus a tree tail.

What it computes is DESIGN.md section 4: query i of sequence b sees every cached key at positions
``< prefix_lens[b]`` and the tail key ``prefix_lens[b] + j`` iff bit (i, j) of ``tree_mask[b]`` is
set (``tail="causal"``: j <= i, ``"full"``: all j, when there is no mask).

Its floor, the predictions made for it and what the H200 measured are in ``docs/perf/tree_attention.md``.

Design
------
* **GQA packing.** One program owns one kv head of one sequence and a tile of ``BLOCK_M`` packed
  rows ``f = i * G + g`` (tree row i, query head ``kv_head * G + g``, ``G = Hq / Hkv``). Each K/V
  block it loads serves all G query heads, so for ``N * G <= BLOCK_M`` (N <= 32 at G = 4 with
  BLOCK_M = 128) the prefix is read from HBM exactly once per kv head.
* **Split-KV.** The grid is ``(query tiles, B * Hkv, num_splits)``. Split s takes an equal,
  block-aligned share of the prefix ``[0, prefix_lens[b])`` (computed in the kernel from the real
  length, so ragged batches balance); the last split also takes the N tail keys. With one split the
  kernel writes ``out``/``lse`` directly; otherwise each split writes its normalised partial
  output and base-2 LSE to fp32 workspace and a second kernel merges them by log-sum-exp.
  ``num_splits`` depends on shapes only (cache capacity, B, Hkv, tiles, SM count): no host sync,
  graph-capturable. The workspace is allocated per call (a caching-allocator hit on CUDA); a
  caller-owned workspace would make capture cheaper and is left for later.
* **Tail.** Bits are tested straight from the packed int32 words (``(word >> (j % 32)) & 1``; the
  arithmetic shift of a negative word is harmless after ``& 1``). Causal tails stop at the tile's
  last row; tree masks are honoured for any bit pattern.
* **Numerics.** fp32 online softmax in base 2 (``log2(e)`` folded into the scale), ``tl.dot`` with
  fp32 accumulation (IEEE fp32 for fp32 inputs, never tf32), P cast to the input dtype for the PV
  product as in FlashAttention. A row with no visible key (or only -inf scores: its sum
  ``l`` is 0) gets ``out = 0`` and ``lse = -inf`` (guarded, never NaN), like python_ref; a NaN or
  +inf score leaves ``l`` NaN (``exp2(NaN)``, ``exp2(inf - inf)``), so out and lse are NaN on
  every path, whatever ``tl.maximum`` does with NaN (NaN-ignoring on a GPU).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import launch_plan
from .attention_steps import LN2, LOG2E, attend_block, kv_offsets, merge_splits
from .sizes import cdiv, next_power_of_2

__all__ = ["tree_attention", "launch_tree_attention"]


@triton.jit
def _tree_attention_fwd(
    q_ptr, k_ptr, v_ptr, prefix_ptr, mask_ptr, bt_ptr, out_ptr, lse_ptr, part_o_ptr, part_lse_ptr,
    q_batch_stride, q_row_stride, q_head_stride,
    k_batch_stride, k_row_stride, k_head_stride,
    v_batch_stride, v_row_stride, v_head_stride,
    mask_batch_stride, mask_row_stride,
    block_table_batch_stride, page_size,
    o_batch_stride, o_row_stride, o_head_stride,
    lse_batch_stride, lse_head_stride, lse_row_stride,
    B, N, HQ, HKV, G, num_splits, qk_scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TAIL_N: tl.constexpr,
    PAGED: tl.constexpr, SAME_KV_STRIDES: tl.constexpr, TAIL_MODE: tl.constexpr,
    SPLIT: tl.constexpr, STORE_LSE: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    """One (query tile, sequence x kv head, split) program. TAIL_MODE: 0 tree mask, 1 causal, 2 full."""
    tile = tl.program_id(0)
    bh = tl.program_id(1)
    split = tl.program_id(2)
    b = bh // HKV
    kv_head = bh % HKV

    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)      # packed row f = i * G + g
    row_ok = offs_m < N * G
    row_i = offs_m // G
    head = kv_head * G + offs_m % G
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)

    q_off = (b.to(tl.int64) * q_batch_stride + row_i.to(tl.int64) * q_row_stride
             + head.to(tl.int64) * q_head_stride)
    q = tl.load(q_ptr + q_off[:, None] + offs_d[None, :], mask=row_ok[:, None], other=0.0)

    prefix = tl.load(prefix_ptr + b)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)

    # This split's share of the prefix: equal block-aligned chunks of the real length.
    chunk = tl.cdiv(tl.cdiv(prefix, num_splits), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, prefix)
    for start in range(lo, hi, BLOCK_N):
        pos = start + offs_n
        key_ok = pos < hi
        k_off, v_off = kv_offsets(pos, key_ok, b, kv_head, bt_ptr, block_table_batch_stride,
                                  page_size, k_batch_stride, k_row_stride, k_head_stride,
                                  v_batch_stride, v_row_stride, v_head_stride, PAGED,
                                  SAME_KV_STRIDES)
        visible = row_ok[:, None] & key_ok[None, :]
        acc, m_i, l_i = attend_block(acc, m_i, l_i, q, k_ptr, v_ptr, k_off, v_off, key_ok,
                                     visible, offs_d, qk_scale_log2, INPUT_PRECISION)

    if split == num_splits - 1:
        tail_end = N
        if TAIL_MODE == 1:
            last_row = tl.minimum((tile * BLOCK_M + BLOCK_M - 1) // G, N - 1)
            tail_end = last_row + 1
        offs_t = tl.arange(0, TAIL_N)
        for j0 in range(0, tail_end, TAIL_N):
            j = j0 + offs_t
            key_ok = j < tail_end
            k_off, v_off = kv_offsets(prefix + j, key_ok, b, kv_head, bt_ptr,
                                      block_table_batch_stride, page_size, k_batch_stride,
                                      k_row_stride, k_head_stride, v_batch_stride, v_row_stride,
                                      v_head_stride, PAGED, SAME_KV_STRIDES)
            both = row_ok[:, None] & key_ok[None, :]
            if TAIL_MODE == 0:
                # TAIL_N is 32 here, so one mask word per row covers the block: a [BLOCK_M]
                # load instead of a [BLOCK_M, BLOCK_N] gather (which spilled at Dh 128).
                word = tl.load(mask_ptr + b.to(tl.int64) * mask_batch_stride
                               + row_i.to(tl.int64) * mask_row_stride + j0 // 32, mask=row_ok,
                               other=0)
                visible = both & (((word[:, None] >> offs_t[None, :]) & 1) != 0)
            elif TAIL_MODE == 1:
                visible = both & (j[None, :] <= row_i[:, None])
            else:
                visible = both
            acc, m_i, l_i = attend_block(acc, m_i, l_i, q, k_ptr, v_ptr, k_off, v_off, key_ok,
                                         visible, offs_d, qk_scale_log2, INPUT_PRECISION)

    # l_i == 0: no visible key (or only -inf scores); a NaN or +inf score left l_i NaN.
    no_key = l_i == 0.0
    o = tl.where(no_key[:, None], 0.0, acc / tl.where(no_key, 1.0, l_i)[:, None])
    lse2 = tl.where(no_key, float("-inf"), m_i + tl.log2(tl.where(no_key, 1.0, l_i)))
    if SPLIT:
        # Workspace rows ordered (split, b, i, head): [S, B, N, HQ] (+ HEAD_DIM for the output).
        part_row = ((split * B + b).to(tl.int64) * N + row_i) * HQ + head
        tl.store(part_o_ptr + part_row[:, None] * HEAD_DIM + offs_d[None, :], o,
                 mask=row_ok[:, None])
        tl.store(part_lse_ptr + part_row, lse2, mask=row_ok)
    else:
        o_off = (b.to(tl.int64) * o_batch_stride + row_i.to(tl.int64) * o_row_stride
                 + head.to(tl.int64) * o_head_stride)
        tl.store(out_ptr + o_off[:, None] + offs_d[None, :], o.to(out_ptr.dtype.element_ty),
                 mask=row_ok[:, None])
        if STORE_LSE:
            l_off = b.to(tl.int64) * lse_batch_stride + head.to(tl.int64) * lse_head_stride \
                + row_i.to(tl.int64) * lse_row_stride
            tl.store(lse_ptr + l_off, lse2 * LN2, mask=row_ok)


@triton.jit
def _merge_splits(
    part_o_ptr, part_lse_ptr, out_ptr, lse_ptr,
    o_batch_stride, o_row_stride, o_head_stride, lse_batch_stride, lse_head_stride, lse_row_stride,
    N, HQ, rows, num_splits,
    HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr, STORE_LSE: tl.constexpr,
):
    """Combine per-split (normalised output, base-2 LSE) pairs into ``out`` and natural-log ``lse``."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)     # r = (b * N + i) * HQ + head
    merge_splits(part_o_ptr, part_lse_ptr, out_ptr, lse_ptr, r, r < rows, tl.zeros_like(r) + num_splits,
                 rows, num_splits, N, HQ, o_batch_stride, o_row_stride, o_head_stride, lse_batch_stride,
                 lse_head_stride, lse_row_stride, HEAD_DIM, BLOCK_R, STORE_LSE)


def _block_sizes(device: torch.device, rows: int, head_dim: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for ``rows = N * G`` packed query rows; the CUDA
    choices are the ones that do not spill registers on sm_90a (docs/kernels.md, "Triton kernels
    compiled offline")."""
    block_m = min(128 if head_dim <= 128 else 64, max(16, next_power_of_2(rows)))
    if device.type != "cuda":
        return block_m, 32, 4, 1
    block_n = 64 if head_dim <= 128 else 32
    num_warps = 8 if block_m >= 128 or head_dim >= 128 else 4
    num_stages = 2 if block_m * head_dim >= 128 * 128 else 3
    return block_m, block_n, num_warps, num_stages


def launch_tree_attention(q, k_cache, v_cache, prefix_lens, tree_mask, tail, block_table, scale,
                          out, lse, num_splits: int | None = None) -> None:
    """:func:`tree_attention` with an optional forced ``num_splits`` (tests, benchmarks).

    Parameters are those of :func:`tree_attention`; ``num_splits`` None picks
    :func:`launch_plan.triton_attention_splits`, an int >= 1 overrides it (splits beyond the prefix are empty).
    """
    B, N, HQ, D = q.shape
    HKV = k_cache.shape[2]
    G = HQ // HKV
    dev = q.device
    paged = block_table is not None
    capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]

    block_m, block_n, num_warps, num_stages = _block_sizes(dev, N * G, D)
    q_tiles = cdiv(N * G, block_m)
    if num_splits is None:
        num_splits = launch_plan.triton_attention_splits(
            q_tiles * B * HKV, capacity - N, launch_plan.sm_count(dev),
            launch_plan.TRITON_MIN_KEYS_PER_SPLIT["cuda" if dev.type == "cuda" else "cpu"])
    split = num_splits > 1
    store_lse = lse is not None
    tail_mode = 0 if tree_mask is not None else (1 if tail == "causal" else 2)

    if split:
        partial_o = torch.empty(num_splits, B, N, HQ, D, device=dev, dtype=torch.float32)
        partial_lse = torch.empty(num_splits, B, N, HQ, device=dev, dtype=torch.float32)
    else:
        partial_o = partial_lse = out           # unused pointers
    mask_arg = tree_mask if tree_mask is not None else prefix_lens
    mask_strides = (tree_mask.stride(0), tree_mask.stride(1)) if tree_mask is not None else (0, 0)
    bt_arg = block_table if paged else prefix_lens
    lse_arg = lse if store_lse else out
    lse_strides = (lse.stride(0), lse.stride(1), lse.stride(2)) if store_lse else (0, 0, 0)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"

    grid = (q_tiles, B * HKV, num_splits)
    _tree_attention_fwd[grid](
        q, k_cache, v_cache, prefix_lens, mask_arg, bt_arg, out, lse_arg, partial_o, partial_lse,
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        *mask_strides,
        block_table.stride(0) if paged else 0, k_cache.shape[1] if paged else 1,
        out.stride(0), out.stride(1), out.stride(2),
        *lse_strides,
        B, N, HQ, HKV, G, num_splits, scale * LOG2E,
        HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n,
        TAIL_N=32 if tree_mask is not None else block_n, PAGED=paged,
        SAME_KV_STRIDES=k_cache.stride()[:3] == v_cache.stride()[:3], TAIL_MODE=tail_mode,
        SPLIT=split, STORE_LSE=store_lse, INPUT_PRECISION=precision, num_warps=num_warps,
        num_stages=num_stages,
    )
    if split:
        rows = B * N * HQ
        block_r = 16 if D >= 128 else 32
        _merge_splits[(cdiv(rows, block_r),)](
            partial_o, partial_lse, out, lse_arg,
            out.stride(0), out.stride(1), out.stride(2), *lse_strides,
            N, HQ, rows, num_splits,
            HEAD_DIM=D, BLOCK_R=block_r, STORE_LSE=store_lse, num_warps=4,
        )


def tree_attention(q, k_cache, v_cache, prefix_lens, tree_mask, tail, block_table, scale, out,
                   lse) -> None:
    """Backend entry point: tree / causal / full-tail attention over a KV cache (fills outputs).

    Parameters
    ----------
    q : float16/bfloat16/float32 [B, N, Hq, Dh], last dim contiguous (other strides free)
    k_cache, v_cache : q.dtype, contiguous [B, L, Hkv, Dh] or paged [P, page_size, Hkv, Dh]
        (last dim contiguous; other strides free, K's and V's independent of each other); the
        tail's K/V sit at positions prefix_lens .. prefix_lens + N - 1.
    prefix_lens : int32 [B]
    tree_mask : int32 [B, N, ceil(N/32)] or None
    tail : "causal" | "full"; used when tree_mask is None
    block_table : int32 [B, max_pages] or None (contiguous cache)
    scale : float
    out : q.dtype [B, N, Hq, Dh], last dim contiguous; written
    lse : float32 [B, Hq, N] or None; natural-log log-sum-exp, written when given

    Returns
    -------
    None. Arguments were validated by ``jetspec_kernels.ops.tree_attention``; Dh is a power of
    two in 16..256.
    """
    launch_tree_attention(q, k_cache, v_cache, prefix_lens, tree_mask, tail, block_table, scale,
                          out, lse)
