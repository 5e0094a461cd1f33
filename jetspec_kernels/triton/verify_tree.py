"""Triton kernels for ``verify_tree``: per-node target tokens, then the acceptance walk.

Step 0, only with top-k / top-p (``_filter_kernel``, grid ``[B*N]``): one program per node finds
the last token the filters keep, as a threshold ``(x_t, id_t)``: a token is kept iff
``x > x_t or (x == x_t and id <= id_t)``, with ``x = logit / T`` (see :func:`filter_thresholds`).
Step 1 (``_target_partial_kernel``, grid ``[B*N, S]``): each program scans one vocabulary split of
one node's logits and writes the best score and its index (greedy: the logit; sampling: the
Gumbel-max score ``logit / T + g`` over the kept tokens; T per sequence, 0 = greedy). Splits give
small batches enough programs for V = 151936.
Step 2 (``_walk_kernel``, grid ``[B]``): one program per sequence folds the S partials into the
node's target token (ties to the lower index), then walks the tree from the root, vectorised over
the N nodes, for at most ``max_depth`` steps, and writes every output element: sampled rows take
the first agreeing sibling at each step; greedy rows give every node its depth on an agreeing
chain (``max_depth`` rounds of a gather of the parents' depths), take the deepest (lowest index
among equals) and climb back to the root. Nothing syncs with the host. Given ``target_tokens``,
step 1 is skipped and the walk reads them directly.

The Gumbel noise is the counter hash of CONTRIBUTING.md on uint32 lanes, bit-exact with
``python_ref.gumbel_uniform`` (tests/verify_tree_triton_steps.py runs ``_uniform`` alone to
check it).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import launch_plan
from .sizes import cdiv, next_power_of_2

__all__ = ["verify_tree", "filter_thresholds"]


@triton.jit
def _mix32(x):
    """CONTRIBUTING.md's uint32 mixer (multiplications wrap mod 2**32)."""
    x = x ^ (x >> 16)
    x = x * tl.full(x.shape, 0x7FEB352D, tl.uint32)
    x = x ^ (x >> 15)
    x = x * tl.full(x.shape, 0x846CA68B, tl.uint32)
    x = x ^ (x >> 16)
    return x


@triton.jit
def _node_key(seed_ptr, off_ptr, b, n):
    """The hash state after seed, offset, sequence b and node n (uint32 scalar)."""
    h = _mix32(tl.load(seed_ptr + b).to(tl.uint32))
    h = _mix32(h ^ tl.load(off_ptr + b).to(tl.uint32))
    h = _mix32(h ^ b.to(tl.uint32))
    return _mix32(h ^ n.to(tl.uint32))


@triton.jit
def _uniform(key, v):
    """u in (0, 1) for vocabulary ids ``v`` (int32 tensor) of the node with hash state ``key``.

    ``(h >> 8) + 0.5`` in float32 rounds half-to-even on the same 2**-24 grid as python_ref's
    float64-then-float32 rounding, so the two agree bit for bit; the clamp keeps u below 1.
    """
    h = _mix32(key ^ v.to(tl.uint32))
    u = ((h >> 8).to(tl.float32) + 0.5) * 5.9604644775390625e-08   # 2**-24
    return tl.minimum(u, 0.99999994039535522461)                      # 1 - 2**-24


@triton.jit
def _order_key(x):
    """int64 in [0, 2**32) with the order of float32 ``x`` (-0.0 keyed as +0.0)."""
    bits = x.to(tl.int32, bitcast=True)
    bits = tl.where(bits == -2147483648, 0, bits)
    return tl.where(bits >= 0, bits.to(tl.int64) + 2147483648, (~bits).to(tl.int64))


@triton.jit
def _key_value(key):
    """The float32 whose :func:`_order_key` is ``key`` (a scalar int64)."""
    bits = tl.where(key >= 2147483648, key - 2147483648, ~key).to(tl.int32)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _mass(x, m):
    """python_ref.token_masses: floor(exp(x - m) * 2**32) as int64, exactly 2**32 where x == m."""
    e = tl.where(x == m, 1.0, tl.exp(x - m))
    return (e * 4294967296.0).to(tl.int64)


@triton.jit
def _select(base, V, T, m, target, tie_key, nbits,
            BY_MASS: tl.constexpr, BY_ID: tl.constexpr, BLOCK_V: tl.constexpr,
            RADIX: tl.constexpr):
    """Radix select, RADIX bits a pass from the top of an ``nbits``-bit key: the largest key c
    whose tokens at or above it weigh at least ``target`` (weight: count, or mass when BY_MASS).

    Keys: the order key of ``x = logit / T``, or with BY_ID, ``V - 1 - id`` of the tokens whose
    order key is ``tie_key``. Returns ``(c, count above c, mass above c, count at c, mass at c)``
    (int64 scalars; masses only without BY_ID). All sums are integers: any order gives them.
    """
    NB: tl.constexpr = 1 << RADIX
    bins = tl.arange(0, NB).to(tl.int64)
    higher = bins[None, :] > bins[:, None]                       # [bin, other]: other above bin
    npass = (nbits + RADIX - 1) // RADIX
    prefix = tl.zeros([], tl.int64)
    a_cnt = tl.zeros([], tl.int64)
    a_mass = tl.zeros([], tl.int64)
    e_cnt = tl.zeros([], tl.int64)
    e_mass = tl.zeros([], tl.int64)
    for i in range(0, npass):
        shift = (npass - 1 - i) * RADIX
        h_cnt = tl.zeros([NB], tl.int64)
        h_mass = tl.zeros([NB], tl.int64)
        for v0 in range(0, V, BLOCK_V):
            v = v0 + tl.arange(0, BLOCK_V)
            valid = v < V
            x = tl.div_rn(tl.load(base + v, mask=valid, other=0.0).to(tl.float32), T)
            if BY_ID:
                valid = valid & (_order_key(x) == tie_key)
                key = (V - 1 - v).to(tl.int64)
            else:
                key = _order_key(x)
            valid = valid & ((key >> (shift + RADIX)) == (prefix >> (shift + RADIX)))
            hit = (((key >> shift) & (NB - 1))[:, None] == bins[None, :]) & valid[:, None]
            h_cnt += tl.sum(hit.to(tl.int64), axis=0)
            if not BY_ID:
                h_mass += tl.sum(tl.where(hit, _mass(x, m)[:, None], 0), axis=0)
        above_cnt = tl.sum(tl.where(higher, h_cnt[None, :], 0), axis=1)    # per bin: bins above
        above_mass = tl.sum(tl.where(higher, h_mass[None, :], 0), axis=1)
        if BY_MASS:
            reach = a_mass + above_mass + h_mass >= target
        else:
            reach = a_cnt + above_cnt + h_cnt >= target
        d = tl.max(tl.where(reach, bins, -1), axis=0)
        at = bins == d
        prefix = prefix | (d << shift)
        a_cnt += tl.sum(tl.where(at, above_cnt, 0), axis=0)
        a_mass += tl.sum(tl.where(at, above_mass, 0), axis=0)
        e_cnt = tl.sum(tl.where(at, h_cnt, 0), axis=0)
        e_mass = tl.sum(tl.where(at, h_mass, 0), axis=0)
    return prefix, a_cnt, a_mass, e_cnt, e_mass


@triton.jit
def _filter_kernel(
    logits_ptr, temp_ptr, nn_ptr, topk_ptr, topp_ptr, thx_ptr, thi_ptr,
    N, V, vbits, logits_batch_stride, logits_row_stride,
    HAS_K: tl.constexpr, HAS_P: tl.constexpr, BLOCK_V: tl.constexpr, RADIX: tl.constexpr,
):
    row = tl.program_id(0)
    b = row // N
    n = row % N
    base = logits_ptr + b.to(tl.int64) * logits_batch_stride + n.to(tl.int64) * logits_row_stride
    T = tl.load(temp_ptr + b)
    k = tl.zeros([], tl.int64)
    if HAS_K:
        k = tl.load(topk_ptr + b).to(tl.int64)
    p = tl.full([], 1.0, tl.float32)
    if HAS_P:
        p = tl.load(topp_ptr + b)
    k_on = (k > 0) & (k < V)
    p_on = ~(p >= 1.0)                                     # NaN: on (keeps the top token)
    real = (n == 0) | (n < tl.load(nn_ptr + b))          # padding nodes are never sampled
    thr_key = tl.full([], 8388607, tl.int64)               # _order_key(-inf): keep everything
    thr_id = tl.full([], 2147483647, tl.int32)
    if (T > 0) & real & (k_on | p_on):
        m = tl.full([], float("-inf"), tl.float32)
        z = tl.zeros([], tl.int64)
        for v0 in range(0, V, BLOCK_V):
            v = v0 + tl.arange(0, BLOCK_V)
            x = tl.load(base + v, mask=v < V, other=float("-inf")).to(tl.float32)
            m = tl.maximum(m, tl.max(tl.div_rn(x, T), axis=0))
        ties = tl.zeros([], tl.int64)                      # tokens at the threshold value
        keep_ties = tl.zeros([], tl.int64)                 # how many of them are kept
        if k_on:
            c, a_cnt, a_mass, e_cnt, e_mass = _select(base, V, T, m, k, 0, 32, BY_MASS=False,
                                                      BY_ID=False, BLOCK_V=BLOCK_V, RADIX=RADIX)
            thr_key = c
            ties = e_cnt
            keep_ties = k - a_cnt
            z = a_mass + keep_ties * (e_mass // tl.maximum(e_cnt, 1))     # the top-k set's mass
        else:                                              # top-p of the whole distribution
            for v0 in range(0, V, BLOCK_V):
                v = v0 + tl.arange(0, BLOCK_V)
                x = tl.div_rn(tl.load(base + v, mask=v < V, other=0.0).to(tl.float32), T)
                z += tl.sum(tl.where(v < V, _mass(x, m), 0), axis=0)
        if p_on:
            budget = p.to(tl.float64) * z.to(tl.float64)
            need = budget.to(tl.int64)                     # ceil(budget), at least 1
            need = tl.where(need.to(tl.float64) < budget, need + 1, need)
            need = tl.where(budget >= 1.0, need, 1)
            c, a_cnt, a_mass, e_cnt, e_mass = _select(base, V, T, m, need, 0, 32, BY_MASS=True,
                                                      BY_ID=False, BLOCK_V=BLOCK_V, RADIX=RADIX)
            # Tokens at c are kept while the mass before them stays below the budget. (The maxima
            # only matter for NaN logits, which break the search's invariants.)
            q = tl.maximum(e_mass // tl.maximum(e_cnt, 1), 1)
            kept = tl.minimum(e_cnt, (need - a_mass - 1) // q + 1)
            if k_on:
                keep_ties = tl.where(c == thr_key, tl.minimum(keep_ties, kept), kept)
            else:
                keep_ties = kept
            thr_key = c
            ties = e_cnt
        if keep_ties < ties:                               # the lowest ids among the ties
            c, a_cnt, a_mass, e_cnt, e_mass = _select(base, V, T, m, keep_ties, thr_key, vbits,
                                                      BY_MASS=False, BY_ID=True, BLOCK_V=BLOCK_V,
                                                      RADIX=RADIX)
            thr_id = (V - 1 - c).to(tl.int32)
    tl.store(thx_ptr + row, _key_value(thr_key))
    tl.store(thi_ptr + row, thr_id)


@triton.jit
def _target_partial_kernel(
    logits_ptr, seed_ptr, off_ptr, temp_ptr, thx_ptr, thi_ptr, part_v_ptr, part_i_ptr,
    N, V, chunk, S, logits_batch_stride, logits_row_stride,
    BLOCK_V: tl.constexpr, SAMPLE: tl.constexpr, FILTER: tl.constexpr,
):
    row = tl.program_id(0)
    s = tl.program_id(1)
    b = row // N
    n = row % N
    start = s * chunk
    end = tl.minimum(start + chunk, V)
    base = logits_ptr + b.to(tl.int64) * logits_batch_stride + n.to(tl.int64) * logits_row_stride
    if SAMPLE:
        key = _node_key(seed_ptr, off_ptr, b, n)
        T = tl.load(temp_ptr + b)
        sampled = T > 0                                    # else greedy (this sequence only)
        T = tl.where(sampled, T, 1.0)
        if FILTER:
            thr_x = tl.load(thx_ptr + row)
            thr_id = tl.load(thi_ptr + row)
    best_val = tl.full([], float("-inf"), tl.float32)
    best_idx = start
    for v0 in range(start, end, BLOCK_V):
        v = v0 + tl.arange(0, BLOCK_V)
        m = v < end
        x = tl.load(base + v, mask=m, other=float("-inf")).to(tl.float32)
        if SAMPLE:
            u = _uniform(key, v)
            g = -tl.log(-tl.log(u))
            xs = tl.div_rn(x, T)
            keep = m
            if FILTER:   # a NaN is kept: it is the maximum whatever the filters say
                keep = keep & ((xs > thr_x) | ((xs == thr_x) & (v <= thr_id)) | (xs != xs))
            x = tl.where(sampled, tl.where(keep, xs + g, float("-inf")), x)
        # torch.argmax order: a NaN is the maximum (the first NaN wins), ties to the lower index
        nan = x != x
        tile_nan = tl.max(nan.to(tl.int32), axis=0) > 0
        finite = tl.where(nan, float("-inf"), x)
        tile_max = tl.max(finite, axis=0)
        tile_arg = tl.where(tile_nan, tl.min(tl.where(nan, v, 2147483647), axis=0),
                            v0 + tl.argmax(finite, axis=0, tie_break_left=True))
        better = (best_val == best_val) & (tile_nan | (tile_max > best_val))  # strict: ties stay
        best_idx = tl.where(better, tile_arg, best_idx)
        best_val = tl.where(better, tl.where(tile_nan, float("nan"), tile_max), best_val)
    tl.store(part_v_ptr + row * S + s, best_val)
    tl.store(part_i_ptr + row * S + s, best_idx)


@triton.jit
def _longest_chain(tok, par, valid, tgt, nidx, cidx, max_depth, NP: tl.constexpr,
                   CP: tl.constexpr):
    """Greedy rows: the longest chain of agreeing nodes from the root (a node agrees when its
    token is the target's at its parent), ending at the lowest index among the longest.
    Returns ``(path, emitted without the bonus, accept_len, last node)``."""
    par_ok = valid & (nidx > 0) & (par >= 0) & (par < nidx)
    pidx = tl.where(par_ok, par, 0)
    agree = par_ok & (tok == tl.gather(tgt, pidx, 0))
    level = tl.where(nidx == 0, 0, -1)            # depth on an agreeing chain, -1: none
    for step in range(0, max_depth):
        reached = tl.gather(level, pidx, 0) == step
        level = tl.where(agree & (level < 0) & reached, step + 1, level)
    alen = tl.max(level, axis=0)
    end = tl.min(tl.where(level == alen, nidx, NP), axis=0)
    path = tl.where(cidx == 0, 0, -1)
    emitted = tl.full([CP], -1, tl.int32)
    cur = end
    for up in range(0, max_depth):                # climb from the end to the root
        d = alen - up
        on = d >= 1
        path = tl.where((cidx == d) & on, cur, path)
        emitted = tl.where((cidx == d - 1) & on, tl.sum(tl.where(nidx == cur, tok, 0), axis=0),
                           emitted)
        cur = tl.where(on, tl.sum(tl.where(nidx == cur, par, 0), axis=0), cur)
    return path, emitted, alen, end


@triton.jit
def _walk_kernel(
    tok_ptr, par_ptr, nn_ptr, tgt_ptr, part_v_ptr, temp_ptr,
    acc_ptr, path_ptr, bonus_ptr, emit_ptr,
    N, S, C, max_depth, tokens_batch_stride, parents_batch_stride, target_batch_stride,
    target_row_stride, path_batch_stride, emitted_batch_stride,
    NP: tl.constexpr, SP: tl.constexpr, CP: tl.constexpr, FROM_PARTIALS: tl.constexpr,
    RULE: tl.constexpr,
):
    """RULE: 0 every row greedy (longest agreeing chain), 1 every row sampled (first agreeing
    sibling), 2 per row: sampled where ``temp_ptr[b] > 0``."""
    b = tl.program_id(0)
    nidx = tl.arange(0, NP)
    nmask = nidx < N
    if FROM_PARTIALS:
        sidx = tl.arange(0, SP)[None, :]
        pm = nmask[:, None] & (sidx < S)
        poff = (b * N + nidx)[:, None] * S + sidx
        vals = tl.load(part_v_ptr + poff, mask=pm, other=float("-inf"))
        idxs = tl.load(tgt_ptr + poff, mask=pm, other=2147483647)
        nan = vals != vals                      # a split whose best is NaN: the maximum
        vmax = tl.max(tl.where(nan, float("-inf"), vals), axis=1)
        best = tl.where(tl.max(nan.to(tl.int32), axis=1)[:, None] > 0, nan, vals == vmax[:, None])
        # splits are in vocabulary order, so the lowest index among the maxima is the argmax
        tgt = tl.min(tl.where(best, idxs, 2147483647), axis=1)
    else:
        tgt = tl.load(tgt_ptr + b * target_batch_stride + nidx * target_row_stride, mask=nmask,
                      other=0)
    tok = tl.load(tok_ptr + b * tokens_batch_stride + nidx, mask=nmask, other=0)
    par = tl.load(par_ptr + b * parents_batch_stride + nidx, mask=nmask, other=-2)
    valid = nidx < tl.load(nn_ptr + b)

    cidx = tl.arange(0, CP)
    path = tl.where(cidx == 0, 0, -1)
    emitted = tl.full([CP], -1, tl.int32)
    alen = tl.full([], 0, tl.int32)
    cur = tl.full([], 0, tl.int32)
    if RULE != 0:                                 # the first agreeing sibling, step by step
        alive = tl.full([], 1, tl.int1)
        for step in range(0, max_depth):
            t_cur = tl.sum(tl.where(nidx == cur, tgt, 0), axis=0)
            cand = valid & (par == cur) & (tok == t_cur)
            nxt = tl.min(tl.where(cand, nidx, NP), axis=0)
            alive = alive & (nxt < NP)
            tok_nxt = tl.sum(tl.where(nidx == nxt, tok, 0), axis=0)
            path = tl.where((cidx == step + 1) & alive, nxt, path)
            emitted = tl.where((cidx == step) & alive, tok_nxt, emitted)
            alen = alen + alive.to(tl.int32)
            cur = tl.where(alive, nxt, cur)
    if RULE != 1:
        g_path, g_emitted, g_alen, g_end = _longest_chain(tok, par, valid, tgt, nidx, cidx,
                                                          max_depth, NP, CP)
        if RULE == 0:
            path, emitted, alen, cur = g_path, g_emitted, g_alen, g_end
        else:
            greedy = tl.load(temp_ptr + b) <= 0.0
            path = tl.where(greedy, g_path, path)
            emitted = tl.where(greedy, g_emitted, emitted)
            alen = tl.where(greedy, g_alen, alen)
            cur = tl.where(greedy, g_end, cur)
    bonus = tl.sum(tl.where(nidx == cur, tgt, 0), axis=0)
    emitted = tl.where(cidx == alen, bonus, emitted)
    cm = cidx < C
    tl.store(path_ptr + b * path_batch_stride + cidx, path, mask=cm)
    tl.store(emit_ptr + b * emitted_batch_stride + cidx, emitted, mask=cm)
    tl.store(acc_ptr + b, alen)
    tl.store(bonus_ptr + b, bonus)


def _splits(rows: int, V: int, block_v: int, device: torch.device) -> int:
    """Vocabulary splits per row: enough programs to fill the GPU (about 4 per SM)."""
    if device.type != "cuda" or rows == 0:
        return 1
    want = cdiv(4 * launch_plan.sm_count(device), rows)
    return max(1, min(want, cdiv(V, block_v)))


def _temperatures(temperature, B, device):
    """float32 [B] per-sequence temperatures, or None when every sequence is greedy (the number 0)."""
    if torch.is_tensor(temperature):
        return temperature
    if temperature > 0:
        return torch.full((B,), float(temperature), dtype=torch.float32, device=device)
    return None


def _launch_filter(logits, num_nodes, temps, top_k, top_p, block_v=512, radix=4):
    """Step 0: ``(thr_x float32 [B*N], thr_id int32 [B*N])``, see :func:`filter_thresholds`."""
    B, N, V = logits.shape
    thr_x = torch.empty(B * N, dtype=torch.float32, device=logits.device)
    thr_id = torch.empty(B * N, dtype=torch.int32, device=logits.device)
    if B * N:
        dummy = thr_id
        _filter_kernel[(B * N,)](
            logits, temps, num_nodes, dummy if top_k is None else top_k,
            dummy if top_p is None else top_p, thr_x, thr_id,
            N, V, max(V - 1, 1).bit_length(), logits.stride(0), logits.stride(1),
            HAS_K=top_k is not None, HAS_P=top_p is not None, BLOCK_V=block_v, RADIX=radix,
            num_warps=8,
        )
    return thr_x, thr_id


def _launch_partials(logits, temps, seed, offset, num_splits, block_v, thresholds=None):
    """Step 1: partial (value, index) per row and split; returns ``(partial_value, partial_token, S)``."""
    B, N, V = logits.shape
    if num_splits is None:
        num_splits = _splits(B * N, V, block_v, logits.device)
    chunk = cdiv(cdiv(V, num_splits), block_v) * block_v
    S = cdiv(V, chunk)
    partial_value = torch.empty((B * N, S), dtype=torch.float32, device=logits.device)
    partial_token = torch.empty((B * N, S), dtype=torch.int32, device=logits.device)
    sample = temps is not None
    dummy = partial_token                                  # pointers a greedy / unfiltered launch never reads
    thr_x, thr_id = thresholds if thresholds is not None else (dummy, dummy)
    if B * N:
        _target_partial_kernel[(B * N, S)](
            logits, seed if sample else dummy, offset if sample else dummy,
            temps if sample else dummy, thr_x, thr_id, partial_value, partial_token,
            N, V, chunk, S, logits.stride(0), logits.stride(1),
            BLOCK_V=block_v, SAMPLE=sample, FILTER=thresholds is not None,
            num_warps=8 if block_v >= 2048 else 4,
        )
    return partial_value, partial_token, S


def _block_v(V: int) -> int:
    return min(next_power_of_2(V), 2048)


def launch(tokens, parents, num_nodes, max_depth, target_logits, target_tokens, temperature,
           seed, offset, accept_len, path, bonus, emitted, num_splits=None, block_v=None,
           top_k=None, top_p=None):
    """Run the steps, writing the given outputs (shapes as :func:`verify_tree` returns them).

    ``num_splits`` and ``block_v`` (a power of two) force step 1's vocabulary splits and tile
    width (None: chosen for the device and V); tests use them to reach every reduction path.
    """
    B, N = tokens.shape
    if B == 0:
        return
    temps = _temperatures(temperature, B, tokens.device)
    if target_tokens is not None:
        tgt, partial_value, S, from_partials = target_tokens, None, 1, False
    else:
        thresholds = None
        if temps is not None and (top_k is not None or top_p is not None):
            thresholds = _launch_filter(target_logits, num_nodes, temps, top_k, top_p)
        partial_value, tgt, S = _launch_partials(target_logits, temps, seed, offset, num_splits,
                                        block_v or _block_v(target_logits.shape[2]), thresholds)
        from_partials = True
    C = max_depth + 1
    if temps is None:
        rule = 0
    else:
        rule = 1 if not torch.is_tensor(temperature) else 2
    _walk_kernel[(B,)](
        tokens, parents, num_nodes, tgt, partial_value if from_partials else tgt,
        temps if temps is not None else num_nodes, accept_len, path, bonus, emitted,
        N, S, C, max_depth, tokens.stride(0), parents.stride(0),
        tgt.stride(0), tgt.stride(1), path.stride(0), emitted.stride(0),
        NP=next_power_of_2(max(N, 1)), SP=next_power_of_2(S),
        CP=next_power_of_2(C), FROM_PARTIALS=from_partials, RULE=rule,
    )


def verify_tree(tokens, parents, num_nodes, max_depth, target_logits, target_tokens, temperature,
                seed, offset, top_k=None, top_p=None):
    """Greedy or sampled (filtered) target tokens per node, then the tree acceptance walk.

    Parameters
    ----------
    tokens, parents : int32 ``[B, N]``; num_nodes : int32 ``[B]``; max_depth : int
    target_logits : float ``[B, N, V]`` (last dim contiguous) or None
    target_tokens : int32 ``[B, N]`` or None (used instead of the logits when given)
    temperature : float (0 = greedy) or float32 ``[B]`` (0 = greedy for that sequence)
    seed, offset : int64 ``[B]`` (sampling only)
    top_k : int32 ``[B]`` or None; top_p : float32 ``[B]`` or None (python_ref.filter_keep)

    Returns
    -------
    accept_len int32 ``[B]``, path int32 ``[B, max_depth + 1]``, bonus int32 ``[B]``,
    emitted int32 ``[B, max_depth + 1]`` (see python_ref.verify_tree).
    """
    B = tokens.shape[0]
    dev = tokens.device
    accept_len = torch.empty(B, dtype=torch.int32, device=dev)
    bonus = torch.empty(B, dtype=torch.int32, device=dev)
    path = torch.empty((B, max_depth + 1), dtype=torch.int32, device=dev)
    emitted = torch.empty((B, max_depth + 1), dtype=torch.int32, device=dev)
    launch(tokens, parents, num_nodes, max_depth, target_logits, target_tokens, temperature,
           seed, offset, accept_len, path, bonus, emitted, top_k=top_k, top_p=top_p)
    return accept_len, path, bonus, emitted


def filter_thresholds(logits, temperature, top_k=None, top_p=None, num_nodes=None):
    """Step 0 on its own: the last token each node's filters keep.

    Parameters
    ----------
    logits : float ``[B, N, V]``; temperature : float > 0 or float32 ``[B]``
    top_k : int32 ``[B]`` or None; top_p : float32 ``[B]`` or None
    num_nodes : int32 ``[B]`` or None (all N nodes)

    Returns
    -------
    ``(thr_x float32 [B, N], thr_id int32 [B, N])``: node (b, n) keeps token v iff
    ``x > thr_x or (x == thr_x and v <= thr_id)``, ``x = logits[b, n, v] / T[b]`` (float32);
    ``(-inf, 2**31 - 1)`` keeps everything (greedy, padding, or no filter on).
    """
    B, N, V = logits.shape
    temps = _temperatures(temperature, B, logits.device)
    if num_nodes is None:
        num_nodes = torch.full((B,), N, dtype=torch.int32, device=logits.device)
    thr_x, thr_id = _launch_filter(logits, num_nodes, temps, top_k, top_p)
    return thr_x.view(B, N), thr_id.view(B, N)
