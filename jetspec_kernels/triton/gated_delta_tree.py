"""Triton ``gated_delta_tree``: every tree node's Gated DeltaNet output, as if decoded along its
ancestor path, in the chunked (WY) form with the ancestor mask in place of the causal mask.

The algorithm (docs/perf/gated_delta_tree.md has the costs of the routes and splits).
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
node and its work is matrix-matrix (tl.dot).

After ``pack_mask``, nodes in row blocks of BT = 16 (a parent precedes its child, so the system
is block lower-triangular; block pair (I, J), J <= I, is stored at ``I (I + 1) / 2 + J``):

1. ``_gated_delta_rows``, grid ``[B * Hv, NB]``: a program per sequence, v-head and row block I
   computes the block row's pairs, all that does not depend on U, every block row in parallel:
   ``beta_i (k_i . k_j)`` and ``q_i . k_j`` on the ancestor mask (0 off it) for J < I into
   float32 scratch, undecayed; for J = I, C_I (g summed over the path: the bit-packed mask's row
   times g), ``(I + A_II)^-1`` (``depth - 1`` Jacobi sweeps ``T <- I - A_II T`` from ``T = I``:
   A_II is nilpotent along the block's ancestor chains, so they give exactly forward
   substitution's inverse; depth: the most ancestors-or-self a row has in the block) and
   ``P_II = (D * Q K^T)_II``.
2. ``_gated_delta_solve``, grid ``[B * Hv, Dv / BV]``: a program per sequence, v-head and Dv tile
   walks the row blocks in order (the one serial part): ``exp(C_i - C_j)`` on the stored pairs
   gives ``A_IJ``, ``P_IJ``; the right side ``beta (V_I - exp(C_I) K_I S0) - sum_{J<I} A_IJ U_J``,
   ``U_I = (I + A_II)^-1`` times it, ``O_I = exp(C_I) Q_I S0 + sum_{J<=I} P_IJ U_J``. U goes to
   float32 scratch for the later blocks (a barrier orders the program's own stores and loads).
   Only [BT, BT] x [BT, BV] products and the two [BT, Dk] x [Dk, BV] products with S0 are on
   this path; with 16-bit inputs the S0 tile stays in registers.

With one row block (N <= BT) the solve computes the block's own pair itself and the first launch
and all scratch are skipped (a rule by N alone, never by B).

Padding rows (``>= num_nodes``) load nothing (zeros) and store zeros; terms off the mask are
selected away, never multiplied by 0, so an overflowing exp there stays out. Every scratch block
a later program reads is written whole (padding rows as zeros).

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

__all__ = ["gated_delta_tree", "MAX_HEAD_DIM", "tile_sizes", "scratch_bytes"]

MAX_HEAD_DIM = 256   # Dk: longer q/k rows would still run, but are untested (and not compiled)
L2NORM_EPS = 1e-6


@triton.jit
def _inv_norms(ptr, rows, valid, n_stride, DK, BT: tl.constexpr, KC: tl.constexpr,
               L2NORM: tl.constexpr):
    """``[BT]``: 1 / sqrt(sum x^2 + eps) of rows of q or k (transformers' l2norm), or ones."""
    if L2NORM:
        ss = tl.zeros([BT], tl.float32)
        for c in range(0, DK, KC):
            offs = c + tl.arange(0, KC)
            x = tl.load(ptr + rows[:, None].to(tl.int64) * n_stride + offs[None, :],
                        mask=valid[:, None] & (offs < DK)[None, :], other=0.0).to(tl.float32)
            ss += tl.sum(x * x, 1)
        return tl.math.rsqrt(ss + 1e-6)
    else:
        return tl.full([BT], 1.0, tl.float32)


@triton.jit
def _chunk(ptr, rows, valid, n_stride, c, DK, inv, KC: tl.constexpr):
    """Columns ``c .. c + KC`` of rows of q or k, float32, times ``inv`` (zeros where not
    ``valid`` or past Dk)."""
    offs = c + tl.arange(0, KC)
    x = tl.load(ptr + rows[:, None].to(tl.int64) * n_stride + offs[None, :],
                mask=valid[:, None] & (offs < DK)[None, :], other=0.0).to(tl.float32)
    return x * inv[:, None]


@triton.jit
def _q_chunk(ptr, rows, valid, n_stride, c, DK, inv, scale, KC: tl.constexpr,
             DIVIDE: tl.constexpr):
    """A chunk of q, normalised, then divided by sqrt(Dk) (``scale`` holds it) or scaled."""
    x = _chunk(ptr, rows, valid, n_stride, c, DK, inv, KC)
    if DIVIDE:
        return tl.math.div_rn(x, tl.zeros_like(x) + scale)
    else:
        return x * scale


@triton.jit
def _row_tile(ptr, rows, valid, n_stride, DK, DKP: tl.constexpr):
    """``[BT, DKP]`` whole rows of q or k as stored (zeros where not ``valid`` or past Dk)."""
    offs = tl.arange(0, DKP)
    return tl.load(ptr + rows[:, None].to(tl.int64) * n_stride + offs[None, :],
                   mask=valid[:, None] & (offs < DK)[None, :], other=0.0)


@triton.jit
def _normalised(x, L2NORM: tl.constexpr):
    """Rows in float32, l2-normalised when ``L2NORM`` (transformers' ``x * rsqrt(sum x^2 +
    eps)``)."""
    x = x.to(tl.float32)
    if L2NORM:
        x = x * tl.math.rsqrt(tl.sum(x * x, 1) + 1e-6)[:, None]
    return x


@triton.jit
def _q_normalised(x, scale, L2NORM: tl.constexpr, DIVIDE: tl.constexpr):
    """Rows of q as :func:`_normalised`, then divided by sqrt(Dk) (``scale``) or scaled."""
    x = _normalised(x, L2NORM)
    if DIVIDE:
        return tl.math.div_rn(x, tl.zeros_like(x) + scale)
    else:
        return x * scale


@triton.jit
def _gram(k_b, q_b, k_row_stride, q_row_stride, rows, rvalid, kn_i, qn_i, cols, cvalid, kn_j,
          DK, scale, BT: tl.constexpr, KC: tl.constexpr, DIVIDE: tl.constexpr,
          PRECISION: tl.constexpr):
    """``(K_I K_J^T, Q_I K_J^T)`` ``[BT, BT]`` of normalised (q: and scaled) rows, Dk in chunks
    of KC."""
    kk = tl.zeros([BT, BT], tl.float32)
    qk = tl.zeros([BT, BT], tl.float32)
    for c in range(0, DK, KC):
        k_c = _chunk(k_b, rows, rvalid, k_row_stride, c, DK, kn_i, KC)
        q_c = _q_chunk(q_b, rows, rvalid, q_row_stride, c, DK, qn_i, scale, KC, DIVIDE)
        kt = tl.trans(_chunk(k_b, cols, cvalid, k_row_stride, c, DK, kn_j, KC))
        kk += tl.dot(k_c, kt, input_precision=PRECISION)
        qk += tl.dot(q_c, kt, input_precision=PRECISION)
    return kk, qk


@triton.jit
def _ancestors(mask_row, rows, cols, rvalid, cvalid, W):
    """bool ``[rows, cols]``: column node j is node i or an ancestor (bit j of row i's mask
    words); False for a padding row or column."""
    words = tl.load(mask_row + rows[:, None].to(tl.int64) * W + (cols // 32)[None, :],
                    mask=rvalid[:, None] & cvalid[None, :], other=0)
    return ((words >> (cols % 32)[None, :]) & 1) != 0


@triton.jit
def _path_sums(mask_b, g_b, g_row_stride, rows, rvalid, num, W, BT: tl.constexpr,
               CW: tl.constexpr):
    """``[BT]``: g summed over each row's path (the ancestor mask's row times g), columns in
    chunks of CW up to the block's last row (ancestors precede)."""
    c = tl.zeros([BT], tl.float32)
    for j0 in range(0, tl.max(rows, 0) + 1, CW):
        cols = j0 + tl.arange(0, CW)
        cvalid = cols < num
        anc = _ancestors(mask_b, rows, cols, rvalid, cvalid, W)
        g_j = tl.load(g_b + cols.to(tl.int64) * g_row_stride, mask=cvalid, other=0.0)
        c += tl.sum(tl.where(anc, g_j[None, :], 0.0), 1)
    return c


@triton.jit
def _diagonal_block(kk, qk, beta_i, c_i, anc, rows, PRECISION: tl.constexpr):
    """A row block's own pair from its Gram products ``kk``, ``qk`` and ancestor mask ``anc``:
    ``(I + A_II)^-1`` by ``depth - 1`` Jacobi sweeps ``T <- I - A_II T`` from ``T = I`` (A_II is
    nilpotent along the block's ancestor chains, so this is exactly forward substitution's
    inverse; depth: the most ancestors-or-self a row has in the block), and ``P_II``."""
    decay = tl.where(anc, tl.exp(c_i[:, None] - c_i[None, :]), 0.0)
    eye = rows[:, None] == rows[None, :]
    a = tl.where(anc & ~eye, beta_i[:, None] * decay * kk, 0.0)
    one = tl.where(eye, 1.0, 0.0)
    depth = tl.max(tl.sum(anc.to(tl.int32), 1), 0)
    t = one
    for _ in range(1, depth):
        t = one - tl.dot(a, t, input_precision=PRECISION)
    return t, tl.where(anc, decay * qk, 0.0)


@triton.jit
def _gated_delta_rows(
    q_ptr, k_ptr, g_ptr, beta_ptr, mask_ptr, num_ptr, a_ptr, p_ptr, c_ptr,
    N, W, HV, H_PER, DK, scale, NPAIR, NBT,
    q_batch_stride, q_row_stride, q_head_stride,
    k_batch_stride, k_row_stride, k_head_stride,
    g_batch_stride, g_row_stride, beta_batch_stride, beta_row_stride,
    NB, BT: tl.constexpr, JC: tl.constexpr, KC: tl.constexpr, CW: tl.constexpr,
    L2NORM: tl.constexpr, DIVIDE: tl.constexpr, PRECISION: tl.constexpr,
):
    bh = tl.program_id(0).to(tl.int64)       # b * HV + hv
    # (column chunk c, row block I >= c JC) from m = first(c) + I - c JC, with first(c) =
    # c NB - JC c (c - 1) / 2 programs in the chunks before c; the float root corrected exactly
    m = tl.program_id(1)
    lead = (2 * NB + JC).to(tl.float32)
    ch = ((lead - tl.sqrt(lead * lead - 8.0 * JC * m.to(tl.float32))) / (2 * JC)).to(tl.int32)
    ch = tl.where(ch * NB - JC * ch * (ch - 1) // 2 > m, ch - 1, ch)
    ch = tl.where((ch + 1) * NB - JC * (ch + 1) * ch // 2 <= m, ch + 1, ch)
    bi = ch * JC + m - (ch * NB - JC * ch * (ch - 1) // 2)     # row block I
    j_lo = ch * JC                           # this program's column blocks J: j_lo .. j_lo + JC
    b = bh // HV
    hv = bh % HV
    h = hv // H_PER
    num = tl.load(num_ptr + b)
    q_b = q_ptr + b * q_batch_stride + h * q_head_stride
    k_b = k_ptr + b * k_batch_stride + h * k_head_stride
    mask_b = mask_ptr + b * N * W
    # block pair (I, J), J <= I, at I (I + 1) / 2 + J, BT x BT floats each
    blk = (bh * NPAIR + bi * (bi + 1) // 2) * (BT * BT) + tl.arange(0, BT)[:, None] * BT + \
        tl.arange(0, BT)[None, :]

    rows = bi * BT + tl.arange(0, BT)
    rvalid = rows < num
    kn_i = _inv_norms(k_b, rows, rvalid, k_row_stride, DK, BT, KC, L2NORM)
    qn_i = _inv_norms(q_b, rows, rvalid, q_row_stride, DK, BT, KC, L2NORM)
    beta_i = tl.load(beta_ptr + b * beta_batch_stride + hv + rows.to(tl.int64) * beta_row_stride,
                     mask=rvalid, other=0.0).to(tl.float32)
    for bj in range(j_lo, tl.minimum(j_lo + JC, bi)):
        cols = bj * BT + tl.arange(0, BT)
        cvalid = cols < num
        kn_j = _inv_norms(k_b, cols, cvalid, k_row_stride, DK, BT, KC, L2NORM)
        anc = _ancestors(mask_b, rows, cols, rvalid, cvalid, W)
        kk, qk = _gram(k_b, q_b, k_row_stride, q_row_stride, rows, rvalid, kn_i, qn_i, cols,
                       cvalid, kn_j, DK, scale, BT, KC, DIVIDE, PRECISION)
        # undecayed (the solve applies exp(C_i - C_j)); exactly 0 off the ancestor mask
        tl.store(a_ptr + blk + bj * (BT * BT), tl.where(anc, beta_i[:, None] * kk, 0.0))
        tl.store(p_ptr + blk + bj * (BT * BT), tl.where(anc, qk, 0.0))

    if bi < j_lo + JC:                       # the chunk that holds the diagonal pair
        c_i = _path_sums(mask_b, g_ptr + b * g_batch_stride + hv, g_row_stride, rows, rvalid,
                         num, W, BT, CW)
        kk, qk = _gram(k_b, q_b, k_row_stride, q_row_stride, rows, rvalid, kn_i, qn_i, rows,
                       rvalid, kn_i, DK, scale, BT, KC, DIVIDE, PRECISION)
        t_ii, p_ii = _diagonal_block(kk, qk, beta_i, c_i,
                                     _ancestors(mask_b, rows, rows, rvalid, rvalid, W), rows,
                                     PRECISION)
        tl.store(a_ptr + blk + bi * (BT * BT), t_ii)
        tl.store(p_ptr + blk + bi * (BT * BT), p_ii)
        tl.store(c_ptr + bh * NBT + rows, c_i)


@triton.jit
def _gated_delta_solve(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, mask_ptr, num_ptr, state_ptr, slots_ptr, a_ptr, p_ptr,
    c_ptr, u_ptr, o_ptr,
    N, W, HV, H_PER, DK, DV, scale, NPAIR, NBT,
    q_batch_stride, q_row_stride, q_head_stride,
    k_batch_stride, k_row_stride, k_head_stride,
    v_batch_stride, v_row_stride, v_head_stride,
    g_batch_stride, g_row_stride, beta_batch_stride, beta_row_stride,
    state_slot_stride, state_head_stride,
    BT: tl.constexpr, DKP: tl.constexpr, KS: tl.constexpr, BV: tl.constexpr, CW: tl.constexpr,
    ONE_BLOCK: tl.constexpr, HAS_SLOTS: tl.constexpr, L2NORM: tl.constexpr,
    DIVIDE: tl.constexpr, PRECISION: tl.constexpr,
):
    bh = tl.program_id(0).to(tl.int64)       # b * HV + hv
    vt = tl.program_id(1)
    b = bh // HV
    hv = bh % HV
    h = hv // H_PER
    num = tl.load(num_ptr + b)
    slot = b
    if HAS_SLOTS:
        slot = tl.load(slots_ptr + b).to(tl.int64)

    offs_v = vt * BV + tl.arange(0, BV)
    vmask = offs_v < DV
    s0_b = state_ptr + slot * state_slot_stride + hv * state_head_stride + offs_v[None, :]
    if KS == DKP:     # whole Dk rows: the S0 tile stays in registers for every row block
        offs_k = tl.arange(0, DKP)
        s0 = tl.load(s0_b + offs_k[:, None] * DV, mask=(offs_k < DK)[:, None] & vmask[None, :],
                     other=0.0)
    q_b = q_ptr + b * q_batch_stride + h * q_head_stride
    k_b = k_ptr + b * k_batch_stride + h * k_head_stride
    v_b = v_ptr + b * v_batch_stride + hv * v_head_stride
    beta_b = beta_ptr + b * beta_batch_stride + hv
    u_b = u_ptr + bh * NBT * DV + offs_v[None, :]
    o_b = o_ptr + b * N * HV * DV + hv * DV + offs_v[None, :]
    pairs_b = bh * NPAIR * (BT * BT) + tl.arange(0, BT)[:, None] * BT + tl.arange(0, BT)[None, :]

    for i0 in range(0, N, BT):
        bi = i0 // BT
        rows = i0 + tl.arange(0, BT)
        rvalid = rows < num
        # this block's loads first, used only after the pair loop (their latency hides there)
        if KS == DKP:
            k_raw = _row_tile(k_b, rows, rvalid, k_row_stride, DK, DKP)
            q_raw = _row_tile(q_b, rows, rvalid, q_row_stride, DK, DKP)
        v_raw = tl.load(v_b + rows[:, None].to(tl.int64) * v_row_stride + offs_v[None, :],
                        mask=rvalid[:, None] & vmask[None, :], other=0.0)
        beta_raw = tl.load(beta_b + rows.to(tl.int64) * beta_row_stride, mask=rvalid, other=0.0)
        row_pairs = pairs_b + (bi * (bi + 1) // 2) * (BT * BT)
        au = tl.zeros([BT, BV], tl.float32)
        pu = tl.zeros([BT, BV], tl.float32)
        if not ONE_BLOCK:
            c_i = tl.load(c_ptr + bh * NBT + rows)
            t_ii = tl.load(a_ptr + row_pairs + bi * (BT * BT))
            p_ii = tl.load(p_ptr + row_pairs + bi * (BT * BT))
            # the earlier blocks' deltas: sum_J A_IJ U_J (right side) and P_IJ U_J (output), the
            # decay exp(C_i - C_j) applied here (selected where the stored pair is not 0, which
            # it is off the ancestor mask: an overflowing exp there stays out)
            for bj in range(0, bi):
                u_j = tl.load(u_b + (bj * BT + tl.arange(0, BT))[:, None] * DV,
                              mask=vmask[None, :], other=0.0)
                c_j = tl.load(c_ptr + bh * NBT + bj * BT + tl.arange(0, BT))
                bkk = tl.load(a_ptr + row_pairs + bj * (BT * BT))
                qk = tl.load(p_ptr + row_pairs + bj * (BT * BT))
                decay = tl.exp(c_i[:, None] - c_j[None, :])
                au += tl.dot(tl.where(bkk != 0.0, decay, 0.0) * bkk, u_j,
                             input_precision=PRECISION)
                pu += tl.dot(tl.where(qk != 0.0, decay, 0.0) * qk, u_j,
                             input_precision=PRECISION)

        if KS == DKP:
            k_i = _normalised(k_raw, L2NORM)
            q_i = _q_normalised(q_raw, scale, L2NORM, DIVIDE)
        else:
            kn_i = _inv_norms(k_b, rows, rvalid, k_row_stride, DK, BT, KS, L2NORM)
            qn_i = _inv_norms(q_b, rows, rvalid, q_row_stride, DK, BT, KS, L2NORM)
        v_i = v_raw.to(tl.float32)
        beta_i = beta_raw.to(tl.float32)
        if ONE_BLOCK:   # N <= BT: the block's own pair here, no first launch
            mask_b = mask_ptr + b * N * W
            c_i = _path_sums(mask_b, g_ptr + b * g_batch_stride + hv, g_row_stride, rows, rvalid,
                             num, W, BT, CW)
            if KS == DKP:
                kk = tl.dot(k_i, tl.trans(k_i), input_precision=PRECISION)
                qk = tl.dot(q_i, tl.trans(k_i), input_precision=PRECISION)
            else:
                kk, qk = _gram(k_b, q_b, k_row_stride, q_row_stride, rows, rvalid, kn_i, qn_i,
                               rows, rvalid, kn_i, DK, scale, BT, KS, DIVIDE, PRECISION)
            t_ii, p_ii = _diagonal_block(kk, qk, beta_i, c_i,
                                         _ancestors(mask_b, rows, rows, rvalid, rvalid, W), rows,
                                         PRECISION)

        e_i = tl.exp(c_i)
        # K_I S0 and Q_I S0 (Dk in chunks of KS < Dk: S0's chunks re-read, from L1 / L2)
        if KS == DKP:
            ks = tl.dot(k_i, s0, input_precision=PRECISION)
            qs = tl.dot(q_i, s0, input_precision=PRECISION)
        else:
            ks = tl.zeros([BT, BV], tl.float32)
            qs = tl.zeros([BT, BV], tl.float32)
            for c in range(0, DK, KS):
                offs_k = c + tl.arange(0, KS)
                s0_c = tl.load(s0_b + offs_k[:, None] * DV,
                               mask=(offs_k < DK)[:, None] & vmask[None, :], other=0.0)
                k_c = _chunk(k_b, rows, rvalid, k_row_stride, c, DK, kn_i, KS)
                q_c = _q_chunk(q_b, rows, rvalid, q_row_stride, c, DK, qn_i, scale, KS, DIVIDE)
                ks += tl.dot(k_c, s0_c, input_precision=PRECISION)
                qs += tl.dot(q_c, s0_c, input_precision=PRECISION)
        r = beta_i[:, None] * (v_i - e_i[:, None] * ks) - au
        u = tl.dot(t_ii, r, input_precision=PRECISION)
        if not ONE_BLOCK:
            tl.store(u_b + rows[:, None] * DV, u, mask=vmask[None, :])
        o = e_i[:, None] * qs + pu + tl.dot(p_ii, u, input_precision=PRECISION)
        o = tl.where(rvalid[:, None], o, 0.0)
        tl.store(o_b + rows[:, None].to(tl.int64) * (HV * DV), o.to(o_ptr.dtype.element_ty),
                 mask=(rows < N)[:, None] & vmask[None, :])
        tl.debug_barrier()   # this block's U, stored, before the later blocks load it


# BT 16 rows a block (tl.dot's least). 16-bit inputs (tf32 dots): the Gram products over Dk
# chunks of KC, the solve's rows whole (its S0 tile in registers), BV 64 Dv columns a solve
# program, 4 warps. float32 inputs (IEEE dots, on CUDA cores, whose operands hold all of K in
# each thread): Dk in chunks of 32 everywhere and BV 16, or they spill. Path sums in column
# chunks of CW. Registers at Qwen3.6's shapes (bench/triton_resources.py): docs/kernels.md.
BT, MAX_CW, NUM_WARPS = 16, 128, 4
JC = 4   # column blocks a program of the first launch: a block row of up to 4 in one program
MAX_BV, MAX_BV_FP32, KC, KC_FP32 = 64, 16, 32, 32
FP32_PRECISION = "ieee"


def tile_sizes(n: int, dk: int, dv: int, fp32: bool) -> tuple[int, int, int, int, int, int]:
    """(BT, DKP, KC, KS, BV, CW): node rows a block, Dk padded to a power of two, the Dk chunk of
    a Gram product and of a product with S0, the Dv tile of a solve program and the path sums'
    column chunk (tl.dot needs >= 16); ``fp32``: float32 inputs. From the shapes and dtype,
    never from B (a sequence's result must not depend on how many share the launch)."""
    dkp = max(16, next_power_of_2(dk))
    kc = min(KC_FP32 if fp32 else KC, dkp)
    ks = min(KC_FP32, dkp) if fp32 else dkp
    bv = max(16, min(MAX_BV_FP32 if fp32 else MAX_BV, next_power_of_2(dv)))
    return BT, dkp, kc, ks, bv, max(16, min(MAX_CW, next_power_of_2(n)))


def scratch_bytes(b: int, n: int, hv: int, dv: int) -> int:
    """Float32 scratch one call allocates: A (diagonal blocks inverted) and P per block pair, C
    per row, U per row and Dv column; none for one row block (N <= BT)."""
    nb = cdiv(n, BT)
    if nb == 1:
        return 4
    return 4 * b * hv * (nb * (nb + 1) * BT * BT + nb * BT + nb * BT * dv)


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
    fp32 = v.dtype == torch.float32
    bt, dkp, kc, ks, bv, cw = tile_sizes(N, DK, DV, fp32)
    nb = cdiv(N, bt)
    npair, nbt = nb * (nb + 1) // 2, nb * bt
    one_block = nb == 1
    if one_block:      # nothing goes through scratch: one float32 as the unused pointers
        a = p = c = u = torch.empty(1, dtype=torch.float32, device=dev)
    else:              # A (diagonal blocks inverted) and P per block pair, C per row, U per row
        sizes = [B * HV * npair * bt * bt] * 2 + [B * HV * nbt, B * HV * nbt * DV]
        a, p, c, u = torch.empty(sum(sizes), dtype=torch.float32, device=dev).split(sizes)
    divide = scale is None
    scale = float(DK ** 0.5 if divide else scale)
    precision = FP32_PRECISION if fp32 else "tf32"
    if not one_block:
        nch = cdiv(nb, JC)
        _gated_delta_rows[(B * HV, nch * nb - JC * nch * (nch - 1) // 2)](
            q, k, g, beta, mask, num, a, p, c,
            N, mask.shape[2], HV, HV // H, DK, scale, npair, nbt,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            g.stride(0), g.stride(1), beta.stride(0), beta.stride(1), nb,
            BT=bt, JC=JC, KC=kc, CW=cw, L2NORM=bool(use_qk_l2norm), DIVIDE=divide,
            PRECISION=precision, num_warps=NUM_WARPS,
        )
    slots = state_slots if state_slots is not None else num     # dummy pointer, never read
    _gated_delta_solve[(B * HV, cdiv(DV, bv))](
        q, k, v, g, beta, mask, num, state, slots, a, p, c, u, o,
        N, mask.shape[2], HV, HV // H, DK, DV, scale, npair, nbt,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), g.stride(0), g.stride(1),
        beta.stride(0), beta.stride(1), state.stride(0), state.stride(1),
        BT=bt, DKP=dkp, KS=ks, BV=bv, CW=cw, ONE_BLOCK=one_block,
        HAS_SLOTS=state_slots is not None, L2NORM=bool(use_qk_l2norm), DIVIDE=divide,
        PRECISION=precision, num_warps=NUM_WARPS,
    )
    return o
