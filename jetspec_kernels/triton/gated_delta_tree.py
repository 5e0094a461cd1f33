"""Triton ``gated_delta_tree``: every tree node's Gated DeltaNet output, as if decoded along its
ancestor path, in the chunked (WY) form with the ancestor mask in place of the causal mask.

The algorithm (docs/perf/gated_delta_tree.md has the costs of both routes).
Node i's state is ``S_i = exp(C_i) S0 + sum_{j on i's path} exp(C_i - C_j) k_j u_j^T``, with
``C_i`` the sum of g over the path and ``u_j`` the delta node j writes. So the deltas solve a
unit lower-triangular system over the tree, and the outputs are one masked product:

    (I + A) U = beta * (V - exp(C) * (K S0)),  A[i, j] = beta_i exp(C_i - C_j) (k_i . k_j)
                                                for j a strict ancestor of i (else 0)
    O = exp(C) * (Q S0) + (D * Q K^T) U,        D[i, j] = exp(C_i - C_j) for j on i's path

Route A (a state per node, the recurrence node by node) needs a [Dk, Dv] state per node that
still has children to come: 64 KiB a node and v-head in float32, 2 MiB a node across Qwen3.6's
32 v-heads, so a budget-64 tree of B 16 sequences would hold up to 2 GiB per layer call; and its
work is matrix-vector (CUDA cores, 7 Dk Dv flops a node and head). This form keeps no state per
node (U is [N, Dv] float32 scratch) and its work is matrix-matrix (tl.dot).

Grid ``[B, Hv, ceil(Dv / BV)]``: a program per sequence, v-head and Dv tile walks the nodes in
row blocks of BT (a parent precedes its child, so a block needs only the blocks before it). For
row block I: C_I from the ancestor mask (the bit-packed ``pack_mask`` of the tree), the
right-hand side from ``K_I S0`` (Dk in chunks of BKC: no [BT, Dk] tile stays in registers; S0's
chunks are re-read, from L2), minus the earlier blocks' deltas ``A_IJ U_J``; then the block's own
triangular system by Jacobi sweeps ``U <- R - A_II U``: A_II is nilpotent along the block's
ancestor chains, so ``depth - 1`` sweeps (depth: the most ancestors-or-self a row has in the
block) give exactly the forward-substitution result, each row computed from final values; then
``O_I``. ``U_I``, ``C_I`` and k's inverse norms go to float32 scratch for the later blocks (a
barrier orders the program's own stores and loads). Padding rows (``>= num_nodes``) load nothing
(zeros) and store zeros; terms off the mask are selected away, never multiplied by 0, so an
overflowing exp there stays out.

Numerics: float32 throughout; float32 inputs use IEEE-precision ``tl.dot`` (tf32 would miss the
1e-5 tolerance), 16-bit inputs tf32. l2norm as transformers (``x * rsqrt(sum x^2 + 1e-6)``);
``scale`` None divides q by sqrt(Dk) (correctly rounded), as transformers does.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pack_mask import pack_mask
from .sizes import cdiv, next_power_of_2

__all__ = ["gated_delta_tree", "MAX_HEAD_DIM", "tile_sizes"]

MAX_HEAD_DIM = 256   # Dk: longer q/k rows would still run (chunked), but are untested
L2NORM_EPS = 1e-6


@triton.jit
def _inv_norms(ptr, rows, valid, n_stride, DK, BT: tl.constexpr, BKC: tl.constexpr,
               L2NORM: tl.constexpr):
    """``[BT]``: 1 / sqrt(sum x^2 + eps) of rows of q or k (transformers' l2norm), or ones."""
    if L2NORM:
        ss = tl.zeros([BT], tl.float32)
        for c in range(0, DK, BKC):
            offs = c + tl.arange(0, BKC)
            x = tl.load(ptr + rows[:, None].to(tl.int64) * n_stride + offs[None, :],
                        mask=valid[:, None] & (offs < DK)[None, :], other=0.0).to(tl.float32)
            ss += tl.sum(x * x, 1)
        return tl.math.rsqrt(ss + 1e-6)
    else:
        return tl.full([BT], 1.0, tl.float32)


@triton.jit
def _chunk(ptr, rows, valid, n_stride, c, DK, inv, BKC: tl.constexpr):
    """Columns ``c .. c + BKC`` of rows of q or k, float32, times ``inv`` (zeros where not
    ``valid`` or past Dk)."""
    offs = c + tl.arange(0, BKC)
    x = tl.load(ptr + rows[:, None].to(tl.int64) * n_stride + offs[None, :],
                mask=valid[:, None] & (offs < DK)[None, :], other=0.0).to(tl.float32)
    return x * inv[:, None]


@triton.jit
def _q_chunk(ptr, rows, valid, n_stride, c, DK, inv, scale, BKC: tl.constexpr,
             DIVIDE: tl.constexpr):
    """A chunk of q, normalised, then divided by sqrt(Dk) (``scale`` holds it) or scaled."""
    x = _chunk(ptr, rows, valid, n_stride, c, DK, inv, BKC)
    if DIVIDE:
        return tl.math.div_rn(x, tl.zeros_like(x) + scale)
    else:
        return x * scale


@triton.jit
def _ancestors(mask_row, rows, cols, rvalid, cvalid, W):
    """bool ``[BT, BT]``: column node j is node i or an ancestor (bit j of row i's mask words)."""
    words = tl.load(mask_row + rows[:, None].to(tl.int64) * W + (cols // 32)[None, :],
                    mask=rvalid[:, None] & cvalid[None, :], other=0)
    return ((words >> (cols % 32)[None, :]) & 1) != 0


@triton.jit
def _gated_delta_tree_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, mask_ptr, num_ptr, state_ptr, slots_ptr,
    o_ptr, u_ptr, c_ptr, kn_ptr,
    N, W, HV, H_PER, DK, DV, scale,
    q_batch_stride, q_row_stride, q_head_stride,
    k_batch_stride, k_row_stride, k_head_stride,
    v_batch_stride, v_row_stride, v_head_stride,
    g_batch_stride, g_row_stride, beta_batch_stride, beta_row_stride,
    state_slot_stride, state_head_stride,
    BT: tl.constexpr, BKC: tl.constexpr, BV: tl.constexpr, HAS_SLOTS: tl.constexpr,
    L2NORM: tl.constexpr, DIVIDE: tl.constexpr, PRECISION: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1)
    vt = tl.program_id(2)
    nv = tl.num_programs(2)
    h = hv // H_PER
    num = tl.load(num_ptr + b)
    slot = b
    if HAS_SLOTS:
        slot = tl.load(slots_ptr + b).to(tl.int64)

    offs_v = vt * BV + tl.arange(0, BV)
    vmask = offs_v < DV
    s0_b = state_ptr + slot * state_slot_stride + hv * state_head_stride + offs_v[None, :]
    q_b = q_ptr + b * q_batch_stride + h * q_head_stride
    k_b = k_ptr + b * k_batch_stride + h * k_head_stride
    v_b = v_ptr + b * v_batch_stride + hv * v_head_stride
    g_b = g_ptr + b * g_batch_stride + hv
    beta_b = beta_ptr + b * beta_batch_stride + hv
    mask_b = mask_ptr + b * N * W
    head = (b * HV + hv) * nv + vt           # this program's scratch rows
    u_b = u_ptr + head * N * BV
    c_b = c_ptr + head * N
    kn_b = kn_ptr + head * N
    o_b = o_ptr + b * N * HV * DV + hv * DV

    for i0 in range(0, N, BT):
        rows = i0 + tl.arange(0, BT)
        rvalid = rows < num
        kn_i = _inv_norms(k_b, rows, rvalid, k_row_stride, DK, BT, BKC, L2NORM)
        qn_i = _inv_norms(q_b, rows, rvalid, q_row_stride, DK, BT, BKC, L2NORM)
        tl.store(kn_b + rows, kn_i, mask=rows < N)
        v_i = tl.load(v_b + rows[:, None].to(tl.int64) * v_row_stride + offs_v[None, :],
                      mask=rvalid[:, None] & vmask[None, :], other=0.0).to(tl.float32)
        beta_i = tl.load(beta_b + rows.to(tl.int64) * beta_row_stride, mask=rvalid,
                         other=0.0).to(tl.float32)

        # C_i: g summed over i's path (the ancestor mask's row times g)
        c_i = tl.zeros([BT], tl.float32)
        for j0 in range(0, i0 + BT, BT):
            cols = j0 + tl.arange(0, BT)
            cvalid = cols < num
            anc = _ancestors(mask_b, rows, cols, rvalid, cvalid, W)
            g_j = tl.load(g_b + cols.to(tl.int64) * g_row_stride, mask=cvalid, other=0.0)
            c_i += tl.sum(tl.where(anc, g_j[None, :], 0.0), 1)
        tl.store(c_b + rows, c_i, mask=rows < N)
        e_i = tl.exp(c_i)

        # K S0 and Q S0, Dk in chunks of BKC (S0's chunk read from the pool, L2-resident)
        ks = tl.zeros([BT, BV], tl.float32)
        qs = tl.zeros([BT, BV], tl.float32)
        for c in range(0, DK, BKC):
            offs_c = c + tl.arange(0, BKC)
            s0 = tl.load(s0_b + offs_c[:, None] * DV, mask=(offs_c < DK)[:, None] & vmask[None, :],
                         other=0.0)
            k_c = _chunk(k_b, rows, rvalid, k_row_stride, c, DK, kn_i, BKC)
            q_c = _q_chunk(q_b, rows, rvalid, q_row_stride, c, DK, qn_i, scale, BKC, DIVIDE)
            ks += tl.dot(k_c, s0, input_precision=PRECISION)
            qs += tl.dot(q_c, s0, input_precision=PRECISION)
        r = beta_i[:, None] * (v_i - e_i[:, None] * ks)
        acc = e_i[:, None] * qs

        for j0 in range(0, i0, BT):
            cols = j0 + tl.arange(0, BT)
            cvalid = cols < num
            anc = _ancestors(mask_b, rows, cols, rvalid, cvalid, W)
            kn_j = tl.load(kn_b + cols, mask=cvalid, other=0.0)
            kk = tl.zeros([BT, BT], tl.float32)
            qk = tl.zeros([BT, BT], tl.float32)
            for c in range(0, DK, BKC):
                k_c = _chunk(k_b, rows, rvalid, k_row_stride, c, DK, kn_i, BKC)
                q_c = _q_chunk(q_b, rows, rvalid, q_row_stride, c, DK, qn_i, scale, BKC, DIVIDE)
                kt = tl.trans(_chunk(k_b, cols, cvalid, k_row_stride, c, DK, kn_j, BKC))
                kk += tl.dot(k_c, kt, input_precision=PRECISION)
                qk += tl.dot(q_c, kt, input_precision=PRECISION)
            c_j = tl.load(c_b + cols, mask=cvalid, other=0.0)
            u_j = tl.load(u_b + cols[:, None] * BV + tl.arange(0, BV)[None, :],
                          mask=cvalid[:, None], other=0.0)
            decay = tl.where(anc, tl.exp(c_i[:, None] - c_j[None, :]), 0.0)
            r -= tl.dot(beta_i[:, None] * decay * kk, u_j, input_precision=PRECISION)
            acc += tl.dot(decay * qk, u_j, input_precision=PRECISION)

        anc = _ancestors(mask_b, rows, rows, rvalid, rvalid, W)
        kk = tl.zeros([BT, BT], tl.float32)
        qk = tl.zeros([BT, BT], tl.float32)
        for c in range(0, DK, BKC):
            k_c = _chunk(k_b, rows, rvalid, k_row_stride, c, DK, kn_i, BKC)
            q_c = _q_chunk(q_b, rows, rvalid, q_row_stride, c, DK, qn_i, scale, BKC, DIVIDE)
            kt = tl.trans(k_c)
            kk += tl.dot(k_c, kt, input_precision=PRECISION)
            qk += tl.dot(q_c, kt, input_precision=PRECISION)
        decay = tl.where(anc, tl.exp(c_i[:, None] - c_i[None, :]), 0.0)
        strict = anc & (rows[:, None] != rows[None, :])
        a_ii = tl.where(strict, beta_i[:, None] * decay * kk, 0.0)
        depth = tl.max(tl.sum(anc.to(tl.int32), 1), 0)
        u = r
        for _ in range(1, depth):
            u = r - tl.dot(a_ii, u, input_precision=PRECISION)
        tl.store(u_b + rows[:, None] * BV + tl.arange(0, BV)[None, :], u,
                 mask=(rows < N)[:, None])
        acc += tl.dot(decay * qk, u, input_precision=PRECISION)
        acc = tl.where(rvalid[:, None], acc, 0.0)
        tl.store(o_b + rows[:, None].to(tl.int64) * (HV * DV) + offs_v[None, :],
                 acc.to(o_ptr.dtype.element_ty), mask=(rows < N)[:, None] & vmask[None, :])
        tl.debug_barrier()   # this block's U, C and norms, stored, before later blocks load them


# Without register spills on sm_90a (ptxas, via bench/triton_resources.py's compile at Qwen3.6's
# shapes): BT 16, Dk chunks of 32, BV 64, 4 warps (bf16 244 registers, fp32 182); BT 32 spills.
MAX_BT, BKC, MAX_BV, NUM_WARPS = 16, 32, 64, 4
FP32_PRECISION = "ieee"


def tile_sizes(n: int, dk: int, dv: int) -> tuple[int, int, int]:
    """(BT, BKC, BV): node rows a block, the Dk chunk, the Dv tile (tl.dot needs >= 16)."""
    return min(MAX_BT, max(16, next_power_of_2(n))), min(BKC, max(16, next_power_of_2(dk))), \
        max(16, min(MAX_BV, next_power_of_2(dv)))


def gated_delta_tree(q, k, v, g, beta, parents, state, state_slots, num_nodes, scale,
                     use_qk_l2norm):
    """As ``jetspec_kernels.gated_delta_tree`` (arguments validated there).

    q, k : [B, N, H, Dk], v : [B, N, Hv, Dv] (one dtype, last dims contiguous); g float32 and
    beta [B, N, Hv] (last dim contiguous); parents int32 [B, N]; state float32 [S, Hv, Dk, Dv]
    (last two dims contiguous); state_slots, num_nodes int32 [B] or None; scale float or None.
    Returns o [B, N, Hv, Dv] in v's dtype, contiguous.
    """
    B, N, H, DK = k.shape
    HV, DV = v.shape[2], v.shape[3]
    dev = v.device
    o = torch.empty(B, N, HV, DV, dtype=v.dtype, device=dev)
    if B == 0:
        return o
    num = torch.full((B,), N, dtype=torch.int32, device=dev) if num_nodes is None else num_nodes
    mask = pack_mask(parents, num)
    bt, bkc, bv = tile_sizes(N, DK, DV)
    nv = cdiv(DV, bv)
    u = torch.empty(B * HV * nv * N * bv, dtype=torch.float32, device=dev)
    c = torch.empty(2 * B * HV * nv * N, dtype=torch.float32, device=dev)   # C, then k's norms
    kn = c[B * HV * nv * N:]
    slots = state_slots if state_slots is not None else num     # dummy pointer, never read
    divide = scale is None
    _gated_delta_tree_kernel[(B, HV, nv)](
        q, k, v, g, beta, mask, num, state, slots, o, u, c, kn,
        N, mask.shape[2], HV, HV // H, DK, DV, float(DK ** 0.5 if divide else scale),
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), g.stride(0), g.stride(1),
        beta.stride(0), beta.stride(1), state.stride(0), state.stride(1),
        BT=bt, BKC=bkc, BV=bv, HAS_SLOTS=state_slots is not None, L2NORM=bool(use_qk_l2norm),
        DIVIDE=divide, PRECISION=FP32_PRECISION if v.dtype == torch.float32 else "tf32",
        num_warps=NUM_WARPS,
    )
    return o
