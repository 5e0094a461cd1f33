"""Triton kernels of the hybrid targets' exact mode (``ops.exact``, ``models.hybrid_exact``):
the Gated DeltaNet layer's per-token inputs, its recurrence walked one token at a time, and the
row ops around it (the zero-centred RMSNorm, the gated output norm, sigmoid gates).

* ``_walk``: a program per (sequence, v-head, tile of BV value columns) holds its [Dk, BV]
  float32 state in registers and steps a sequence's nodes in a plan's order, each from its
  parent's state (the step before, still in registers; one kept in scratch; or the committed
  state). A tree is walked depth first (``models.walk_plan``): only branch points' states are
  kept, in slots reused along the walk, so the scratch and its traffic follow the tree's
  branching, not its size. One compiled kernel serves a tree, a prompt (a chain; the last state
  stored into the pool) and a commit (the accepted path as a chain, no outputs): the mode and
  the plan are runtime arguments, so every step of the three runs the same instructions.
* ``_prep``: a program per (token, v-head): the conv of the token's window (its taps gathered
  from the layer's input sequence by row index, so no window tensor is built), q and k
  L2-normalised (q scaled) for the heads it serves, the gates g and beta.
* ``_zc_norm_rows``, ``_gated_norm_rows``, ``_sigmoid_gate``: a program per row (or row block).

Every size that shapes a reduction (Dk, Dv, BV, C, W, the row length, the warps) comes from the
config, never from B, N or T, and FMA contraction is off in the kernels' own arithmetic (the
libdevice log and exp keep their fixed internal FMAs), so a token's bits follow its operands.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .sizes import next_power_of_2

__all__ = ["walk", "prep", "zc_norm_rows", "gated_norm_rows", "sigmoid_gate", "VALUE_TILE"]

VALUE_TILE = 32        # BV: value columns a walk program holds (a [Dk, 32] float32 state tile)
_OPTS = dict(enable_fp_fusion=False)


@triton.jit(do_not_specialize=["N", "HV", "H", "REP", "NSLOTS", "write_out", "store_last"])
def _walk(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, order_ptr, src_ptr, dst_ptr, count_ptr, pool_ptr,
          slot_ptr, out_ptr, keep_ptr, N, HV, H, REP, NSLOTS, write_out, store_last,
          DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Grid ``[B, Hv, cdiv(Dv, BV)]``. q, k: float32 [B, N, H, Dk] (unit, q scaled); v: [B, N,
    Hv, Dv]; g, beta: float32 [B, N, Hv]; order, src, dst int32 [B, N]
    (``models.walk_plan.WalkPlan``); counts int32 [B]; pool float32 [S, Hv, Dk, Dv]; slots
    int32 [B]; out [B, N, Hv, Dv]; keep float32 [B, Hv, NSLOTS, Dk, Dv]."""
    b = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1).to(tl.int64)
    rows = tl.arange(0, BK)
    cols = tl.program_id(2) * BV + tl.arange(0, BV)
    rok = rows < DK
    ok = rok[:, None] & (cols < DV)[None, :]
    tile = rows[:, None] * DV + cols[None, :]
    slot = tl.load(slot_ptr + b).to(tl.int64)
    s0 = tl.load(pool_ptr + (slot * HV + hv) * DK * DV + tile, mask=ok, other=0.0)
    kept = keep_ptr + (b * HV + hv) * NSLOTS * DK * DV
    h = hv // REP
    S = s0
    n = tl.load(count_ptr + b)
    node = tl.load(order_ptr + b * N)
    for i in range(0, n):
        nxt = tl.load(order_ptr + b * N + tl.minimum(i + 1, N - 1))    # the next step's node
        src = tl.load(src_ptr + b * N + i)
        dst = tl.load(dst_ptr + b * N + i)
        # the starting state: the committed one, the previous step's (in registers) or a kept
        # one; a slot past the scratch (a wrong depth bound) reads NaN, never another state
        kept_ok = ((tl.zeros_like(tile) + ((src >= 0) & (src < NSLOTS)).to(tl.int32)) > 0) & ok
        other = tl.load(kept + src.to(tl.int64) * DK * DV + tile, mask=kept_ok, other=float("nan"))
        S = tl.where(src == -1, s0, tl.where(src >= 0, other, S))
        tok = b * N + node
        kk = tl.load(k_ptr + (tok * H + h) * DK + rows, mask=rok, other=0.0)
        qq = tl.load(q_ptr + (tok * H + h) * DK + rows, mask=rok, other=0.0)
        vv = tl.load(v_ptr + (tok * HV + hv) * DV + cols, mask=cols < DV, other=0.0).to(tl.float32)
        gg = tl.load(g_ptr + tok * HV + hv)
        bb = tl.load(beta_ptr + tok * HV + hv)
        # transformers' order: decay, read, delta, write, output
        S = S * tl.exp(gg)
        u = (vv - tl.sum(S * kk[:, None], axis=0)) * bb
        S = S + kk[:, None] * u[None, :]
        if write_out:
            o = tl.sum(S * qq[:, None], axis=0)
            tl.store(out_ptr + (tok * HV + hv) * DV + cols, o.to(out_ptr.dtype.element_ty),
                     mask=cols < DV)
        if dst >= 0:
            fits = ((tl.zeros_like(tile) + (dst < NSLOTS).to(tl.int32)) > 0) & ok
            tl.store(kept + dst.to(tl.int64) * DK * DV + tile, S, mask=fits)
            # each thread reads back only what it stored (the same layout and offsets); the
            # barrier keeps a later step's load after every thread's store if that changes
            tl.debug_barrier()
        node = nxt
    if store_last:
        tl.store(pool_ptr + (slot * HV + hv) * DK * DV + tile, S, mask=ok)


def walk(q, k, v, g, beta, plan, counts, pool, slots, *, out: bool, store_last: bool,
         scratch=None):
    """Step every sequence's nodes in the order of ``plan`` (``models.walk_plan``: a tree's
    ``tree_plan``, a chain's ``chain_plan``), each from its parent's state.

    Parameters
    ----------
    q, k : float32 [B, N, H, Dk], unit rows (q scaled); v : [B, N, Hv, Dv] (any float dtype);
    g, beta : float32 [B, N, Hv]; plan : the walk's plan for these B x N nodes; counts : int32
    [B] (<= N: the nodes stepped); pool : float32 [S, Hv, Dk, Dv] (contiguous; its slots' states
    are written only with ``store_last``); slots : int32 [B]
    out : return every node's output [B, N, Hv, Dv] in v's dtype, rounded once (rows past a
        count: 0); the gated output norm rounds it so first in any case
    store_last : write the last stepped state into ``pool[slots[b]]`` (a prompt, a commit: a
        chain, whose last step is its last node)

    scratch : where the kept states go, float32 [B, Hv, plan.num_slots, Dk, Dv] (contiguous; an
        engine's preallocated workspace); None: allocated for the call

    Returns the outputs or None.
    """
    b, n, h, dk = k.shape
    hv, dv = v.shape[2], v.shape[3]
    dev = k.device
    o = torch.zeros(b, n, hv, dv, dtype=v.dtype, device=dev) if out else \
        torch.empty(1, dtype=v.dtype, device=dev)
    if scratch is None:
        kept = torch.empty(max(b * hv * plan.num_slots * dk * dv, 1), dtype=torch.float32,
                           device=dev)
    elif (scratch.shape != (b, hv, plan.num_slots, dk, dv) or scratch.dtype != torch.float32
          or not scratch.is_contiguous() or scratch.device != dev):
        raise ValueError(f"scratch must be a contiguous float32 tensor of shape "
                         f"{(b, hv, plan.num_slots, dk, dv)} on {dev}, got {tuple(scratch.shape)} "
                         f"{scratch.dtype} on {scratch.device}")
    else:
        kept = scratch if scratch.numel() else torch.empty(1, dtype=torch.float32, device=dev)
    bv = min(VALUE_TILE, next_power_of_2(dv))
    if b and n:
        c = (lambda t: t.contiguous())
        _walk[(b, hv, triton.cdiv(dv, bv))](
            c(q), c(k), c(v), c(g), c(beta), c(plan.order), c(plan.src), c(plan.dst), c(counts),
            pool, c(slots), o, kept, n, hv, h, hv // h, plan.num_slots, int(out), int(store_last),
            DK=dk, DV=dv, BK=next_power_of_2(dk), BV=bv, num_warps=4, **_OPTS)
    return o if out else None


@triton.jit
def _conv_of(seq_ptr, src_ptr, w_ptr, c, cok, C, W: tl.constexpr):
    """``silu(sum_j w[c, j] * x_j[c])`` in float32 over channels ``c``, taps j oldest first,
    tap j the sequence row ``src[j]``."""
    acc = tl.zeros(c.shape, tl.float32)
    for j in range(W):
        row = tl.load(src_ptr + j).to(tl.int64)
        x = tl.load(seq_ptr + row * C + c, mask=cok, other=0.0).to(tl.float32)
        acc += tl.load(w_ptr + c * W + j, mask=cok, other=0.0).to(tl.float32) * x
    return acc / (1.0 + tl.exp(-acc))


@triton.jit
def _softplus(a):
    """torch's softplus (threshold 20) as ``max(a, 0) + log1p(exp(-|a|))``, log1p by Goldberg's
    ``log(w) * u / (w - 1)`` (w = 1 + u): accurate where ``log(1 + u)`` would lose u."""
    u = tl.exp(-tl.abs(a))
    w = 1.0 + u
    log1p = tl.where(w == 1.0, u, tl.log(w) * (u / (w - 1.0)))
    return tl.where(a > 20.0, a, tl.maximum(a, 0.0) + log1p)


@triton.jit(do_not_specialize=["N", "L", "H", "HV"])
def _prep(seq_ptr, src_ptr, w_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, q_ptr, k_ptr, v_ptr, g_ptr,
          beta_ptr, N, L, H, HV, C, scale, W: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
          BK: tl.constexpr, BV: tl.constexpr):
    """Grid ``[B N, Hv]``. seq [B, L, C] (the layer's conv inputs after the conv state's W - 1
    columns) and w [C, W] in the model dtype; src int32 [B, N, W] (token n's taps: rows of its
    sequence); a, b [B N, Hv] (the gate projections); A_log, dt_bias [Hv]. Writes v [B N, Hv,
    Dv] (model dtype), g and beta float32 [B N, Hv] (beta rounded to the model dtype first), and
    for v-heads below H the q and k rows [B N, H, Dk] float32: the conv output rounded to the
    model dtype, L2-normalised (``x * rsqrt(sum(x * x) + 1e-6)``), q times ``scale``."""
    t = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1).to(tl.int64)
    seq = seq_ptr + (t // N) * L * C
    src = src_ptr + t * W
    dtype = v_ptr.dtype.element_ty
    vc = tl.arange(0, BV)
    vok = vc < DV
    y = _conv_of(seq, src, w_ptr, 2 * H * DK + hv * DV + vc, vok, C, W)
    tl.store(v_ptr + (t * HV + hv) * DV + vc, y.to(dtype), mask=vok)
    a = tl.load(a_ptr + t * HV + hv).to(tl.float32) + tl.load(dtb_ptr + hv).to(tl.float32)
    tl.store(g_ptr + t * HV + hv, -tl.exp(tl.load(alog_ptr + hv).to(tl.float32)) * _softplus(a))
    bl = tl.load(b_ptr + t * HV + hv).to(tl.float32)
    tl.store(beta_ptr + t * HV + hv, (1.0 / (1.0 + tl.exp(-bl))).to(dtype).to(tl.float32))
    if hv < H:
        kc = tl.arange(0, BK)
        kok = kc < DK
        for part in tl.static_range(2):           # q, then k
            x = _conv_of(seq, src, w_ptr, part * H * DK + hv * DK + kc, kok, C, W)
            x = x.to(dtype).to(tl.float32)
            x = x * tl.math.rsqrt(tl.sum(x * x, axis=0) + 1e-6)
            if part == 0:
                tl.store(q_ptr + (t * H + hv) * DK + kc, x * scale, mask=kok)
            else:
                tl.store(k_ptr + (t * H + hv) * DK + kc, x, mask=kok)


def prep(seq, src, weight, a, b, a_log, dt_bias, h, dk, dv, scale):
    """Per token of ``src [B, N, W]`` (its conv taps, oldest first: rows of ``seq [B, L, C]``):
    ``(q, k)`` float32 [B, N, H, Dk] (unit, q scaled), ``v [B, N, Hv, Dv]`` (seq's dtype),
    ``g, beta`` float32 [B, N, Hv], from the conv weight [C, W] and the gate projections
    ``a, b [B, N, Hv]``."""
    bsz, n, width = src.shape
    l, c = seq.shape[1], seq.shape[2]
    hv = a.shape[-1]
    t = bsz * n
    dev, dtype = seq.device, seq.dtype
    q = torch.zeros(t, h, dk, dtype=torch.float32, device=dev)
    k = torch.zeros_like(q)
    v = torch.empty(t, hv, dv, dtype=dtype, device=dev)
    g = torch.empty(t, hv, dtype=torch.float32, device=dev)
    beta = torch.empty_like(g)
    if t:
        _prep[(t, hv)](seq.contiguous(), src.to(torch.int32).contiguous(), weight.contiguous(),
                       a.reshape(t, hv).contiguous(), b.reshape(t, hv).contiguous(), a_log, dt_bias,
                       q, k, v, g, beta, n, l, h, hv, c, float(scale), W=width, DK=dk, DV=dv,
                       BK=next_power_of_2(dk), BV=next_power_of_2(dv), num_warps=4, **_OPTS)
    return (q.view(bsz, n, h, dk), k.view(bsz, n, h, dk), v.view(bsz, n, hv, dv),
            g.view(bsz, n, hv), beta.view(bsz, n, hv))


@triton.jit
def _zc_norm_rows(x_ptr, w_ptr, out_ptr, D, eps, BLOCK: tl.constexpr):
    """Grid ``[R]``: ``round((x * rsqrt(mean(x^2) + eps)) * (1 + w))`` in float32."""
    r = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    ok = c < D
    x = tl.load(x_ptr + r * D + c, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + c, mask=ok, other=0.0).to(tl.float32)
    y = x * tl.math.rsqrt(tl.sum(x * x, axis=0) / D + eps) * (1.0 + w)
    tl.store(out_ptr + r * D + c, y.to(out_ptr.dtype.element_ty), mask=ok)


def zc_norm_rows(x, weight, eps):
    """transformers' zero-centred RMSNorm of every row of ``x [..., D]`` (weight [D])."""
    d = x.shape[-1]
    xc = x.contiguous()
    out = torch.empty_like(xc)
    rows = xc.numel() // d if d else 0
    if rows:
        _zc_norm_rows[(rows,)](xc, weight.contiguous(), out, d, float(eps),
                               BLOCK=next_power_of_2(d), num_warps=4, **_OPTS)
    return out


@triton.jit
def _gated_norm_rows(o_ptr, z_ptr, w_ptr, out_ptr, D, eps, BLOCK: tl.constexpr):
    """Grid ``[R]``: ``round(round(w * round(o' * rsqrt(mean(o'^2) + eps))) * silu(z))`` with o'
    the float32 output rounded to the model dtype (transformers' ``Qwen3_5RMSNormGated``)."""
    r = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    ok = c < D
    dtype = out_ptr.dtype.element_ty
    o = tl.load(o_ptr + r * D + c, mask=ok, other=0.0).to(dtype).to(tl.float32)
    normed = (o * tl.math.rsqrt(tl.sum(o * o, axis=0) / D + eps)).to(dtype).to(tl.float32)
    w = tl.load(w_ptr + c, mask=ok, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + r * D + c, mask=ok, other=0.0).to(tl.float32)
    gated = (w * normed).to(dtype).to(tl.float32) * (z / (1.0 + tl.exp(-z)))
    tl.store(out_ptr + r * D + c, gated.to(dtype), mask=ok)


def gated_norm_rows(o, z, weight, eps):
    """``Qwen3_5RMSNormGated(o) * silu(z)`` per head row: ``o`` (float32 or the model dtype:
    rounded to it first) and ``z`` (model dtype) [..., Dv], weight [Dv]; returns z's dtype and
    shape."""
    d = z.shape[-1]
    zc = z.contiguous()
    out = torch.empty_like(zc)
    rows = zc.numel() // d if d else 0
    if rows:
        _gated_norm_rows[(rows,)](o.contiguous(), zc, weight.contiguous(), out, d, float(eps),
                                  BLOCK=next_power_of_2(d), num_warps=4, **_OPTS)
    return out


@triton.jit
def _sigmoid_gate(x_ptr, g_ptr, base_ptr, out_ptr, D, G_COLS, HAS_BASE: tl.constexpr,
                  BLOCK: tl.constexpr):
    """Grid ``[R, cdiv(D, BLOCK)]``: ``[base +] x * sigmoid(g)``, each product and sum rounded
    to the dtype (torch's order); g one per element (``G_COLS`` D) or one per row (1)."""
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = c < D
    dtype = out_ptr.dtype.element_ty
    g = tl.load(g_ptr + r * G_COLS + tl.where(G_COLS == 1, 0, c), mask=ok, other=0.0).to(tl.float32)
    s = (1.0 / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    y = (tl.load(x_ptr + r * D + c, mask=ok, other=0.0).to(tl.float32) * s).to(dtype)
    if HAS_BASE:
        y = (tl.load(base_ptr + r * D + c, mask=ok, other=0.0).to(tl.float32) + y.to(tl.float32)).to(dtype)
    tl.store(out_ptr + r * D + c, y, mask=ok)


def sigmoid_gate(x, gate, base=None):
    """``x * sigmoid(gate)`` (``+ base``), ``x [..., D]``; gate [..., D] or [..., 1]."""
    d = x.shape[-1]
    xc = x.contiguous()
    out = torch.empty_like(xc)
    rows = xc.numel() // d if d else 0
    if rows:
        block = min(1024, next_power_of_2(d))
        _sigmoid_gate[(rows, triton.cdiv(d, block))](
            xc, gate.contiguous(), xc if base is None else base.contiguous(), out, d,
            gate.shape[-1], HAS_BASE=base is not None, BLOCK=block,
            num_warps=4, **_OPTS)
    return out
