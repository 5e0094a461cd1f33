"""Triton kernels for ``verify_tree``: per-node target tokens, then the acceptance walk.

Step 1 (``_target_partial_kernel``, grid ``[B*N, S]``): each program scans one vocabulary split of
one node's logits and writes the best score and its index (greedy: the logit; sampling: the
Gumbel-max score ``logit / T + g``). Splits give small batches enough programs for V = 151936.
Step 2 (``_walk_kernel``, grid ``[B]``): one program per sequence folds the S partials into the
node's target token (ties to the lower index), then walks the tree from the root, vectorised over
the N nodes, for at most ``max_depth`` steps, and writes every output element. Nothing syncs with
the host. Given ``target_tokens``, step 1 is skipped and the walk reads them directly.

The Gumbel noise is the counter hash of CONTRIBUTING.md on uint32 lanes, bit-exact with
``python_ref.gumbel_uniform`` (see :func:`gumbel_uniform` here, used by the tests to check it).
"""
from __future__ import annotations

from functools import lru_cache

import torch
import triton
import triton.language as tl

__all__ = ["verify_tree", "sample_tokens", "gumbel_uniform"]


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
def _target_partial_kernel(
    logits_ptr, seed_ptr, off_ptr, pval_ptr, pidx_ptr,
    N, V, chunk, S, sl_b, sl_n, temperature,
    BLOCK_V: tl.constexpr, SAMPLE: tl.constexpr,
):
    row = tl.program_id(0)
    s = tl.program_id(1)
    b = row // N
    n = row % N
    start = s * chunk
    end = tl.minimum(start + chunk, V)
    base = logits_ptr + b.to(tl.int64) * sl_b + n.to(tl.int64) * sl_n
    if SAMPLE:
        key = _node_key(seed_ptr, off_ptr, b, n)
    best_val = tl.full([], float("-inf"), tl.float32)
    best_idx = start
    for v0 in range(start, end, BLOCK_V):
        v = v0 + tl.arange(0, BLOCK_V)
        m = v < end
        x = tl.load(base + v, mask=m, other=float("-inf")).to(tl.float32)
        if SAMPLE:
            u = _uniform(key, v)
            g = -tl.log(-tl.log(u))
            x = tl.where(m, tl.div_rn(x, temperature) + g, float("-inf"))
        tile_max = tl.max(x, axis=0)
        tile_arg = tl.argmax(x, axis=0, tie_break_left=True)
        better = tile_max > best_val            # strict: an earlier tile keeps a tie
        best_idx = tl.where(better, v0 + tile_arg, best_idx)
        best_val = tl.maximum(best_val, tile_max)
    tl.store(pval_ptr + row * S + s, best_val)
    tl.store(pidx_ptr + row * S + s, best_idx)


@triton.jit
def _walk_kernel(
    tok_ptr, par_ptr, nn_ptr, tgt_ptr, pval_ptr,
    acc_ptr, path_ptr, bonus_ptr, emit_ptr,
    N, S, C, max_depth, st_b, sp_b, stg_b, stg_n, so_path, so_emit,
    NP: tl.constexpr, SP: tl.constexpr, CP: tl.constexpr, FROM_PARTIALS: tl.constexpr,
):
    b = tl.program_id(0)
    nidx = tl.arange(0, NP)
    nmask = nidx < N
    if FROM_PARTIALS:
        sidx = tl.arange(0, SP)[None, :]
        pm = nmask[:, None] & (sidx < S)
        poff = (b * N + nidx)[:, None] * S + sidx
        vals = tl.load(pval_ptr + poff, mask=pm, other=float("-inf"))
        idxs = tl.load(tgt_ptr + poff, mask=pm, other=2147483647)
        vmax = tl.max(vals, axis=1)
        # splits are in vocabulary order, so the lowest index among the maxima is the argmax
        tgt = tl.min(tl.where(vals == vmax[:, None], idxs, 2147483647), axis=1)
    else:
        tgt = tl.load(tgt_ptr + b * stg_b + nidx * stg_n, mask=nmask, other=0)
    tok = tl.load(tok_ptr + b * st_b + nidx, mask=nmask, other=0)
    par = tl.load(par_ptr + b * sp_b + nidx, mask=nmask, other=-2)
    valid = nidx < tl.load(nn_ptr + b)

    cidx = tl.arange(0, CP)
    path = tl.where(cidx == 0, 0, -1)
    emitted = tl.full([CP], -1, tl.int32)
    alen = tl.full([], 0, tl.int32)
    cur = tl.full([], 0, tl.int32)
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
    bonus = tl.sum(tl.where(nidx == cur, tgt, 0), axis=0)
    emitted = tl.where(cidx == alen, bonus, emitted)
    cm = cidx < C
    tl.store(path_ptr + b * so_path + cidx, path, mask=cm)
    tl.store(emit_ptr + b * so_emit + cidx, emitted, mask=cm)
    tl.store(acc_ptr + b, alen)
    tl.store(bonus_ptr + b, bonus)


@lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _splits(rows: int, V: int, block_v: int, device: torch.device) -> int:
    """Vocabulary splits per row: enough programs to fill the GPU (about 4 per SM)."""
    if device.type != "cuda" or rows == 0:
        return 1
    want = triton.cdiv(4 * _sm_count(device.index or 0), rows)
    return max(1, min(want, triton.cdiv(V, block_v)))


def _launch_partials(logits, temperature, seed, offset, num_splits, block_v):
    """Step 1: partial (value, index) per row and split; returns ``(pval, pidx, S)``."""
    B, N, V = logits.shape
    if num_splits is None:
        num_splits = _splits(B * N, V, block_v, logits.device)
    chunk = triton.cdiv(triton.cdiv(V, num_splits), block_v) * block_v
    S = triton.cdiv(V, chunk)
    pval = torch.empty((B * N, S), dtype=torch.float32, device=logits.device)
    pidx = torch.empty((B * N, S), dtype=torch.int32, device=logits.device)
    sample = temperature > 0
    dummy = pidx                                    # seed/offset pointers, unread when greedy
    if B * N:
        _target_partial_kernel[(B * N, S)](
            logits, seed if sample else dummy, offset if sample else dummy, pval, pidx,
            N, V, chunk, S, logits.stride(0), logits.stride(1), float(temperature),
            BLOCK_V=block_v, SAMPLE=sample, num_warps=8 if block_v >= 2048 else 4,
        )
    return pval, pidx, S


def _block_v(V: int) -> int:
    return min(triton.next_power_of_2(V), 2048)


def launch(tokens, parents, num_nodes, max_depth, target_logits, target_tokens, temperature,
           seed, offset, accept_len, path, bonus, emitted, num_splits=None, block_v=None):
    """Run both steps, writing the given outputs (shapes as :func:`verify_tree` returns them).

    ``num_splits`` and ``block_v`` (a power of two) force step 1's vocabulary splits and tile
    width (None: chosen for the device and V); tests use them to reach every reduction path.
    """
    B, N = tokens.shape
    if B == 0:
        return
    if target_tokens is not None:
        tgt, pval, S, from_partials = target_tokens, None, 1, False
    else:
        pval, tgt, S = _launch_partials(target_logits, temperature, seed, offset, num_splits,
                                        block_v or _block_v(target_logits.shape[2]))
        from_partials = True
    C = max_depth + 1
    _walk_kernel[(B,)](
        tokens, parents, num_nodes, tgt, pval if from_partials else tgt,
        accept_len, path, bonus, emitted,
        N, S, C, max_depth, tokens.stride(0), parents.stride(0),
        tgt.stride(0), tgt.stride(1), path.stride(0), emitted.stride(0),
        NP=triton.next_power_of_2(max(N, 1)), SP=triton.next_power_of_2(S),
        CP=triton.next_power_of_2(C), FROM_PARTIALS=from_partials,
    )


def verify_tree(tokens, parents, num_nodes, max_depth, target_logits, target_tokens, temperature,
                seed, offset):
    """Greedy or sampled target tokens per node, then the tree acceptance walk.

    Parameters
    ----------
    tokens, parents : int32 ``[B, N]``; num_nodes : int32 ``[B]``; max_depth : int
    target_logits : float ``[B, N, V]`` (last dim contiguous) or None
    target_tokens : int32 ``[B, N]`` or None (used instead of the logits when given)
    temperature : float (0 = greedy); seed, offset : int64 ``[B]`` (sampling only)

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
           seed, offset, accept_len, path, bonus, emitted)
    return accept_len, path, bonus, emitted


def sample_tokens(logits, temperature, seed=None, offset=None):
    """The target token per node that step 1 computes (one vocabulary split).

    Parameters
    ----------
    logits : float ``[B, N, V]``; temperature : float; seed, offset : int64 ``[B]``

    Returns
    -------
    int32 ``[B, N]``: argmax (temperature 0) or the Gumbel-max sample, ties to the lower id.
    """
    B, N, V = logits.shape
    _, pidx, _ = _launch_partials(logits, temperature, seed, offset, 1, _block_v(V))
    return pidx.view(B, N)


@triton.jit
def _uniform_kernel(seed_ptr, off_ptr, u_ptr, N, V, BLOCK_V: tl.constexpr):
    row = tl.program_id(0)
    b = row // N
    n = row % N
    key = _node_key(seed_ptr, off_ptr, b, n)
    for v0 in range(0, V, BLOCK_V):
        v = v0 + tl.arange(0, BLOCK_V)
        tl.store(u_ptr + row.to(tl.int64) * V + v, _uniform(key, v), mask=v < V)


def gumbel_uniform(seed, offset, N, V):
    """The uniforms behind the sampling kernel, for checking against python_ref.

    Parameters
    ----------
    seed, offset : int64 ``[B]``; N, V : int

    Returns
    -------
    float32 ``[B, N, V]`` in (0, 1).
    """
    B = seed.shape[0]
    u = torch.empty((B, N, V), dtype=torch.float32, device=seed.device)
    if u.numel():
        _uniform_kernel[(B * N,)](seed, offset, u, N, V, BLOCK_V=_block_v(V))
    return u
