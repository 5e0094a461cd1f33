"""Triton per-depth log-softmax top-K of logits (``triton/hidden_topk.py`` fuses it with the lm_head
matmul and shares this file's partial and merge steps).

Two launches, no host sync:

1. a *partial* kernel, grid ``[rows, chunks]``: each program reduces one vocabulary chunk of one
   row (or, for :func:`hidden_topk`, of a block of rows whose logits it computes with ``tl.dot``)
   to its max, its sum of ``exp(x - max)`` and its local top-K;
2. a *merge* kernel, grid ``[rows]``: folds the partial (max, sumexp) into the log-sum-exp and
   the partial top-Ks into the row's top-K, and writes ``logp = (x - max) - log(sumexp)``.

Top-K inside a program works on 64-bit keys ``(order(x) << 32) | (2**31 - 1 - token)`` where
``order`` maps the fp32 bit pattern to a signed int32 with the same order as the float: one
integer max per round gives the largest value and, among equal values, the lowest token id; the
winner is then masked out. K rounds of that cost K vector reductions, cheap for K <= 16 and
still correct (just slower) up to K = 64. The selection runs on the logits; log-softmax is a
monotone shift of a row, so the chosen tokens are the same (up to values that differ only below
float32 rounding of the log-probs, where the reference may order by token id instead).

Floor and predicted time: ``docs/perf/log_softmax_topk.md``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .sizes import cdiv, next_power_of_2

__all__ = ["log_softmax_topk"]

# Smaller than every real key: real keys have a low word in (0, 2**31).
_NEG_KEY = tl.constexpr(-(2**63))


@triton.jit
def _keys(x, tok):
    """fp32 values and int32 token ids -> int64 keys (larger value, then lower token, is larger)."""
    x = tl.where(x == 0.0, 0.0, x)  # -0.0 and +0.0 compare equal as floats
    bits = x.to(tl.int32, bitcast=True)
    ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return (ordered.to(tl.int64) << 32) | (0x7FFFFFFF - tok).to(tl.int64)


@triton.jit
def _key_value(key):
    """Inverse of :func:`_keys` for the value (fp32)."""
    ordered = (key >> 32).to(tl.int32)
    bits = tl.where(ordered < 0, ordered ^ 0x7FFFFFFF, ordered)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _key_token(key):
    """Inverse of :func:`_keys` for the token id (int32)."""
    return 0x7FFFFFFF - (key & 0x7FFFFFFF).to(tl.int32)


@triton.jit
def _merge_topk(acc, tile, K, KP: tl.constexpr):
    """Row-wise top-K of the union of ``acc [R, KP]`` and ``tile [R, T]`` (int64 keys, distinct
    except for the sentinel); returns ``[R, KP]`` sorted descending, sentinel-padded."""
    slot = tl.arange(0, KP)[None, :]
    out = tl.full(acc.shape, _NEG_KEY, tl.int64)
    for i in range(K):
        best = tl.maximum(tl.max(tile, axis=1), tl.max(acc, axis=1))[:, None]
        out = tl.where(slot == i, best, out)
        tile = tl.where(tile == best, _NEG_KEY, tile)
        acc = tl.where(acc == best, _NEG_KEY, acc)
    return out


@triton.jit
def write_partials(x, tok, valid, rows, rows_ok, chunk, C, pm_ptr, ps_ptr, pk_ptr,
                    K, KP: tl.constexpr):
    """Reduce a ``[R, T]`` tile of logits (``valid`` marks real entries) to per-row partials."""
    x = tl.where(valid, x, float("-inf"))
    m = tl.max(x, axis=1)
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # an all -inf chunk must not give NaN
    s = tl.sum(tl.where(valid, tl.exp(x - m_safe[:, None]), 0.0), axis=1)
    keys = tl.where(valid, _keys(x, tok), _NEG_KEY)
    top = _merge_topk(tl.full([x.shape[0], KP], _NEG_KEY, tl.int64), keys, K, KP)
    part = rows.to(tl.int64) * C + chunk
    tl.store(pm_ptr + part, m, mask=rows_ok)
    tl.store(ps_ptr + part, s, mask=rows_ok)
    kk = tl.arange(0, KP)[None, :]
    tl.store(pk_ptr + part[:, None] * KP + kk, top, mask=rows_ok[:, None])


@triton.jit
def _logits_partial_kernel(x_ptr, logits_batch_stride, logits_row_stride, D, V, C,
                           pm_ptr, ps_ptr, pk_ptr,
                           K, KP: tl.constexpr, BLOCK_V: tl.constexpr):
    """Grid ``[B*D, C]``: partial (max, sumexp, top-K) of one vocabulary chunk of one row."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    b = row // D
    d = row % D
    tok = chunk * BLOCK_V + tl.arange(0, BLOCK_V)[None, :]
    valid = tok < V
    base = x_ptr + b.to(tl.int64) * logits_batch_stride + d.to(tl.int64) * logits_row_stride
    x = tl.load(base + tok, mask=valid, other=float("-inf")).to(tl.float32)
    rows = tl.full([1], 0, tl.int32) + row
    write_partials(x, tok, valid, rows, rows >= 0, chunk, C, pm_ptr, ps_ptr, pk_ptr, K, KP)


@triton.jit
def _merge_kernel(pm_ptr, ps_ptr, pk_ptr, C, tok_ptr, lp_ptr, K, KP: tl.constexpr,
                  BLOCK_C: tl.constexpr, TILE: tl.constexpr):
    """Grid ``[rows]``: log-sum-exp of the C partials, top-K of the C*KP partial keys."""
    row = tl.program_id(0).to(tl.int64)
    cc = tl.arange(0, BLOCK_C)
    m_max = tl.full([BLOCK_C], float("-inf"), tl.float32)
    for c0 in range(0, C, BLOCK_C):
        m = tl.load(pm_ptr + row * C + c0 + cc, mask=c0 + cc < C, other=float("-inf"))
        m_max = tl.maximum(m_max, m)
    big = tl.max(m_max, axis=0)
    big_safe = tl.where(big == float("-inf"), 0.0, big)
    ssum = tl.zeros([BLOCK_C], tl.float32)
    for c0 in range(0, C, BLOCK_C):
        ok = c0 + cc < C
        m = tl.load(pm_ptr + row * C + c0 + cc, mask=ok, other=float("-inf"))
        s = tl.load(ps_ptr + row * C + c0 + cc, mask=ok, other=0.0)
        ssum += tl.where(ok, s * tl.exp(m - big_safe), 0.0)
    log_s = tl.log(tl.sum(ssum, axis=0))

    top = tl.full([1, KP], _NEG_KEY, tl.int64)
    tt = tl.arange(0, TILE)[None, :]
    n_keys = C * KP
    for t0 in range(0, n_keys, TILE):
        tile = tl.load(pk_ptr + row * n_keys + t0 + tt, mask=t0 + tt < n_keys, other=_NEG_KEY)
        top = _merge_topk(top, tile, K, KP)
    kk = tl.arange(0, KP)[None, :]
    out = row * K + kk
    tl.store(tok_ptr + out, _key_token(top), mask=kk < K)
    tl.store(lp_ptr + out, (_key_value(top) - big) - log_s, mask=kk < K)


def merge_partials(pm, ps, pk, rows_shape, k, device):
    """Launch the merge kernel over the partials; returns (tokens int32, logprobs fp32)."""
    R, C, KP = pk.shape
    tokens = torch.empty(*rows_shape, k, dtype=torch.int32, device=device)
    logprobs = torch.empty(*rows_shape, k, dtype=torch.float32, device=device)
    if R:
        block_c = min(next_power_of_2(C), 1024)
        tile = min(next_power_of_2(C * KP), 4096)
        _merge_kernel[(R,)](pm, ps, pk, C, tokens, logprobs, k, KP=KP, BLOCK_C=block_c,
                            TILE=tile, num_warps=4)
    return tokens, logprobs


def log_softmax_topk(logits, k, *, block_v=None):
    """Top-K of the per-depth log-softmax over the full vocabulary.

    Parameters
    ----------
    logits : float32/float16/bfloat16 ``[B, D, V]``, last dim contiguous
    k : int, ``1 <= k <= min(MAX_TOPK, V)`` (jetspec_kernels.limits)
    block_v : int, optional
        Vocabulary chunk per program (a power of two >= 16); default ``min(4096, next_pow2(V))``.

    Returns
    -------
    topk_tokens : int32 ``[B, D, k]``, by descending log-prob, ties to the lower token id
    topk_logprobs : float32 ``[B, D, k]``, ``log_softmax(logits.float())`` at those tokens
    """
    B, D, V = logits.shape
    R = B * D
    bv = block_v or min(4096, max(16, next_power_of_2(V)))
    C = cdiv(V, bv)
    KP = max(2, next_power_of_2(k))
    dev = logits.device
    pm = torch.empty(R, C, dtype=torch.float32, device=dev)
    ps = torch.empty(R, C, dtype=torch.float32, device=dev)
    pk = torch.empty(R, C, KP, dtype=torch.int64, device=dev)
    if R:
        _logits_partial_kernel[(R, C)](logits, logits.stride(0), logits.stride(1), D, V, C,
                                       pm, ps, pk, k, KP=KP, BLOCK_V=bv,
                                       num_warps=8 if bv >= 4096 else 4)
    return merge_partials(pm, ps, pk, (B, D), k, dev)
