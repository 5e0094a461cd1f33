"""Triton ``tree_attention(exact=True)``: every query row reduced over its visible keys in logical
order, in blocks and splits fixed by logical position, so a tree node's row is the same bits as
the one-token decode step's at its position (its ancestors committed): one launch, and a combine
launch when the cache holds more than SPLIT_KEYS positions (a pair per chunk of rows when the
split partials of all rows would pass WORKSPACE_BYTES).

A row's logical keys are ``t = 0 .. L - 1`` with ``L = prefix + depth`` (depth: the row's
visible tail keys, itself included): key ``t < prefix`` is cache position t; key
``prefix + d`` is the tail slot of the row's d-th visible tail node (ascending node order, which
is depth order: parents precede children). The decode step at the same logical position
``prefix + depth - 1`` has the same L and, once the ancestors are committed at ``prefix ..``,
the same key at every t. Everything that shapes the arithmetic is a function of t, L and the
head dim alone, never of B, N, the page size, the tree or the SM count:

* blocks of ``BLOCK_N`` keys start at multiples of BLOCK_N of t (block k is keys
  ``k * BLOCK_N ..``), keys past L masked in the row's last block;
* splits of ``SPLIT_KEYS`` logical keys; a row with more than one split combines them in split
  order (the combine kernel), a row with one writes its output directly;
* one program shape per head dim and dtype (``block_sizes``: BLOCK_M packed rows
  ``f = r * G + g``, R tree rows x the G query heads of a kv head, zero rows padding a short
  tile; BLOCK_N; num_warps): a row's dot products are the same instruction sequence wherever it
  sits in the tile;
* FMA contraction off (``enable_fp_fusion=False``): the block update is one helper, but the
  compiler may contract ``s * scale - m`` in one call site and not in another.

Work sharing: blocks every row of a tile sees whole, with the same keys, are read once and run
one dot for the tile's rows (rows of a dot are independent): under a tree mask the blocks below
the prefix, without one (causal or full tails: tail key d sits at prefix + d for every row) the
blocks below the tile's shortest row. From there on the tile loops over its rows, gathering each
row's keys (loads masked at the row's own length) and keeping only that row's results, with the
same dot and update, so a block gives the same bits whichever path runs it (the decode step
meets as shared a block the tree node meets as its own). Blocks past a row's length are skipped
for it, never applied as an empty update (``-0.0 + 0.0`` would turn a negative zero positive).

Row groups: a tile's per-row blocks run serially, so where the grid is small (B 1: a few tiles a
kv head) a tile's rows are split over several programs, each running the tile's shared blocks
and its own rows' blocks and storing its own rows (``launch_plan.exact_attention_row_groups``,
one wave). A row runs the same dots in the same order in any group, so the
count may follow B, N and the SM count, unlike the block and split sizes.

The kernels are compiled with B, N and the strides that follow N unspecialised, so a tree launch
and its decode steps (N = 1) run one binary.

What the interpreter can and cannot show, and the predicted cost on a GPU: docs/perf/exact_mode.md.
"""
from __future__ import annotations

import contextlib
import threading

import torch
import triton
import triton.language as tl

from .. import launch_plan
from .sizes import cdiv, next_power_of_2
from .attention_steps import LN2, LOG2E, attend_block, kv_offsets, merge_splits

__all__ = ["exact_tree_attention", "SPLIT_KEYS", "block_sizes", "tail_order", "tail_order_scope"]

SPLIT_KEYS = 1024       # logical keys a split: fixed, never from B, N or the SM count


def block_sizes(head_dim: int, dtype: torch.dtype) -> tuple[int, int, int]:
    """(BLOCK_M packed rows, BLOCK_N keys, num_warps) of a program: from the head dim and the
    dtype alone (the launcher raises BLOCK_M to the GQA group size G where G is larger), never
    from B, N or the device's SM count (the sizes that do not spill registers
    on sm_90a: bench/triton_resources.py; float32, the tests' dtype, uses IEEE FMA dots and still
    spills at Dh 256 with the smallest tiles). BLOCK_N divides SPLIT_KEYS."""
    if dtype == torch.float32:
        return (32, 32, 8) if head_dim <= 64 else (16, 16, 8)
    if head_dim > 128:
        return 32, 32, 8
    return (64, 64, 4) if head_dim <= 64 else (64, 32, 8)


@triton.jit
def _depths(depth_ptr, b, row, ok, N, TAIL_MODE: tl.constexpr):
    """Visible tail nodes of rows ``row`` of sequence b (0 where not ``ok``): the tree's counts
    (TAIL_MODE 0), row + 1 (1: causal) or N (2: full)."""
    if TAIL_MODE == 0:
        return tl.load(depth_ptr + b.to(tl.int64) * N + row, mask=ok, other=0)
    elif TAIL_MODE == 1:
        return tl.where(ok, row + 1, 0)
    else:
        return tl.where(ok, tl.zeros_like(row) + N, 0)


@triton.jit(do_not_specialize=["B", "N", "lse_batch_stride", "lse_head_stride", "GROUPS",
                               "RG", "ROW0", "NC"])
def _exact_fwd(
    q_ptr, k_ptr, v_ptr, prefix_ptr, depth_ptr, order_ptr, bt_ptr, out_ptr, lse_ptr,
    part_o_ptr, part_lse_ptr,
    q_batch_stride, q_row_stride, q_head_stride,
    k_batch_stride, k_row_stride, k_head_stride,
    v_batch_stride, v_row_stride, v_head_stride,
    block_table_batch_stride, page_size,
    o_batch_stride, o_row_stride, o_head_stride,
    lse_batch_stride, lse_head_stride, lse_row_stride,
    B, N, HQ, HKV, G, R, GROUPS, RG, ROW0, NC, qk_scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT_KEYS: tl.constexpr, PAGED: tl.constexpr, SAME_KV_STRIDES: tl.constexpr,
    STORE_LSE: tl.constexpr, INPUT_PRECISION: tl.constexpr, TAIL_MODE: tl.constexpr,
):
    """One (tile of R rows and group of RG of them, sequence x kv head, split) program: the
    tile's shared blocks for all its rows, the per-row blocks and the stores for its group's
    rows alone (a row's arithmetic does not depend on the group). Rows ``ROW0 ..`` (a chunk of
    NC rows, a multiple of R: the partials hold NC rows). TAIL_MODE: 0 tree mask (a row's tail
    keys from ``order``), 1 causal, 2 full (tail key d at position prefix + d)."""
    tile = tl.program_id(0) // GROUPS
    r_lo = (tl.program_id(0) % GROUPS) * RG
    r_hi = tl.minimum(r_lo + RG, R)
    bh = tl.program_id(1)
    split = tl.program_id(2)
    b = bh // HKV
    kv_head = bh % HKV

    f = tl.arange(0, BLOCK_M)
    r_of = f // G
    row = ROW0 + tile * R + r_of
    row_ok = (r_of < R) & (row < N)
    head = kv_head * G + f % G
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)

    q_off = (b.to(tl.int64) * q_batch_stride + row.to(tl.int64) * q_row_stride
             + head.to(tl.int64) * q_head_stride)
    q = tl.load(q_ptr + q_off[:, None] + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    prefix = tl.load(prefix_ptr + b)
    length = tl.where(row_ok, prefix + _depths(depth_ptr, b, row, row_ok, N, TAIL_MODE), 0)

    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)

    lo = split * SPLIT_KEYS
    hi = tl.minimum(lo + SPLIT_KEYS, tl.max(length, 0))
    # Blocks every row sees whole, with the same keys: below the prefix under a tree mask; below
    # the tile's shortest row without one (tail key d sits at prefix + d for every row).
    if TAIL_MODE == 0:
        same = prefix
    elif TAIL_MODE == 1:
        same = prefix + ROW0 + tile * R + 1                # the tile's first row is its shortest
    else:
        same = prefix + N
    shared_end = tl.maximum(tl.minimum((same // BLOCK_N) * BLOCK_N, hi), lo)
    for start in range(lo, shared_end, BLOCK_N):
        pos = start + offs_n
        key_ok = pos < shared_end                          # all true: every row sees them
        k_off, v_off = kv_offsets(pos, key_ok, b, kv_head, bt_ptr, block_table_batch_stride,
                                  page_size, k_batch_stride, k_row_stride, k_head_stride,
                                  v_batch_stride, v_row_stride, v_head_stride, PAGED,
                                  SAME_KV_STRIDES)
        visible = row_ok[:, None] & (pos[None, :] < length[:, None])
        acc, m_i, l_i = attend_block(acc, m_i, l_i, q, k_ptr, v_ptr, k_off, v_off, key_ok,
                                     visible, offs_d, qk_scale_log2, INPUT_PRECISION)

    for start in range(shared_end, hi, BLOCK_N):           # each row's own keys
        t = start + offs_n
        for r in range(r_lo, r_hi):
            rr = ROW0 + tile * R + r
            if rr < N:
                row_len = prefix + _depths(depth_ptr, b, rr, True, N, TAIL_MODE)
                if start < row_len:
                    key_ok = t < row_len
                    if TAIL_MODE == 0:
                        node = tl.load(order_ptr + (b.to(tl.int64) * N + rr) * N + (t - prefix),
                                       mask=key_ok & (t >= prefix), other=0)
                        pos = tl.where(t < prefix, t, prefix + node)
                    else:
                        pos = t
                    k_off, v_off = kv_offsets(pos, key_ok, b, kv_head, bt_ptr,
                                              block_table_batch_stride, page_size,
                                              k_batch_stride, k_row_stride, k_head_stride,
                                              v_batch_stride, v_row_stride, v_head_stride,
                                              PAGED, SAME_KV_STRIDES)
                    mine = row_ok & (r_of == r)
                    visible = mine[:, None] & key_ok[None, :]
                    acc2, m2, l2 = attend_block(acc, m_i, l_i, q, k_ptr, v_ptr, k_off, v_off,
                                                key_ok, visible, offs_d, qk_scale_log2,
                                                INPUT_PRECISION)
                    acc = tl.where(mine[:, None], acc2, acc)
                    m_i = tl.where(mine, m2, m_i)
                    l_i = tl.where(mine, l2, l_i)

    no_key = l_i == 0.0
    o = tl.where(no_key[:, None], 0.0, acc / tl.where(no_key, 1.0, l_i)[:, None])
    lse2 = tl.where(no_key, float("-inf"), m_i + tl.log2(tl.where(no_key, 1.0, l_i)))
    splits = tl.maximum(tl.cdiv(length, SPLIT_KEYS), 1)    # a row with no key: written as 0, -inf
    this_split = tl.zeros_like(splits) + split
    ours = row_ok & (r_of >= r_lo) & (r_of < r_hi)          # the group's rows
    direct = ours & (splits == 1) & (this_split == 0)
    o_off = (b.to(tl.int64) * o_batch_stride + row.to(tl.int64) * o_row_stride
             + head.to(tl.int64) * o_head_stride)
    tl.store(out_ptr + o_off[:, None] + offs_d[None, :], o.to(out_ptr.dtype.element_ty),
             mask=direct[:, None])
    if STORE_LSE:
        l_off = b.to(tl.int64) * lse_batch_stride + head.to(tl.int64) * lse_head_stride \
            + row.to(tl.int64) * lse_row_stride
        tl.store(lse_ptr + l_off, lse2 * LN2, mask=direct)
    partial = ours & (splits > 1) & (this_split < splits)
    part_row = ((split * B + b).to(tl.int64) * NC + row - ROW0) * HQ + head  # [S, B, NC, HQ]
    tl.store(part_o_ptr + part_row[:, None] * HEAD_DIM + offs_d[None, :], o,
             mask=partial[:, None])
    tl.store(part_lse_ptr + part_row, lse2, mask=partial)


@triton.jit(do_not_specialize=["N", "rows", "o_batch_stride", "lse_batch_stride",
                               "lse_head_stride", "ROW0", "NC"])
def _exact_combine(
    part_o_ptr, part_lse_ptr, prefix_ptr, depth_ptr, out_ptr, lse_ptr,
    o_batch_stride, o_row_stride, o_head_stride, lse_batch_stride, lse_head_stride, lse_row_stride,
    N, HQ, rows, max_splits, ROW0, NC,
    HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr, SPLIT_KEYS: tl.constexpr,
    STORE_LSE: tl.constexpr, TAIL_MODE: tl.constexpr,
):
    """Rows with more than one split: their partials combined in split order, each row over its
    own split count (a row's result does not depend on the launch's largest). The chunk of NC
    rows from ROW0 (``out_ptr``, ``lse_ptr`` point at row ROW0)."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)     # r = (b * NC + i) * HQ + head
    row_i = ROW0 + (r // HQ) % NC
    b = r // (HQ * NC)
    length = tl.load(prefix_ptr + b, mask=r < rows, other=0) \
        + _depths(depth_ptr, b, row_i, r < rows, N, TAIL_MODE)
    splits = tl.cdiv(length, SPLIT_KEYS)
    merge_splits(part_o_ptr, part_lse_ptr, out_ptr, lse_ptr, r, (r < rows) & (splits > 1), splits,
                 rows, max_splits, NC, HQ, o_batch_stride, o_row_stride, o_head_stride,
                 lse_batch_stride, lse_head_stride, lse_row_stride, HEAD_DIM, BLOCK_R, STORE_LSE)


_SCOPE = threading.local()


@contextlib.contextmanager
def tail_order_scope():
    """Inside the block, :func:`exact_tree_attention` computes a tree mask's ``tail_order`` once
    and reuses it for every later call with the same mask tensor (a forward's layers share one
    mask, which does not change within the forward). Thread-local; the memo ends with the block.
    Inside CUDA-graph capture the first call's kernels are captured and the others reuse their
    outputs, so a replay recomputes the order from the mask once."""
    before = getattr(_SCOPE, "memo", None)
    _SCOPE.memo = {}
    try:
        yield
    finally:
        _SCOPE.memo = before


def _tail_order_of(tree_mask: torch.Tensor, device):
    memo = getattr(_SCOPE, "memo", None)
    if memo is None:
        return tail_order(tree_mask, device)
    hit = memo.get(id(tree_mask))
    if hit is None or hit[0] is not tree_mask:
        hit = memo[id(tree_mask)] = (tree_mask, *tail_order(tree_mask, device))
    return hit[1], hit[2]


def tail_order(tree_mask: torch.Tensor, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(depth int32 [B, N], order int32 [B, N, N]) of a packed tree mask ``[B, N, W]``: each row's
    visible tail nodes counted, and listed ascending (``order[b, i, :depth]``; the rest unused).
    Device ops, no host sync."""
    b, n = tree_mask.shape[:2]
    j = torch.arange(n, device=device)
    bits = ((tree_mask[..., j // 32] >> (j % 32).to(tree_mask.dtype)) & 1) != 0
    depth = bits.sum(-1, dtype=torch.int32)
    order = torch.argsort((~bits).to(torch.uint8), dim=-1, stable=True).to(torch.int32)
    return depth.contiguous(), order.contiguous()


# The split partials one launch may hold (at least one tile's, whatever this says); a longer
# query (a long prefill) runs in row chunks.
WORKSPACE_BYTES = 256 << 20


def _row_chunk(n: int, rows_per_tile: int, bytes_per_row: int) -> int:
    """Rows a launch takes: all N, or the most whole tiles whose split partials (``bytes_per_row``
    a query row over the batch, heads and splits) fit WORKSPACE_BYTES, at least one tile.
    Scheduling only: a tile's rows and their arithmetic are the same in any chunk."""
    if n * bytes_per_row <= WORKSPACE_BYTES:
        return max(n, 1)
    return max(1, WORKSPACE_BYTES // (bytes_per_row * rows_per_tile)) * rows_per_tile


def exact_tree_attention(q, k_cache, v_cache, prefix_lens, tree_mask, tail, block_table, scale,
                         out, lse, row_groups: int | None = None) -> None:
    """``tree_attention(exact=True)`` on triton: fills ``out`` (and ``lse`` when given).

    Parameters
    ----------
    q : float16/bfloat16/float32 [B, N, Hq, Dh], last dim contiguous
    k_cache, v_cache : q.dtype, [B, L, Hkv, Dh] or paged [P, page_size, Hkv, Dh], last dim
        contiguous; the tail's K/V at positions prefix_lens .. prefix_lens + N - 1
    prefix_lens : int32 [B]; tree_mask : int32 [B, N, ceil(N/32)] or None; tail : "causal" | "full"
    block_table : int32 [B, max_pages] or None; scale : float
    out : q.dtype [B, N, Hq, Dh], last dim contiguous; lse : float32 [B, Hq, N] or None
    row_groups : programs a tile's rows are split over (None:
        ``launch_plan.exact_attention_row_groups``); the results are the same bits for any count

    Arguments were validated by ``jetspec_kernels.ops.tree_attention``. Row (b, i) of ``out`` is
    the same bits as the N = 1 call at prefix ``prefix_lens[b] + depth - 1`` over the row's keys
    committed in logical order (the decode step).
    """
    B, N, HQ, D = q.shape
    HKV = k_cache.shape[2]
    if q.numel() == 0:
        return
    G = HQ // HKV
    dev = q.device
    paged = block_table is not None
    capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
    block_m, block_n, num_warps = block_sizes(D, q.dtype)
    bm = max(block_m, next_power_of_2(G))
    rows_per_tile = bm // G
    max_splits = cdiv(max(capacity, 1), SPLIT_KEYS)
    prefix_lens = prefix_lens.to(torch.int32)
    tail_mode = 0 if tree_mask is not None else (1 if tail == "causal" else 2)
    if tail_mode == 0:
        depth, order = _tail_order_of(tree_mask, dev)
    else:
        depth = order = prefix_lens              # dummy pointers: the kernel computes them
    store_lse = lse is not None
    lse_arg = lse if store_lse else out
    lse_strides = (lse.stride(0), lse.stride(1), lse.stride(2)) if store_lse else (0, 0, 0)
    chunk = _row_chunk(N, rows_per_tile, B * HQ * (D + 1) * 4 * max_splits if max_splits > 1 else 0)
    if max_splits > 1:
        part_o = torch.empty(max_splits, B, chunk, HQ, D, device=dev, dtype=torch.float32)
        part_lse = torch.empty(max_splits, B, chunk, HQ, device=dev, dtype=torch.float32)
    else:
        part_o = part_lse = out                  # never written: no row has two splits
    bt_arg = block_table if paged else prefix_lens
    rows_here = min(rows_per_tile, N)
    if row_groups is None:
        row_groups = launch_plan.exact_attention_row_groups(
            cdiv(chunk, rows_per_tile) * B * HKV * max_splits, rows_here, launch_plan.sm_count(dev))
    rg = cdiv(rows_here, max(1, min(row_groups, rows_here)))
    groups = cdiv(rows_here, rg)
    for row0 in range(0, N, chunk):
        nc = min(chunk, N - row0)
        _exact_fwd[(cdiv(nc, rows_per_tile) * groups, B * HKV, max_splits)](
            q, k_cache, v_cache, prefix_lens, depth, order, bt_arg, out, lse_arg, part_o, part_lse,
            q.stride(0), q.stride(1), q.stride(2),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            block_table.stride(0) if paged else 0, k_cache.shape[1] if paged else 1,
            out.stride(0), out.stride(1), out.stride(2), *lse_strides,
            B, N, HQ, HKV, G, rows_per_tile, groups, rg, row0, nc, scale * LOG2E,
            HEAD_DIM=D, BLOCK_M=bm, BLOCK_N=block_n, SPLIT_KEYS=SPLIT_KEYS, PAGED=paged,
            SAME_KV_STRIDES=k_cache.stride()[:3] == v_cache.stride()[:3], STORE_LSE=store_lse,
            INPUT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", TAIL_MODE=tail_mode,
            num_warps=num_warps, enable_fp_fusion=False,
        )
        if max_splits > 1:
            rows = B * nc * HQ
            block_r = 16 if D >= 128 else 32
            _exact_combine[(cdiv(rows, block_r),)](
                part_o, part_lse, prefix_lens, depth, out[:, row0:],
                lse_arg[:, :, row0:] if store_lse else out,
                out.stride(0), out.stride(1), out.stride(2), *lse_strides,
                N, HQ, rows, max_splits, row0, nc,
                HEAD_DIM=D, BLOCK_R=block_r, SPLIT_KEYS=SPLIT_KEYS, STORE_LSE=store_lse,
                TAIL_MODE=tail_mode, num_warps=4, enable_fp_fusion=False,
            )
