"""Triton kernel for ``qk_norm_rope_append``: per-head RMSNorm of q and k, RoPE, K/V cache append.

One program per token row ``(b, n)`` handles all of its heads: the RoPE angles are computed once
per row and shared by the q and k heads. Without q (``HAS_Q=False``: K/V-only appends such as
the draft head's context rows) no q load, norm, rotation or store is emitted; without the norm
(``NORM=False``: targets without QK-norm) no weight is read; with partial rotary (``ROT < DH``)
the dims past ``ROT`` pass unrotated. The cos/sin tables follow python_ref/qk_norm_rope_append.py bit for bit
where it matters for long positions: ``inv_freq`` is ``theta ** (-2i / ROT)`` in float64 rounded
to float32, the angle is ONE float32 multiply ``float32(position) * inv_freq``, and cos/sin of
that float32 angle are evaluated in float64. Everything else is float32.
"""
from __future__ import annotations

import struct

import torch
import triton
import triton.language as tl

from .sizes import next_power_of_2

__all__ = ["qk_norm_rope_append"]


@triton.jit
def _norm_rope_tile(row_ptrs, j, jp, w1, w2, wp, cos, sin, mask, pmask, eps, DH: tl.constexpr,
                    RH: tl.constexpr, ROT: tl.constexpr, HAS_PASS: tl.constexpr,
                    NORM: tl.constexpr):
    """RMSNorm (``NORM``) + rotate-half RoPE of ``[heads, .]`` tiles of one row of heads: the
    rotated halves ``x[j]``, ``x[RH + j]`` (``j < RH``, ``RH = ROT / 2``) and, with partial
    rotary (``HAS_PASS``), the dims past ``ROT`` (``x[ROT + jp]``), which pass unrotated."""
    x1 = tl.load(row_ptrs + j, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(row_ptrs + RH + j, mask=mask, other=0.0).to(tl.float32)
    xp = x1
    if HAS_PASS:
        xp = tl.load(row_ptrs + ROT + jp, mask=pmask, other=0.0).to(tl.float32)
    if NORM:
        ss = tl.sum(x1 * x1 + x2 * x2, axis=1)
        if HAS_PASS:
            ss += tl.sum(xp * xp, axis=1)
        r = tl.rsqrt(tl.div_rn(ss, DH) + eps)[:, None]
        x1 = x1 * r * w1
        x2 = x2 * r * w2
        if HAS_PASS:
            xp = xp * r * wp
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin, xp


@triton.jit
def _qk_norm_rope_append_kernel(
    q_ptr, k_ptr, v_ptr, qo_ptr, qw_ptr, kw_ptr, pos_ptr, start_ptr, kc_ptr, vc_ptr, bt_ptr,
    N, HQ, HKV, page_size,
    q_batch_stride, q_row_stride, q_head_stride,
    k_batch_stride, k_row_stride, k_head_stride,
    v_batch_stride, v_row_stride, v_head_stride,
    q_out_batch_stride, q_out_row_stride, q_out_head_stride,
    positions_batch_stride, positions_row_stride,
    k_cache_batch_stride, k_cache_row_stride, k_cache_head_stride,
    v_cache_batch_stride, v_cache_row_stride, v_cache_head_stride,
    block_table_batch_stride,
    theta_hi, theta_lo, eps,
    DH: tl.constexpr, HALF_P: tl.constexpr, BH_Q: tl.constexpr, BH_K: tl.constexpr,
    PAGED: tl.constexpr, HAS_START: tl.constexpr, HAS_Q: tl.constexpr, NORM: tl.constexpr,
    ROT: tl.constexpr, PASS_P: tl.constexpr,
):
    """ROT: the rotated dims (DH, or fewer: partial rotary); PASS_P: a power of two >= DH - ROT."""
    HALF: tl.constexpr = DH // 2
    RH: tl.constexpr = ROT // 2
    HAS_PASS: tl.constexpr = ROT < DH
    pid = tl.program_id(0)
    b = (pid // N).to(tl.int64)
    n = (pid % N).to(tl.int64)

    j = tl.arange(0, HALF_P)
    jm = j < HALF                 # v's halves
    jr = j < RH                   # the rotated pairs
    jp = tl.arange(0, PASS_P)
    jpm = jp < DH - ROT           # the dims that pass
    pos = tl.load(pos_ptr + b * positions_batch_stride + n * positions_row_stride)

    # inv_freq = float32(theta ** (-2j/ROT)) with the power in float64; theta arrives as an exact
    # float32 hi/lo pair because scalar kernel arguments are float32.
    theta = tl.zeros([HALF_P], dtype=tl.float64) + theta_hi + theta_lo
    expo = (j.to(tl.float64) * -2.0) / ROT
    inv_freq = tl.exp(expo * tl.log(theta)).to(tl.float32)
    angle = (pos.to(tl.float32) * inv_freq).to(tl.float64)
    cos = tl.cos(angle).to(tl.float32)[None, :]
    sin = tl.sin(angle).to(tl.float32)[None, :]

    d = j[None, :]
    dp = jp[None, :]
    kw1 = cos                     # dummies without the norm (never read)
    kw2 = cos
    kwp = cos
    if NORM:
        kw1 = tl.load(kw_ptr + d, mask=jr[None, :], other=0.0).to(tl.float32)
        kw2 = tl.load(kw_ptr + RH + d, mask=jr[None, :], other=0.0).to(tl.float32)
        if HAS_PASS:
            kwp = tl.load(kw_ptr + ROT + dp, mask=jpm[None, :], other=0.0).to(tl.float32)

    if HAS_Q:
        qw1 = cos
        qw2 = cos
        qwp = cos
        if NORM:
            qw1 = tl.load(qw_ptr + d, mask=jr[None, :], other=0.0).to(tl.float32)
            qw2 = tl.load(qw_ptr + RH + d, mask=jr[None, :], other=0.0).to(tl.float32)
            if HAS_PASS:
                qwp = tl.load(qw_ptr + ROT + dp, mask=jpm[None, :], other=0.0).to(tl.float32)
        for h0 in range(0, HQ, BH_Q):
            h = h0 + tl.arange(0, BH_Q)[:, None]
            m = (h < HQ) & jr[None, :]
            pm = (h < HQ) & jpm[None, :]
            q_row = q_ptr + b * q_batch_stride + n * q_row_stride + h * q_head_stride
            o1, o2, op = _norm_rope_tile(q_row, d, dp, qw1, qw2, qwp, cos, sin, m, pm, eps, DH,
                                         RH, ROT, HAS_PASS, NORM)
            o_row = qo_ptr + b * q_out_batch_stride + n * q_out_row_stride + h * q_out_head_stride
            tl.store(o_row + d, o1.to(qo_ptr.dtype.element_ty), mask=m)
            tl.store(o_row + RH + d, o2.to(qo_ptr.dtype.element_ty), mask=m)
            if HAS_PASS:
                tl.store(o_row + ROT + dp, op.to(qo_ptr.dtype.element_ty), mask=pm)

    if HAS_START:
        slot = tl.load(start_ptr + b).to(tl.int64) + n
    else:
        slot = pos.to(tl.int64)
    if PAGED:
        c0 = tl.load(bt_ptr + b * block_table_batch_stride + slot // page_size).to(tl.int64)
        c1 = slot % page_size
    else:
        c0 = b
        c1 = slot

    for h0 in range(0, HKV, BH_K):
        h = h0 + tl.arange(0, BH_K)[:, None]
        m = (h < HKV) & jr[None, :]
        pm = (h < HKV) & jpm[None, :]
        k_row = k_ptr + b * k_batch_stride + n * k_row_stride + h * k_head_stride
        o1, o2, op = _norm_rope_tile(k_row, d, dp, kw1, kw2, kwp, cos, sin, m, pm, eps, DH, RH,
                                     ROT, HAS_PASS, NORM)
        kc_row = kc_ptr + c0 * k_cache_batch_stride + c1 * k_cache_row_stride + h * k_cache_head_stride
        tl.store(kc_row + d, o1.to(kc_ptr.dtype.element_ty), mask=m)
        tl.store(kc_row + RH + d, o2.to(kc_ptr.dtype.element_ty), mask=m)
        if HAS_PASS:
            tl.store(kc_row + ROT + dp, op.to(kc_ptr.dtype.element_ty), mask=pm)
        mv = (h < HKV) & jm[None, :]
        v_ptrs = v_ptr + b * v_batch_stride + n * v_row_stride + h * v_head_stride + d
        vc_ptrs = (vc_ptr + c0 * v_cache_batch_stride + c1 * v_cache_row_stride
                   + h * v_cache_head_stride + d)
        v1 = tl.load(v_ptrs, mask=mv, other=0.0)
        v2 = tl.load(v_ptrs + HALF, mask=mv, other=0.0)
        tl.store(vc_ptrs, v1.to(vc_ptr.dtype.element_ty), mask=mv)
        tl.store(vc_ptrs + HALF, v2.to(vc_ptr.dtype.element_ty), mask=mv)


def _f32_split(x: float) -> tuple[float, float]:
    """``x`` as ``hi + lo`` with both float32-representable (about 48 bits of ``x``)."""
    hi = struct.unpack("f", struct.pack("f", x))[0]
    lo = struct.unpack("f", struct.pack("f", x - hi))[0]
    return hi, lo


def _heads_per_tile(heads: int, half_p: int) -> int:
    """Heads per tile: all of them when small, else 512 elements per half-tile (larger tiles
    spill registers on sm_90a at 4 warps: docs/kernels.md, "Triton kernels compiled offline")."""
    return min(next_power_of_2(max(heads, 1)), max(1, 512 // half_p))


def launch(q, k, v, q_norm_w, k_norm_w, positions, k_cache, v_cache, rope_theta, eps,
           block_table, cache_start, q_out, rotary_dim=None):
    """Run the kernel, writing ``q_out`` (any strides, last dim contiguous) and the caches.

    Parameters are those of :func:`qk_norm_rope_append`; ``q_out`` is ``[B, N, Hq, Dh]``, or None
    together with ``q`` (K/V only; ``q_norm_w`` is then ignored and may be None).
    """
    B, N, _, DH = k.shape
    HKV = k.shape[2]
    if B * N == 0:
        return
    has_q = q is not None
    if has_q != (q_out is not None):
        raise ValueError("q and q_out must be given together")
    HQ = q.shape[2] if has_q else 0
    half_p = next_power_of_2(DH // 2)
    paged = block_table is not None
    bt = block_table if paged else positions      # dummy pointer, never read when not paged
    start = cache_start if cache_start is not None else positions
    # Without q the q pointers are dummies (never read or written: HAS_Q=False).
    qx = q if has_q else k
    qo = q_out if has_q else k
    norm = k_norm_w is not None
    kw = k_norm_w if norm else k                  # dummies without the norm: never read
    qw = q_norm_w if has_q and norm else kw
    rot = DH if rotary_dim is None else rotary_dim
    theta_hi, theta_lo = _f32_split(float(rope_theta))
    _qk_norm_rope_append_kernel[(B * N,)](
        qx, k, v, qo, qw, kw, positions, start, k_cache, v_cache, bt,
        N, HQ, HKV, k_cache.shape[1],
        qx.stride(0), qx.stride(1), qx.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), qo.stride(0), qo.stride(1), qo.stride(2),
        positions.stride(0), positions.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        bt.stride(0) if paged else 0,
        theta_hi, theta_lo, float(eps),
        DH=DH, HALF_P=half_p, BH_Q=_heads_per_tile(HQ, half_p), BH_K=_heads_per_tile(HKV, half_p),
        PAGED=paged, HAS_START=cache_start is not None, HAS_Q=has_q, NORM=norm, ROT=rot,
        PASS_P=1 if rot == DH else next_power_of_2(DH - rot),
    )


def qk_norm_rope_append(q, k, v, q_norm_w, k_norm_w, positions, k_cache, v_cache, rope_theta, eps,
                        block_table, cache_start, rotary_dim=None):
    """Per-head RMSNorm of q and k, NeoX RoPE at ``positions``, and the K/V cache append.

    Parameters
    ----------
    q : float32/float16/bfloat16 ``[B, N, Hq, Dh]``, or None (K/V only)
    k, v : q.dtype ``[B, N, Hkv, Dh]`` (any strides with the last dim contiguous)
    q_norm_w : float ``[Dh]`` (None allowed when q is None); k_norm_w : float ``[Dh]``, or None
        with q_norm_w None: no norm
    positions : int32/int64 ``[B, N]``
    k_cache, v_cache : ``[B, L, Hkv, Dh]`` or paged ``[P, page_size, Hkv, Dh]`` (any float dtype;
        values are cast on store). Row n goes to slot ``positions[b, n]``, or
        ``cache_start[b] + n`` when ``cache_start`` (int32 ``[B]``) is given.
    rope_theta, eps : float
    block_table : int32 ``[B, max_pages]`` or None
    rotary_dim : even int < Dh (partial rotary: the first rotary_dim dims rotate), or None

    Returns
    -------
    q_out : q.dtype ``[B, N, Hq, Dh]`` (contiguous), or None when q is None.
    """
    q_out = None if q is None else torch.empty(q.shape, dtype=q.dtype, device=q.device)
    launch(q, k, v, q_norm_w, k_norm_w, positions, k_cache, v_cache, rope_theta, eps,
           block_table, cache_start, q_out, rotary_dim)
    return q_out
