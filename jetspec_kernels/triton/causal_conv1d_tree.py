"""Triton ``causal_conv1d_tree``: a Gated DeltaNet layer's depthwise causal conv over a tree.

Grid ``[B * N, ceil(C / BLOCK)]``: a program walks its node's W - 1 nearest ancestors (scalar
parent loads), reading each tap's BLOCK channels from the node inputs or, once the path has left
the tree, from the slot's conv state, and accumulates ``weight[:, j] * window[j]`` in float32.
W is a compile-time constant (at most 8), so the walk is unrolled. Numerics as python_ref's
(float32 products and sums in tap order, then bias and silu), up to the order of the float32
adds.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .sizes import cdiv, next_power_of_2

__all__ = ["causal_conv1d_tree"]

BLOCK = 256   # channels a program


@triton.jit
def _conv_tree_kernel(x_ptr, parents_ptr, state_ptr, weight_ptr, bias_ptr, slots_ptr, nodes_ptr,
                      y_ptr, N, C, x_batch_stride, x_row_stride, parents_batch_stride,
                      weight_stride, W: tl.constexpr, BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr,
                      HAS_SLOTS: tl.constexpr, HAS_NODES: tl.constexpr, SILU: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    b = pid // N
    i = pid % N
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < C
    out = y_ptr + (b * N + i) * C + cols
    count = N
    if HAS_NODES:
        count = tl.load(nodes_ptr + b)
    if i >= count:
        tl.store(out, tl.zeros([BLOCK], dtype=y_ptr.dtype.element_ty), mask=ok)
        return
    slot = b
    if HAS_SLOTS:
        slot = tl.load(slots_ptr + b).to(tl.int64)
    state_row = state_ptr + slot * C * (W - 1) + cols * (W - 1)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    node = i
    beyond = i * 0             # steps taken past the root, into the state (an int64 scalar)
    for j in tl.static_range(W):                       # newest tap (the node itself) first
        inside = node >= 0
        here = (cols * 0 + node) >= 0                  # the same test, one lane a channel
        xv = tl.load(x_ptr + b * x_batch_stride + tl.maximum(node, 0) * x_row_stride + cols,
                     mask=ok & here, other=0.0)
        sv = tl.load(state_row + tl.maximum(W - 1 - beyond, 0), mask=ok & (cols * 0 + node < 0),
                     other=0.0)
        val = tl.where(here, xv.to(tl.float32), sv.to(tl.float32))
        w = tl.load(weight_ptr + cols * weight_stride + (W - 1 - j), mask=ok, other=0.0)
        acc += w.to(tl.float32) * val
        up = tl.load(parents_ptr + b * parents_batch_stride + tl.maximum(node, 0))
        up = tl.where(inside, up, -1)
        beyond = tl.where(inside, (up < 0).to(tl.int64), beyond + 1)
        node = up.to(tl.int64)
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=ok)


def causal_conv1d_tree(x, parents, conv_state, weight, bias, state_slots, num_nodes, activation):
    """As ``jetspec_kernels.causal_conv1d_tree`` (arguments checked there); returns y
    x.dtype [B, N, C], contiguous."""
    b, n, c = x.shape
    y = torch.empty(b, n, c, dtype=x.dtype, device=x.device)
    if b == 0:
        return y
    block = min(BLOCK, max(32, next_power_of_2(c)))
    dummy = parents
    _conv_tree_kernel[(b * n, cdiv(c, block))](
        x, parents, conv_state, weight, dummy if bias is None else bias,
        dummy if state_slots is None else state_slots, dummy if num_nodes is None else num_nodes,
        y, n, c, x.stride(0), x.stride(1), parents.stride(0), weight.stride(0),
        W=weight.shape[1], BLOCK=block, HAS_BIAS=bias is not None,
        HAS_SLOTS=state_slots is not None, HAS_NODES=num_nodes is not None,
        SILU=activation == "silu", num_warps=2 if block >= 128 else 1)
    return y
