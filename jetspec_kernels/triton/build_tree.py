"""Triton ``build_tree``: the draft tree from per-depth top-K (``topn``, ``accum_logp``) and its mask.

One program per sequence (grid ``[B]``) holds the tree in vectors of ``NP = next_pow2(budget)``
slots, runs the selection loop on the device, and writes every output element, the packed
ancestor mask included. No host sync: the node count ``min(budget, 1 + K + ... + K**D)`` is a
function of the static shapes.

The keys, and why a step may take many nodes without a sort, are ``docs/DESIGN.md`` section 4a;
here they are encoded and decoded only by the ``_topn_key*`` / ``_heap_key*`` / ``_node_*``
helpers below. ``topn`` keeps the nodes at their output positions and, per step, takes a prefix of
the spec's best-first order from a window of the next ``KB`` children of every node
(``KB = min(next_pow2(K), 2048 / NP)``: 2048 window entries); when the prefix passes the node
count :func:`_kth_key` bisects for the last key to keep, then every node moves to its new position
through two round trips in the output buffers (the shift of a node's children, then a parent's new
position). Per step: four reductions, one scan, two barriers. A K = 1 chain takes one node a step.

``accum_logp`` simulates JetSpec's heap: slots are insertion order (= output order); the heap is
the set of inserted, unpopped slots; the key pops the best score, ties to the earliest inserted. A
popped node of depth < D appends ``min(K, budget - n)`` children in rank order with one vector load.

The mask is written by ``triton/pack_mask.py``'s tile (an ancestor walk over tiles of rows).

Step counts, floor, predicted time and register use on sm_90 (``bench/triton_resources.py``, run by
``tests/test_triton_sm90_resources.py``): ``docs/perf/build_tree.md``.
"""
from __future__ import annotations


import torch
import triton
import triton.language as tl

from .pack_mask import mask_layout, mask_tile
from .sizes import next_power_of_2

__all__ = ["build_tree"]

_INF_KEY = tl.constexpr(2**63 - 1)
# topn: heap-window entries per step (NP * KB of them); bounds the registers of one program
_WINDOW = 2048


def _tree_size(D, K, cap):
    """``min(cap, 1 + K + ... + K**D)`` without forming huge powers."""
    total, level = 1, 1
    for _ in range(D):
        level *= K
        total += level
        if total >= cap:
            return cap
    return min(total, cap)


def _warps(np_):
    return max(1, min(8, np_ // 256))


def _topn_warps(entries):
    # enough warps that the window fits in registers on sm_90 (docs/perf/build_tree.md)
    return max(4, min(16, entries // 256))


@triton.jit
def _q(score):
    """Score (<= 0, fp32) -> 31-bit magnitude as int64; smaller is better."""
    return (score.to(tl.int32, bitcast=True) & 0x7FFFFFFF).to(tl.int64)


@triton.jit
def _score(q):
    """Inverse of :func:`_q` for non-positive scores (q = 0 is the +0.0 of the root)."""
    mag = q.to(tl.int32).to(tl.float32, bitcast=True)
    return tl.where(q == 0, 0.0, -mag)


# topn key (DESIGN.md 4a): q << 30 | depth << 18 | parent position << 6 | rank, with 12-bit depth
# and position (budget <= 4096) and a 6-bit rank (K <= 64); the (q, depth) key is its top part.
_TOPN_Q_SHIFT = tl.constexpr(30)
_TOPN_DEPTH_SHIFT = tl.constexpr(18)
_TOPN_POS_SHIFT = tl.constexpr(6)
_QD_DEPTH_BITS = tl.constexpr(12)
_MAX_DEPTH_FIELD = tl.constexpr(4095)


@triton.jit
def _topn_key(score, depth, pos, rank):
    """int64 heap key of a candidate child (score, its depth, its parent's position, its rank):
    the smallest key is the spec's next node."""
    return ((_q(score) << _TOPN_Q_SHIFT) | (depth.to(tl.int64) << _TOPN_DEPTH_SHIFT)
            | (pos.to(tl.int64) << _TOPN_POS_SHIFT) | rank.to(tl.int64))


@triton.jit
def _topn_key_q(key):
    """The score part (``q``) of a topn key."""
    return key >> _TOPN_Q_SHIFT


@triton.jit
def _topn_key_q_depth(key):
    """The (q, depth) part of a topn key, comparable with :func:`_q_depth_key`."""
    return key >> _TOPN_DEPTH_SHIFT


@triton.jit
def _q_depth_key(score, depth):
    """(q, depth) key; depth clamped to its 12 bits (for a 4095-deep chain: still a lower bound)."""
    return (_q(score) << _QD_DEPTH_BITS) | tl.minimum(depth, _MAX_DEPTH_FIELD).to(tl.int64)


@triton.jit
def _heap_key(score, slot, depth):
    """accum_logp heap key ``q << 24 | slot << 12 | depth``: best score, then earliest inserted."""
    return (_q(score) << 24) | (slot.to(tl.int64) << 12) | depth.to(tl.int64)


@triton.jit
def _heap_key_unpack(key):
    """(score, slot, depth) of an accum_logp heap key."""
    return _score(key >> 24), ((key >> 12) & 0xFFF).to(tl.int32), (key & 0xFFF).to(tl.int32)


@triton.jit
def _node_pack(depth, rank, children):
    """topn's per-node scratch word: depth (12 bits) | rank (6) | children selected so far."""
    return depth | (rank << 12) | (children << 18)


@triton.jit
def _node_unpack(f):
    """(depth, rank, children) of :func:`_node_pack`."""
    return f & 0xFFF, (f >> 12) & 0x3F, f >> 18


@triton.jit
def _kth_key(key, valid, k):
    """The k-th smallest of the distinct int64 topn ``key`` where ``valid`` (2-D), by bisection:
    first on the score part, then on the rest among the keys of that score."""
    q = _topn_key_q(key)
    lo = tl.min(tl.min(tl.where(valid, q, _INF_KEY), axis=1), axis=0)
    hi = tl.max(tl.max(tl.where(valid, q, -1), axis=1), axis=0)
    while lo < hi:
        mid = lo + (hi - lo) // 2
        c = tl.sum(tl.sum((valid & (q <= mid)).to(tl.int32), axis=1), axis=0)
        hi = tl.where(c >= k, mid, hi)
        lo = tl.where(c >= k, lo, mid + 1)
    k -= tl.sum(tl.sum((valid & (q < lo)).to(tl.int32), axis=1), axis=0)
    tie = valid & (q == lo)
    lo = tl.min(tl.min(tl.where(tie, key, _INF_KEY), axis=1), axis=0)
    hi = tl.max(tl.max(tl.where(tie, key, -1), axis=1), axis=0)
    while lo < hi:
        mid = lo + (hi - lo) // 2
        c = tl.sum(tl.sum((tie & (key <= mid)).to(tl.int32), axis=1), axis=0)
        hi = tl.where(c >= k, mid, hi)
        lo = tl.where(c >= k, lo, mid + 1)
    return lo


@triton.jit
def _tree_kernel(tt_ptr, lp_ptr, root_ptr, tokens_batch_stride, tokens_row_stride,
                 logprobs_batch_stride, logprobs_row_stride,
                 D, K, budget, n_target,
                 tok_ptr, par_ptr, dep_ptr, sc_ptr, num_ptr, mask_ptr, W,
                 TOPN: tl.constexpr, NP: tl.constexpr, KB: tl.constexpr, ROWS: tl.constexpr,
                 WP: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    row = b * budget
    slot = tl.arange(0, NP)
    lp_row = lp_ptr + b * logprobs_batch_stride
    tt_row = tt_ptr + b * tokens_batch_stride
    sc = tl.where(slot == 0, 0.0, float("-inf"))          # node score
    dep = tl.where(slot == 0, 0, -1)                        # node depth, -1 = empty slot
    rk = tl.zeros([NP], tl.int32)                           # rank among its siblings

    if TOPN:
        # Nodes live at their output positions (BFS order): a node's position is its slot, so
        # the lexicographic tie key of a child is (parent slot, rank) at no cost. Node x's
        # children sit at 1 + (children of all nodes before x) + rank.
        j = tl.arange(0, KB)[None, :]
        ppos = tl.where(slot == 0, -1, 0)                   # parent position
        nc = tl.zeros([NP], tl.int32)                       # children selected so far
        sa_row = tok_ptr + row                              # scratch: children shift by parent
        sb_row = mask_ptr + row * W                         # scratch: new position by old one
        f_row = dep_ptr + row                               # scratch: depth | rank | nc
        n = tl.full([], 1, tl.int32)
        while n < n_target:
            old = slot < n
            grow = old & (dep < D)
            # the heap window: children nc .. nc+KB-1 of every node, keyed in spec order
            r = nc[:, None] + j
            vis = grow[:, None] & (r < K)
            lpv = tl.load(lp_row + dep[:, None] * logprobs_row_stride + r, mask=vis, other=0.0)
            csc = sc[:, None] + lpv
            key = _topn_key(csc, dep[:, None] + 1, slot[:, None], r)
            key = tl.where(vis, key, _INF_KEY)
            hmin = tl.min(tl.min(key, axis=1), axis=0)
            # bound 1: the best child of any window entry (primary key q | depth only)
            first = grow & (nc < K)
            c0 = sc + tl.load(lp_row + dep * logprobs_row_stride + nc, mask=first, other=0.0)
            has_bc = first & (dep + 1 < D)
            bc = c0 + tl.load(lp_row + (dep + 1) * logprobs_row_stride, mask=has_bc, other=0.0)
            bc_key = tl.where(has_bc, _q_depth_key(bc, dep + 2), _INF_KEY)
            bc_min = tl.min(bc_key, axis=0)
            # bound 2: the first child hidden behind the window (full key)
            hr = nc + KB
            has_h = grow & (hr < K)
            hsc = sc + tl.load(lp_row + dep * logprobs_row_stride + hr, mask=has_h, other=0.0)
            h_key = _topn_key(hsc, dep + 1, slot, hr)
            h_min = tl.min(tl.where(has_h, h_key, _INF_KEY), axis=0)
            take = vis & ((key == hmin) | ((_topn_key_q_depth(key) < bc_min) & (key < h_min)))
            m = tl.sum(tl.sum(take.to(tl.int32), axis=1), axis=0)
            if m > n_target - n:
                m = n_target - n
                take = take & (key <= _kth_key(key, take, m))
            # new layout: x's first child moves from 1 + excl(nc) to 1 + excl(nc + cnt)
            cnt = tl.sum(take.to(tl.int32), axis=1)
            nc2 = nc + cnt
            both = (nc2.to(tl.int64) << 32) | cnt.to(tl.int64)
            excl = tl.cumsum(both, axis=0) - both
            child0 = 1 + (excl >> 32).to(tl.int32)
            tl.store(sa_row + slot, (excl & 0xFFFFFFFF).to(tl.int32), mask=old)
            tl.debug_barrier()
            newpos = slot + tl.load(sa_row + ppos, mask=old & (ppos >= 0), other=0)
            tl.store(sb_row + slot, newpos, mask=old)
            tl.store(sc_ptr + row + newpos, sc, mask=old)
            tl.store(f_row + newpos, _node_pack(dep, rk, nc2), mask=old)
            tl.store(par_ptr + row + newpos, ppos, mask=old)
            dst = child0[:, None] + r
            tl.store(sc_ptr + row + dst, csc, mask=take)
            tl.store(f_row + dst, _node_pack(dep[:, None] + 1, r, 0), mask=take)
            tl.store(par_ptr + row + dst, tl.broadcast_to(slot[:, None], [NP, KB]), mask=take)
            tl.debug_barrier()
            n += m
            old = slot < n
            sc = tl.load(sc_ptr + row + slot, mask=old, other=float("-inf"))
            f = tl.load(f_row + slot, mask=old, other=-1)
            par_old = tl.load(par_ptr + row + slot, mask=old, other=-1)
            ppos = tl.load(sb_row + par_old, mask=par_old >= 0, other=-1)
            f_dep, f_rk, f_nc = _node_unpack(f)
            dep = tl.where(old, f_dep, -1)
            rk = tl.where(old, f_rk, 0)
            nc = tl.where(old, f_nc, 0)
        # the final stores below overwrite this loop's scratch
        tl.debug_barrier()
        out = slot
        parent = ppos
    else:
        par = tl.full([NP], -1, tl.int32)
        heap = slot == 0
        n = tl.full([], 1, tl.int32)
        while n < n_target:
            best = tl.min(tl.where(heap, _heap_key(sc, slot, dep), _INF_KEY), axis=0)
            score, i, d = _heap_key_unpack(best)
            heap = heap & (slot != i)
            m = tl.where(d < D, tl.minimum(K, budget - n), 0)
            new = (slot >= n) & (slot < n + m)
            r = slot - n
            lpv = tl.load(lp_row + d * logprobs_row_stride + r, mask=new, other=0.0)
            sc = tl.where(new, score + lpv, sc)
            dep = tl.where(new, d + 1, dep)
            par = tl.where(new, i, par)
            rk = tl.where(new, r, rk)
            heap = heap | new
            n += m
        out = slot
        parent = par

    valid = slot < n_target
    root = tl.load(root_ptr + b)
    tok = tl.load(tt_row + (dep - 1) * tokens_row_stride + rk, mask=valid & (dep > 0), other=0)
    tok = tl.where(dep == 0, root, tok)
    tl.store(tok_ptr + row + out, tok, mask=valid)
    tl.store(par_ptr + row + out, parent, mask=valid)
    tl.store(dep_ptr + row + out, dep, mask=valid)
    tl.store(sc_ptr + row + out, sc, mask=valid)
    pad = (slot >= n_target) & (slot < budget)
    tl.store(tok_ptr + row + slot, tl.zeros([NP], tl.int32), mask=pad)
    tl.store(par_ptr + row + slot, tl.full([NP], -1, tl.int32), mask=pad)
    tl.store(dep_ptr + row + slot, tl.full([NP], -1, tl.int32), mask=pad)
    tl.store(sc_ptr + row + slot, tl.full([NP], float("-inf"), tl.float32), mask=pad)
    tl.store(num_ptr + b, n_target)
    # the mask walk reads the parents this program just wrote
    tl.debug_barrier()
    for r0 in range(0, budget, ROWS):
        mask_tile(par_ptr + row, n_target, mask_ptr + row * W, r0, budget, W, ROWS, WP)


def build_tree(topk_tokens, topk_logprobs, root_tokens, budget, algorithm):
    """Build the draft tree from per-depth top-K candidates on the device.

    Parameters
    ----------
    topk_tokens : int32 ``[B, D, K]``, last dim contiguous; row d = children of depth-d nodes
    topk_logprobs : float32 ``[B, D, K]``, ``<= 0``, sorted descending along K
    root_tokens : int32 ``[B]``
    budget : int in ``[1, MAX_BUDGET]`` (jetspec_kernels.limits), tree capacity N
    algorithm : ``"topn"`` or ``"accum_logp"`` (DESIGN.md section 4)

    Returns
    -------
    tokens, parents, depths : int32 ``[B, N]``; scores : float32 ``[B, N]``;
    num_nodes : int32 ``[B]``; mask : int32 ``[B, N, ceil(N / 32)]``
    """
    B, D, K = topk_tokens.shape
    N = int(budget)
    dev = topk_tokens.device
    W, WP, ROWS = mask_layout(N)
    tokens = torch.empty(B, N, dtype=torch.int32, device=dev)
    parents = torch.empty(B, N, dtype=torch.int32, device=dev)
    depths = torch.empty(B, N, dtype=torch.int32, device=dev)
    scores = torch.empty(B, N, dtype=torch.float32, device=dev)
    num_nodes = torch.empty(B, dtype=torch.int32, device=dev)
    mask = torch.empty(B, N, W, dtype=torch.int32, device=dev)
    if B:
        NP = next_power_of_2(N)
        KB = min(next_power_of_2(K), max(1, _WINDOW // NP))
        _tree_kernel[(B,)](topk_tokens, topk_logprobs, root_tokens,
                           topk_tokens.stride(0), topk_tokens.stride(1),
                           topk_logprobs.stride(0), topk_logprobs.stride(1),
                           D, K, N, _tree_size(D, K, N),
                           tokens, parents, depths, scores, num_nodes, mask, W,
                           TOPN=algorithm == "topn", NP=NP, KB=KB, ROWS=ROWS, WP=WP,
                           num_warps=_topn_warps(NP * KB) if algorithm == "topn" else _warps(NP))
    return tokens, parents, depths, scores, num_nodes, mask
