"""Triton ``silu_mul``: SwiGLU's ``silu(gate) * up`` over the rows of the gate/up GEMM's output.

Grid ``[R, ceil(I / BLOCK)]``: a program per row and column block reads BLOCK gates and BLOCK ups
and writes BLOCK outputs. Numerics as python_ref.silu_mul with ``dtype=x.dtype``: the silu in
float32 with an exp accurate to a few ulps at every |g| and a correctly rounded division
(Triton's ``tl.exp`` scales its argument by log2(e) before an approximate 2^x, which loses about
|g| * 6e-8 relatively; its ``/`` is approximate too), rounded to x's dtype, then the product in
float32, rounded.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .sizes import cdiv, next_power_of_2

__all__ = ["silu_mul", "BLOCK"]

BLOCK = 1024  # columns a program


@triton.jit
def _pow2(k):
    """2^k for integer-valued float32 k in [-126, 127], built from its exponent bits (exact)."""
    return ((k.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _exp(x):
    """exp(x) in float32: x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts, so r is nearly
    exact), exp(r) by tl.exp (a small argument keeps its scaling error small), times 2^n in two
    exact factors (one would overflow at n = 128 where exp(x) is still finite). NaN stays NaN (r);
    n is clamped, so a huge |x| gives inf or 0 through exp(r)."""
    n = tl.minimum(tl.maximum(tl.floor(x * 1.4426950408889634 + 0.5), -150.0), 128.0)
    r = x - n * 0.693145751953125
    r = r - n * 1.4286068203094172e-06
    half = tl.floor(n * 0.5)
    return tl.exp(r) * _pow2(half) * _pow2(n - half)


@triton.jit
def _silu_mul(x_ptr, x_stride, out_ptr, inner, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < inner
    g = tl.load(x_ptr + row * x_stride + cols, mask=ok, other=0.0)
    u = tl.load(x_ptr + row * x_stride + inner + cols, mask=ok, other=0.0)
    gf = g.to(tl.float32)
    s = tl.math.div_rn(gf, 1.0 + _exp(-gf)).to(g.dtype)
    tl.store(out_ptr + row * inner + cols, (s.to(tl.float32) * u.to(tl.float32)).to(g.dtype),
             mask=ok)


def silu_mul(x):
    """``silu(gate) * up`` of each row of ``x``, as ``jetspec_kernels.silu_mul``.

    Parameters
    ----------
    x : float32/float16/bfloat16 [R, 2I], last dim contiguous (any row stride)

    Returns
    -------
    out : x.dtype [R, I], contiguous.
    """
    r, inner = x.shape[0], x.shape[1] // 2
    out = torch.empty(r, inner, dtype=x.dtype, device=x.device)
    if r == 0:
        return out
    block = min(BLOCK, max(128, next_power_of_2(inner)))
    _silu_mul[(r, cdiv(inner, block))](x, x.stride(0), out, inner, BLOCK=block,
                                       num_warps=4 if block >= 512 else 1)
    return out
