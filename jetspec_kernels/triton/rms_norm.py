"""Triton ``rms_norm``: the residual add and the models' RMSNorm in one pass over each row.

One program per row. A row of at most ``ONE_PASS_MAX`` elements is held in registers (one read
of x and the residual, one write of each output); a longer one is read in ``CHUNK`` pieces twice
(the second pass reads back the total it wrote, or x). The sum of squares is in float32; the
roundings are the reference's (python_ref.add_rms_norm with ``dtype=x.dtype``). FMA contraction
is off: a row normed after its residual add here and a row whose add torch did before must get
the same bits (the exact mode meets both forms of one row), so neither variant may fuse
differently.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .sizes import next_power_of_2

__all__ = ["rms_norm", "launch", "ONE_PASS_MAX", "CHUNK"]

ONE_PASS_MAX = 16384  # elements of a row held at once (64 KB of float32 across the program)
CHUNK = 4096          # elements per piece of a longer row


@triton.jit
def _normed(h, w, r):
    """``round(w * round(h * r))`` in the output dtype (h and w in the row's dtype)."""
    n = (h.to(tl.float32) * r).to(h.dtype)
    return (w.to(tl.float32) * n.to(tl.float32)).to(h.dtype)


@triton.jit
def _rms_norm_one_pass(x_ptr, x_stride, res_ptr, res_stride, w_ptr, out_ptr, tot_ptr, H, eps,
                       HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    """Grid ``[R]``: row r of out (and total), held whole in registers."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < H
    h = tl.load(x_ptr + row * x_stride + cols, mask=ok, other=0.0)
    if HAS_RES:
        res = tl.load(res_ptr + row * res_stride + cols, mask=ok, other=0.0)
        h = (h.to(tl.float32) + res.to(tl.float32)).to(h.dtype)
        tl.store(tot_ptr + row * H + cols, h, mask=ok)
    hf = h.to(tl.float32)
    r = tl.math.rsqrt(tl.sum(hf * hf, axis=0) / H + eps)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0)
    tl.store(out_ptr + row * H + cols, _normed(h, w, r), mask=ok)


@triton.jit
def _rms_norm_two_pass(x_ptr, x_stride, res_ptr, res_stride, w_ptr, out_ptr, tot_ptr, H, eps,
                       HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    """Grid ``[R]``: row r in pieces of BLOCK: the total and the sum of squares, then the norm."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for c0 in range(0, H, BLOCK):
        ok = c0 + cols < H
        h = tl.load(x_ptr + row * x_stride + c0 + cols, mask=ok, other=0.0)
        if HAS_RES:
            res = tl.load(res_ptr + row * res_stride + c0 + cols, mask=ok, other=0.0)
            h = (h.to(tl.float32) + res.to(tl.float32)).to(h.dtype)
            tl.store(tot_ptr + row * H + c0 + cols, h, mask=ok)
        hf = h.to(tl.float32)
        acc += hf * hf
    r = tl.math.rsqrt(tl.sum(acc, axis=0) / H + eps)
    if HAS_RES:
        src_ptr, src_stride = tot_ptr, H
    else:
        src_ptr, src_stride = x_ptr, x_stride
    for c0 in range(0, H, BLOCK):
        ok = c0 + cols < H
        h = tl.load(src_ptr + row * src_stride + c0 + cols, mask=ok, other=0.0)
        w = tl.load(w_ptr + c0 + cols, mask=ok, other=0.0)
        tl.store(out_ptr + row * H + c0 + cols, _normed(h, w, r), mask=ok)


def launch(x, residual, weight, eps, *, one_pass_max: int = ONE_PASS_MAX, chunk: int = CHUNK):
    """:func:`rms_norm` with the row-length switch as arguments (tests run both kernels on
    short rows); ``chunk`` a power of two."""
    r, h = x.shape
    out = torch.empty(r, h, dtype=x.dtype, device=x.device)
    total = None if residual is None else torch.empty(r, h, dtype=x.dtype, device=x.device)
    if r == 0:
        return out, total
    # At least 128 lanes: short rows share one compiled kernel (masked lanes cost nothing here).
    block = max(128, next_power_of_2(h))
    kernel = _rms_norm_one_pass
    if block > one_pass_max:
        kernel, block = _rms_norm_two_pass, chunk
    # About 16 elements a thread: 8 warps for a 4096 row, 1 for a short one.
    warps = min(16, max(1, block // 512))
    has_res = residual is not None
    kernel[(r,)](x, x.stride(0), residual if has_res else x, residual.stride(0) if has_res else 0,
                 weight, out, total if has_res else out, h, eps, HAS_RES=has_res, BLOCK=block,
                 num_warps=warps, enable_fp_fusion=False)
    return out, total


def rms_norm(x, residual, weight, eps):
    """RMSNorm of each row of ``x`` (after adding ``residual``), as ``jetspec_kernels.rms_norm``.

    Parameters
    ----------
    x : float32/float16/bfloat16 [R, H], last dim contiguous (any row stride)
    residual : x.dtype [R, H] (last dim contiguous) or None
    weight : x.dtype [H]; eps : float

    Returns
    -------
    (out, total): x.dtype [R, H] contiguous each; total (x + residual) is None without residual.
    """
    return launch(x, residual, weight, eps)
