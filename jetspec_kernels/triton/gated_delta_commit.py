"""Triton ``gated_delta_commit``: advance each sequence's Gated DeltaNet state in place along its
accepted path, one recurrent step per accepted node in transformers' order (decay, read, delta,
write), so the committed state is what one-token decoding would have left.

Grid ``[B, Hv, ceil(Dv / BV)]``: a program holds its [Dk, BV] tile of ``state[slot, hv]`` in
registers through ``accept_len + 1`` steps and stores it once. Columns of the state are
independent in the delta rule (the read ``S^T k`` and the write ``k u^T`` are per column), so
tiles need no exchange. Only the named slots are touched. Work per step and head: about 7 Dk Dv
flops, against 2 x 4 Dk Dv bytes of state read and written once per call.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .sizes import cdiv, next_power_of_2

__all__ = ["gated_delta_commit"]


@triton.jit
def _gated_delta_commit_kernel(
    k_ptr, v_ptr, g_ptr, beta_ptr, path_ptr, accept_ptr, state_ptr, slots_ptr,
    N, P, H_PER, DK, DV,
    k_batch_stride, k_row_stride, k_head_stride,
    v_batch_stride, v_row_stride, v_head_stride,
    g_batch_stride, g_row_stride, beta_batch_stride, beta_row_stride,
    path_batch_stride, state_slot_stride, state_head_stride,
    BK: tl.constexpr, BV: tl.constexpr, HAS_SLOTS: tl.constexpr, L2NORM: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1)
    h = hv // H_PER
    slot = b
    if HAS_SLOTS:
        slot = tl.load(slots_ptr + b).to(tl.int64)
    offs_k = tl.arange(0, BK)
    offs_v = tl.program_id(2) * BV + tl.arange(0, BV)
    kmask = offs_k < DK
    vmask = offs_v < DV
    tile = (state_ptr + slot * state_slot_stride + hv * state_head_stride
            + offs_k[:, None] * DV + offs_v[None, :])
    tile_mask = kmask[:, None] & vmask[None, :]
    s = tl.load(tile, mask=tile_mask, other=0.0)
    # steps stay inside path and the tree whatever accept_len / path hold (value checks are off
    # for CUDA tensors)
    steps = tl.minimum(tl.load(accept_ptr + b), P - 1) + 1
    for t in range(0, steps):
        node = tl.load(path_ptr + b * path_batch_stride + t)
        node = tl.minimum(tl.maximum(node, 0), N - 1).to(tl.int64)
        k = tl.load(k_ptr + b * k_batch_stride + node * k_row_stride + h * k_head_stride + offs_k,
                    mask=kmask, other=0.0).to(tl.float32)
        if L2NORM:
            k = k * tl.math.rsqrt(tl.sum(k * k, 0) + 1e-6)
        v = tl.load(v_ptr + b * v_batch_stride + node * v_row_stride + hv * v_head_stride + offs_v,
                    mask=vmask, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + b * g_batch_stride + node * g_row_stride + hv)
        beta = tl.load(beta_ptr + b * beta_batch_stride + node * beta_row_stride + hv).to(tl.float32)
        s = s * tl.exp(g)
        delta = (v - tl.sum(s * k[:, None], 0)) * beta
        s = s + k[:, None] * delta[None, :]
    tl.store(tile, s, mask=tile_mask)


def gated_delta_commit(k, v, g, beta, path, accept_len, state, state_slots, use_qk_l2norm):
    """As ``jetspec_kernels.gated_delta_commit`` (arguments validated there): ``state`` float32
    [S, Hv, Dk, Dv] (last two dims contiguous) advanced in place; k [B, N, H, Dk], v [B, N, Hv,
    Dv], g float32 / beta [B, N, Hv] (last dims contiguous); path int32 [B, P]; accept_len int32
    [B]; state_slots int32 [B] or None. Returns None."""
    B, N, H, DK = k.shape
    HV, DV = v.shape[2], v.shape[3]
    if B == 0:
        return
    bk = max(16, next_power_of_2(DK))
    bv = max(16, min(64, next_power_of_2(DV)))
    slots = state_slots if state_slots is not None else accept_len   # dummy, never read
    _gated_delta_commit_kernel[(B, HV, cdiv(DV, bv))](
        k, v, g, beta, path, accept_len, state, slots,
        N, path.shape[1], HV // H, DK, DV,
        k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        g.stride(0), g.stride(1), beta.stride(0), beta.stride(1),
        path.stride(0), state.stride(0), state.stride(1),
        BK=bk, BV=bv, HAS_SLOTS=state_slots is not None, L2NORM=bool(use_qk_l2norm),
        num_warps=4,
    )
