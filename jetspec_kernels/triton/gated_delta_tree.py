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

Two launches after ``pack_mask`` (nodes in row blocks of BT = 16; a parent precedes its child, so
the system is block lower-triangular):

1. ``_gated_delta_pairs``, grid ``[B * Hv, NB (NB + 1) / 2]``: a program per sequence, v-head and block
   pair J <= I (everything that does not depend on U, all in parallel). C of both blocks from the
   bit-packed ancestor mask, k and q rows normalised (whole Dk rows in registers), then
   ``A_IJ`` and ``P_IJ = (D * Q K^T)_IJ`` into float32 scratch; a diagonal pair stores
   ``(I + A_II)^-1`` in place of A_II (``depth - 1`` Jacobi sweeps ``T <- I - A_II T`` from
   ``T = I``: A_II is nilpotent along the block's ancestor chains, so they give exactly forward
   substitution's inverse, depth being the most ancestors-or-self a row has in the block) and C.
2. ``_gated_delta_solve``, grid ``[B * Hv, Dv / BV]``: a program per sequence, v-head and Dv tile holds
   its S0 tile in registers and walks the row blocks in order (the one serial part): the right
   side ``beta (V_I - exp(C_I) K_I S0) - sum_{J<I} A_IJ U_J``, ``U_I = (I + A_II)^-1`` times it,
   ``O_I = exp(C_I) Q_I S0 + sum_{J<=I} P_IJ U_J``. U goes to float32 scratch for the later blocks
   (a barrier orders the program's own stores and loads); only [BT, BT] x [BT, BV] products on
   precomputed blocks and the two [BT, Dk] x [Dk, BV] products with S0 are on this path.

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

MAX_HEAD_DIM = 256   # Dk: whole rows in registers; longer ones would need chunks
L2NORM_EPS = 1e-6


@triton.jit
def _rows(ptr, rows, valid, n_stride, DK, DKP: tl.constexpr, L2NORM: tl.constexpr):
    """``[BT, DKP]`` float32: rows of q or k, l2-normalised when ``L2NORM`` (transformers'
    ``x * rsqrt(sum x^2 + eps)``); zeros where not ``valid`` or past Dk."""
    offs = tl.arange(0, DKP)
    x = tl.load(ptr + rows[:, None].to(tl.int64) * n_stride + offs[None, :],
                mask=valid[:, None] & (offs < DK)[None, :], other=0.0).to(tl.float32)
    if L2NORM:
        x = x * tl.math.rsqrt(tl.sum(x * x, 1) + 1e-6)[:, None]
    return x


@triton.jit
def _q_rows(ptr, rows, valid, n_stride, DK, scale, DKP: tl.constexpr, L2NORM: tl.constexpr,
            DIVIDE: tl.constexpr):
    """Rows of q as :func:`_rows`, then divided by sqrt(Dk) (``scale`` holds it) or scaled."""
    x = _rows(ptr, rows, valid, n_stride, DK, DKP, L2NORM)
    if DIVIDE:
        return tl.math.div_rn(x, tl.zeros_like(x) + scale)
    else:
        return x * scale


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
def _gated_delta_pairs(
    q_ptr, k_ptr, g_ptr, beta_ptr, mask_ptr, num_ptr, a_ptr, p_ptr, c_ptr,
    N, W, HV, H_PER, DK, scale, NPAIR, NBT,
    q_batch_stride, q_row_stride, q_head_stride,
    k_batch_stride, k_row_stride, k_head_stride,
    g_batch_stride, g_row_stride, beta_batch_stride, beta_row_stride,
    BT: tl.constexpr, DKP: tl.constexpr, CW: tl.constexpr, L2NORM: tl.constexpr,
    DIVIDE: tl.constexpr, PRECISION: tl.constexpr,
):
    bh = tl.program_id(0).to(tl.int64)       # b * HV + hv
    pair = tl.program_id(1)
    # (I, J) from pair = I (I + 1) / 2 + J, J <= I; the float root corrected to the exact one
    bi = ((tl.sqrt((8 * pair + 1).to(tl.float32)) - 1.0) * 0.5).to(tl.int32)
    bi = tl.where(bi * (bi + 1) // 2 > pair, bi - 1, bi)
    bi = tl.where((bi + 1) * (bi + 2) // 2 <= pair, bi + 1, bi)
    bj = pair - bi * (bi + 1) // 2
    b = bh // HV
    hv = bh % HV
    h = hv // H_PER
    num = tl.load(num_ptr + b)
    q_b = q_ptr + b * q_batch_stride + h * q_head_stride
    k_b = k_ptr + b * k_batch_stride + h * k_head_stride
    g_b = g_ptr + b * g_batch_stride + hv
    mask_b = mask_ptr + b * N * W

    rows = bi * BT + tl.arange(0, BT)
    cols = bj * BT + tl.arange(0, BT)
    rvalid = rows < num
    cvalid = cols < num
    k_i = _rows(k_b, rows, rvalid, k_row_stride, DK, DKP, L2NORM)
    q_i = _q_rows(q_b, rows, rvalid, q_row_stride, DK, scale, DKP, L2NORM, DIVIDE)
    kt_j = tl.trans(_rows(k_b, cols, cvalid, k_row_stride, DK, DKP, L2NORM))
    beta_i = tl.load(beta_ptr + b * beta_batch_stride + hv + rows.to(tl.int64) * beta_row_stride,
                     mask=rvalid, other=0.0).to(tl.float32)
    c_i = _path_sums(mask_b, g_b, g_row_stride, rows, rvalid, num, W, BT, CW)
    c_j = _path_sums(mask_b, g_b, g_row_stride, cols, cvalid, num, W, BT, CW)
    kk = tl.dot(k_i, kt_j, input_precision=PRECISION)
    qk = tl.dot(q_i, kt_j, input_precision=PRECISION)

    anc = _ancestors(mask_b, rows, cols, rvalid, cvalid, W)
    decay = tl.where(anc, tl.exp(c_i[:, None] - c_j[None, :]), 0.0)
    eye = rows[:, None] == cols[None, :]
    a = tl.where(anc & ~eye, beta_i[:, None] * decay * kk, 0.0)
    if bi == bj:
        one = tl.where(eye, 1.0, 0.0)
        depth = tl.max(tl.sum(anc.to(tl.int32), 1), 0)
        t = one
        for _ in range(1, depth):
            t = one - tl.dot(a, t, input_precision=PRECISION)
        a = t
        tl.store(c_ptr + bh * NBT + rows, c_i)
    blk = (bh * NPAIR + pair) * (BT * BT) + tl.arange(0, BT)[:, None] * BT + \
        tl.arange(0, BT)[None, :]
    tl.store(a_ptr + blk, a)
    tl.store(p_ptr + blk, tl.where(anc, decay * qk, 0.0))


@triton.jit
def _gated_delta_solve(
    q_ptr, k_ptr, v_ptr, beta_ptr, num_ptr, state_ptr, slots_ptr, a_ptr, p_ptr, c_ptr, u_ptr,
    o_ptr,
    N, HV, H_PER, DK, DV, scale, NPAIR, NBT,
    q_batch_stride, q_row_stride, q_head_stride,
    k_batch_stride, k_row_stride, k_head_stride,
    v_batch_stride, v_row_stride, v_head_stride,
    beta_batch_stride, beta_row_stride,
    state_slot_stride, state_head_stride,
    BT: tl.constexpr, DKP: tl.constexpr, BV: tl.constexpr, HAS_SLOTS: tl.constexpr,
    L2NORM: tl.constexpr, DIVIDE: tl.constexpr, PRECISION: tl.constexpr,
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
    offs_k = tl.arange(0, DKP)
    s0 = tl.load(state_ptr + slot * state_slot_stride + hv * state_head_stride
                 + offs_k[:, None] * DV + offs_v[None, :],
                 mask=(offs_k < DK)[:, None] & vmask[None, :], other=0.0)
    q_b = q_ptr + b * q_batch_stride + h * q_head_stride
    k_b = k_ptr + b * k_batch_stride + h * k_head_stride
    v_b = v_ptr + b * v_batch_stride + hv * v_head_stride
    beta_b = beta_ptr + b * beta_batch_stride + hv
    u_b = u_ptr + bh * NBT * DV + offs_v[None, :]
    o_b = o_ptr + b * N * HV * DV + hv * DV + offs_v[None, :]
    blk = tl.arange(0, BT)[:, None] * BT + tl.arange(0, BT)[None, :]
    pairs_b = bh * NPAIR * (BT * BT) + blk

    for i0 in range(0, N, BT):
        bi = i0 // BT
        rows = i0 + tl.arange(0, BT)
        rvalid = rows < num
        # loads that do not wait for the earlier blocks' U first
        k_i = _rows(k_b, rows, rvalid, k_row_stride, DK, DKP, L2NORM)
        q_i = _q_rows(q_b, rows, rvalid, q_row_stride, DK, scale, DKP, L2NORM, DIVIDE)
        v_i = tl.load(v_b + rows[:, None].to(tl.int64) * v_row_stride + offs_v[None, :],
                      mask=rvalid[:, None] & vmask[None, :], other=0.0).to(tl.float32)
        beta_i = tl.load(beta_b + rows.to(tl.int64) * beta_row_stride, mask=rvalid,
                         other=0.0).to(tl.float32)
        c_i = tl.load(c_ptr + bh * NBT + rows)
        row_pairs = pairs_b + (bi * (bi + 1) // 2) * (BT * BT)
        t_ii = tl.load(a_ptr + row_pairs + bi * (BT * BT))
        p_ii = tl.load(p_ptr + row_pairs + bi * (BT * BT))

        # the earlier blocks' deltas: sum_J A_IJ U_J (right side) and P_IJ U_J (output)
        au = tl.zeros([BT, BV], tl.float32)
        pu = tl.zeros([BT, BV], tl.float32)
        for bj in range(0, bi):
            u_j = tl.load(u_b + (bj * BT + tl.arange(0, BT))[:, None] * DV, mask=vmask[None, :],
                          other=0.0)
            au += tl.dot(tl.load(a_ptr + row_pairs + bj * (BT * BT)), u_j,
                         input_precision=PRECISION)
            pu += tl.dot(tl.load(p_ptr + row_pairs + bj * (BT * BT)), u_j,
                         input_precision=PRECISION)

        e_i = tl.exp(c_i)
        ks = tl.dot(k_i, s0, input_precision=PRECISION)
        qs = tl.dot(q_i, s0, input_precision=PRECISION)
        r = beta_i[:, None] * (v_i - e_i[:, None] * ks) - au
        u = tl.dot(t_ii, r, input_precision=PRECISION)
        tl.store(u_b + rows[:, None] * DV, u, mask=vmask[None, :])
        o = e_i[:, None] * qs + pu + tl.dot(p_ii, u, input_precision=PRECISION)
        o = tl.where(rvalid[:, None], o, 0.0)
        tl.store(o_b + rows[:, None].to(tl.int64) * (HV * DV), o.to(o_ptr.dtype.element_ty),
                 mask=(rows < N)[:, None] & vmask[None, :])
        tl.debug_barrier()   # this block's U, stored, before the later blocks load it


# BT 16 rows a block (tl.dot's least); BV Dv columns a solve program: 32 with 16-bit inputs (at
# B 1 the 32 v-heads give 128 programs), 16 with float32 ones (IEEE dots on CUDA cores: BV 32
# spills); path sums in column chunks of CW; 4 warps. Resources at Qwen3.6's shapes
# (bench/triton_resources.py): docs/kernels.md, "Gated DeltaNet tree (Triton)".
BT, MAX_BV, MAX_BV_FP32, MAX_CW, NUM_WARPS = 16, 32, 16, 128, 4
FP32_PRECISION = "ieee"


def tile_sizes(n: int, dk: int, dv: int, fp32: bool) -> tuple[int, int, int, int]:
    """(BT, DKP, BV, CW): node rows a block, Dk padded to a power of two, the Dv tile of a solve
    program (``fp32``: float32 inputs) and the path sums' column chunk (tl.dot needs >= 16).
    From the shapes and dtype, never from B (a sequence's result must not depend on its batch)."""
    bv = min(MAX_BV_FP32 if fp32 else MAX_BV, next_power_of_2(dv))
    return BT, max(16, next_power_of_2(dk)), max(16, bv), max(16, min(MAX_CW, next_power_of_2(n)))


def scratch_bytes(b: int, n: int, hv: int, dv: int) -> int:
    """Float32 scratch one call allocates: A (diagonal blocks inverted) and P per block pair,
    C per row, U per row and Dv column."""
    nb = cdiv(n, BT)
    return 4 * b * hv * (2 * nb * (nb + 1) // 2 * BT * BT + nb * BT + nb * BT * dv)


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
    bt, dkp, bv, cw = tile_sizes(N, DK, DV, v.dtype == torch.float32)
    nb = cdiv(N, bt)
    npair, nbt = nb * (nb + 1) // 2, nb * bt
    pairs = torch.empty(2 * B * HV * npair * bt * bt, dtype=torch.float32, device=dev)
    a, p = pairs[:pairs.numel() // 2], pairs[pairs.numel() // 2:]
    c = torch.empty(B * HV * nbt, dtype=torch.float32, device=dev)
    u = torch.empty(B * HV * nbt * DV, dtype=torch.float32, device=dev)
    divide = scale is None
    scale = float(DK ** 0.5 if divide else scale)
    precision = FP32_PRECISION if v.dtype == torch.float32 else "tf32"
    _gated_delta_pairs[(B * HV, npair)](
        q, k, g, beta, mask, num, a, p, c,
        N, mask.shape[2], HV, HV // H, DK, scale, npair, nbt,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        g.stride(0), g.stride(1), beta.stride(0), beta.stride(1),
        BT=bt, DKP=dkp, CW=cw, L2NORM=bool(use_qk_l2norm), DIVIDE=divide, PRECISION=precision,
        num_warps=NUM_WARPS,
    )
    slots = state_slots if state_slots is not None else num     # dummy pointer, never read
    _gated_delta_solve[(B * HV, cdiv(DV, bv))](
        q, k, v, beta, num, state, slots, a, p, c, u, o,
        N, HV, HV // H, DK, DV, scale, npair, nbt,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), beta.stride(0), beta.stride(1),
        state.stride(0), state.stride(1),
        BT=bt, DKP=dkp, BV=bv, HAS_SLOTS=state_slots is not None, L2NORM=bool(use_qk_l2norm),
        DIVIDE=divide, PRECISION=precision, num_warps=NUM_WARPS,
    )
    return o
