"""Triton ``causal_conv1d_commit``: advance each sequence's conv state along its accepted path.

Grid ``[B, ceil(C / BLOCK)]``: the new state column k is entry ``accept_len + 1 + k`` of
``prefix state (W - 1 columns), then the accepted nodes' inputs``: an old state column or a node
input gathered through ``path``. Columns are written in ascending order, each from an old column
to its right or from x, so writing in place never reads a column already overwritten.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .sizes import cdiv, next_power_of_2

__all__ = ["causal_conv1d_commit"]

BLOCK = 256


@triton.jit
def _conv_commit_kernel(x_ptr, path_ptr, accept_ptr, state_ptr, slots_ptr, N, P, C,
                        x_batch_stride, x_row_stride, path_batch_stride, W: tl.constexpr,
                        BLOCK: tl.constexpr, HAS_SLOTS: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < C
    slot = b
    if HAS_SLOTS:
        slot = tl.load(slots_ptr + b).to(tl.int64)
    row = state_ptr + slot * C * (W - 1) + cols * (W - 1)
    # taken = accept_len + 1 nodes, kept inside the path whatever accept_len holds (value checks
    # are off for CUDA tensors)
    taken = tl.minimum(tl.maximum(tl.load(accept_ptr + b), 0), P - 1).to(tl.int64) + 1
    for k in tl.static_range(W - 1):
        src = taken + k                                   # in [prefix state | accepted nodes]
        from_state = (cols * 0 + src) < W - 1             # one lane a channel
        old = tl.load(row + tl.minimum(src, W - 2), mask=ok & from_state, other=0.0)
        t = tl.maximum(src - (W - 1), 0)
        node = tl.load(path_ptr + b * path_batch_stride + tl.minimum(t, P - 1))
        node = tl.minimum(tl.maximum(node, 0), N - 1).to(tl.int64)
        xv = tl.load(x_ptr + b * x_batch_stride + node * x_row_stride + cols,
                     mask=ok & (cols * 0 + src >= W - 1), other=0.0)
        tl.store(row + k, tl.where(from_state, old, xv), mask=ok)


def causal_conv1d_commit(x, path, accept_len, conv_state, state_slots):
    """As ``jetspec_kernels.causal_conv1d_commit`` (arguments checked there), in place."""
    b, n, c = x.shape
    if b == 0:
        return
    block = min(BLOCK, max(32, next_power_of_2(c)))
    _conv_commit_kernel[(b, cdiv(c, block))](
        x, path, accept_len, conv_state, path if state_slots is None else state_slots, n,
        path.shape[1], c, x.stride(0), x.stride(1), path.stride(0), W=conv_state.shape[2] + 1,
        BLOCK=block, HAS_SLOTS=state_slots is not None, num_warps=2 if block >= 128 else 1)
