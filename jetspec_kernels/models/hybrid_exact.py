"""The hybrid (Qwen3.5 / Qwen3.6) target's exact mode (:mod:`jetspec_kernels.ops.exact`): the
Gated DeltaNet layer, whose token's output and every state it leaves are the same bits whether the
token is decoded alone, verified at any node of any tree, prefilled inside a prompt of any length,
or inside a batch of any size; and the row ops of the other layers (the zero-centred RMSNorm,
sigmoid gates).

The normal forms (:mod:`.gated_delta`) verify a tree in the chunked (WY) form and prefill in
64-token chunks: the same function in other associations, so a tree node's bits differ from the
one-token step's. Here the recurrence *is* the one-token step (transformers' order of operations,
float32) and every node steps from its parent's state: a tree is walked node by node in
topological order, a prompt is a chain, and the commit replays the accepted path's steps from the
committed state. Two engines, each self-consistent (their bits differ from each other's):

* **reference** (the CPU): each step (``python_ref.gated_delta_tree.gated_delta_step``), conv
  window, q/k normalisation, gate and norm is its own call of a fixed shape (the config's, never
  B's or N's) on fresh copies (``ops.exact.per_row``). The walk keeps one tree's per-node states
  until it ends (N x Hv x Dk x Dv float32 a sequence).
* **triton** (``triton.exact_gated_delta``): one program per token for the conv, normalisation
  and gates; the walk a program per (sequence, v-head, value tile), one compiled kernel for the
  tree (walked depth first, keeping only its branch points' states), the prompt and the commit;
  the row ops a program per row.

The conv and recurrent states are only copied between calls (a gather, ``causal_conv1d_commit``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import checks
from ..ops.causal_conv1d_commit import causal_conv1d_commit
from ..ops.causal_conv1d_tree import check_causal_conv1d_tree, check_conv_state
from ..ops.exact import lanes, per_row
from ..python_ref.gated_delta_tree import gated_delta_step, l2norm
from .gated_delta import conv_weight, split_qkv
from .walk_plan import chain_plan

__all__ = ["ExactTreeInputs", "exact_linear_prompt", "exact_linear_tree", "exact_linear_commit",
           "zc_norm", "sigmoid_gate"]


def _kernels():
    from ..triton import exact_gated_delta
    return exact_gated_delta


def zc_norm(x, weight, eps, be):
    """transformers' zero-centred ``Qwen3_5RMSNorm`` of every row of ``x [..., D]``:
    ``round(x * rsqrt(mean(x^2) + eps) * (1 + weight))`` in float32, a row at a time."""
    if be == "triton":
        return _kernels().zc_norm_rows(x, weight, eps)

    def one(r):
        xf = r.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.float())).to(r.dtype)
    return per_row(one, x)


def sigmoid_gate(x, gate, be, base=None):
    """``x * sigmoid(gate)`` (``base +`` it), each op rounded to x's dtype; ``x [..., D]``,
    ``gate`` x's shape or ``[..., 1]``, ``base`` x's shape."""
    if be == "triton":
        return _kernels().sigmoid_gate(x, gate, base)
    if base is None:
        return per_row(lambda r, g: lanes(lambda r, g: r * torch.sigmoid(g), r, g), x, gate)
    # one gate a row (the shared expert's): its sigmoid alone, a fixed [1, 1] call
    return per_row(lambda r, g, s: s + r * torch.sigmoid(g), x, gate, base)


@dataclass
class ExactTreeInputs:
    """What the exact commit keeps of a verified tree: the conv inputs ``mixed [B, N, C]``, the
    steps' own operands (``k`` float32, unit: [B, N, Hv, Dk] on the reference, [B, N, H, Dk] on
    triton; ``v [B, N, Hv, Dv]``; ``g, beta [B, N, Hv]``) and the engine that computed them."""

    mixed: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    backend: str


def _gates(b_row, a_row, w):
    """One token's gates from its ``in_proj_b`` / ``in_proj_a`` rows [1, Hv]: (g float32,
    beta in the model dtype), transformers' formulas (padded lanes: ``ops.exact.lanes``)."""
    g = lanes(lambda a, a_log, dt: -a_log.float().exp() * F.softplus(a.float() + dt), a_row,
              w["linear_attn.A_log"][None], w["linear_attn.dt_bias"][None])
    return g, lanes(torch.sigmoid, b_row)


def _conv(windows, weight):
    """``silu(sum_j weight[:, j] * window[j])`` of every token's window ``[..., W, C]`` (model
    dtype), a window a call, float32, rounded to the model dtype (transformers' conv output)."""
    width, c = windows.shape[-2:]
    wt = weight.float().t().contiguous()                     # [W, C]

    def one(row):
        summed = lanes(lambda x, w: (x * w).sum(dim=1), row.view(1, width, c).float(), wt[None])
        return lanes(F.silu, summed).to(row.dtype)
    return per_row(one, windows.flatten(-2))


def _units(x, rep, scale=None):
    """q or k rows ``[..., H, Dk]`` -> float32 ``[..., Hv, Dk]``: repeated to the v-heads,
    L2-normalised (transformers' l2norm), times ``scale`` when given; a head of a token a call
    (the same call whatever number of heads a rank holds)."""
    def one(row):
        u = l2norm(row.float())
        return u if scale is None else u * scale
    return per_row(one, x).repeat_interleave(rep, dim=-2)


def _inputs(a, w, cfg, sources_of, linear, be):
    """The projections of normed ``a [B, N, Hd]`` and every token's step operands: ``(mixed
    [B, N, C], z [B, N, Hv, Dv], q, k, v, g, beta)`` (:class:`ExactTreeInputs`' layouts).
    ``sources_of(mixed) -> (seq [B, L, C], src [B, N, W])``: token n's conv taps, oldest first,
    are the rows ``src[b, n]`` of ``seq`` (gathered inside the kernel on triton)."""
    mixed = linear(a, w["linear_attn.in_proj_qkv.weight"])
    z = linear(a, w["linear_attn.in_proj_z.weight"]).unflatten(-1, (-1, cfg.linear_value_head_dim))
    b_proj = linear(a, w["linear_attn.in_proj_b.weight"])
    a_proj = linear(a, w["linear_attn.in_proj_a.weight"])
    seq, src = sources_of(mixed)
    dk = cfg.linear_key_head_dim
    if be == "triton":
        q, k, v, g, beta = _kernels().prep(seq, src, conv_weight(w), a_proj, b_proj,
                                           w["linear_attn.A_log"], w["linear_attn.dt_bias"],
                                           cfg.linear_num_key_heads, dk, cfg.linear_value_head_dim,
                                           dk ** -0.5)
        return mixed, z, q, k, v, g, beta
    b, n, width = src.shape
    windows = seq.gather(1, src.reshape(b, n * width, 1).expand(-1, -1, seq.shape[-1]))
    g, beta = per_row(lambda b_row, a_row: _gates(b_row, a_row, w), b_proj, a_proj)
    q, k, v = split_qkv(_conv(windows.view(b, n, width, -1), conv_weight(w)), cfg)
    rep = cfg.linear_num_value_heads // cfg.linear_num_key_heads
    return mixed, z, _units(q, rep, dk ** -0.5), _units(k, rep), v, g, beta


def _output(o, z, w, eps, row_linear, be):
    """transformers' ``Qwen3_5RMSNormGated(o) * silu(z)`` a token's head at a time, then
    out_proj by ``row_linear``. ``o`` [B, N, Hv, Dv], float32 (the reference's walk) or z's dtype
    (triton's), rounded to z's dtype first either way; ``z`` the same shape in the model dtype."""
    weight = w["linear_attn.norm.weight"]
    if be == "triton":
        gated = _kernels().gated_norm_rows(o, z, weight, eps).flatten(-2)
    else:
        dtype, hv, dv = z.dtype, z.shape[-2], z.shape[-1]

        def one(o_row, z_row):          # a head of a token
            of = o_row.to(dtype).float()
            normed = (of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)
            return ((weight * normed) * F.silu(z_row.float())).to(dtype)
        gated = per_row(one, o, z).flatten(-2)
    return row_linear(gated, w["linear_attn.out_proj.weight"])


def _step(S, q, k, v, g, beta):
    """One recurrent step of one token (every v-head), on fresh copies of its rows: ``S`` float32
    [1, Hv, Dk, Dv]; q, k float32 [Hv, Dk]; v [Hv, Dv]; g, beta [Hv]. Returns (S', o [1, Hv, Dv])."""
    fresh = (lambda t: t.float().clone()[None])
    return gated_delta_step(S, fresh(q), fresh(k), fresh(v), fresh(g), fresh(beta),
                            exp=lambda g: lanes(torch.exp, g))


def _reference_walk(q, k, v, g, beta, parents, counts, rec_pool, slots, *, store_last):
    """The reference walk: each sequence's nodes ``0 .. counts[b] - 1`` stepped from their
    parents' states (-1: the pool's). Returns the outputs float32 [B, N, Hv, Dv] (0 past a
    count); with ``store_last`` the last state goes into the pool."""
    b, n, hv, _ = k.shape
    o = torch.zeros(b, n, hv, v.shape[-1], device=k.device)
    for s in range(b):
        root = rec_pool[int(slots[s])].clone()[None]
        states = []
        for i in range(int(counts[s])):
            p = int(parents[s, i])
            S, o[s, i] = _step(root if p < 0 else states[p], q[s, i], k[s, i], v[s, i], g[s, i],
                               beta[s, i])
            states.append(S)
        if store_last and states:
            rec_pool[int(slots[s])] = states[-1][0]
    return o


def _walk(q, k, v, g, beta, parents, counts, rec_pool, slots, be, *, plan, store_last):
    """The engine's walk; ``plan()``: the triton walk's plan for these parents (a callable, so a
    forward builds a tree's once for its layers; not called on the reference)."""
    if be == "triton":
        return _kernels().walk(q, k, v, g, beta, plan(), counts.to(torch.int32), rec_pool,
                               slots.to(torch.int32), out=True, store_last=store_last)
    return _reference_walk(q, k, v, g, beta, parents, counts, rec_pool, slots, store_last=store_last)


def exact_linear_prompt(a, w, cfg, lens, conv_pool, rec_pool, slots, eps, linear, row_linear, be):
    """:func:`.gated_delta.linear_prefill` exact: right-padded prompts ``a [B, T, Hd]`` (normed)
    from zero states, each token stepped as a one-token decode would (a chain); the states after
    ``lens[b]`` tokens written at ``slots``. Rows past a prompt's length are 0 before out_proj.
    ``linear`` / ``row_linear``: the exact GEMMs (column- and row-parallel); ``be``: the engine."""
    b, t, _ = a.shape
    width = w["linear_attn.conv1d.weight"].shape[-1]
    dev = a.device
    check_conv_state(conv_pool, slots, batch=b, channels=cfg.conv_dim, dtypes=(a.dtype,),
                     device=dev)
    checks.value_range("prompt_lens", lens, 1, t)
    seqs = []

    def sources_of(mixed):          # zeros before each prompt; token t's taps rows t .. t + W - 1
        seqs.append(torch.cat([mixed.new_zeros(b, width - 1, mixed.shape[-1]), mixed], dim=1))
        src = torch.arange(t, device=dev)[:, None] + torch.arange(width, device=dev)
        return seqs[0], src.expand(b, t, width)
    mixed, z, q, k, v, g, beta = _inputs(a, w, cfg, sources_of, linear, be)
    keep = lens.long()[:, None] + torch.arange(width - 1, device=dev)    # its last W - 1 inputs
    tail = seqs[0].gather(1, keep[..., None].expand(-1, -1, mixed.shape[-1]))
    conv_pool.index_copy_(0, slots.long(), tail.transpose(1, 2).to(conv_pool.dtype))
    chain = (torch.arange(t, device=dev, dtype=torch.int32) - 1).expand(b, t)
    rec_pool.index_fill_(0, slots.long(), 0)
    o = _walk(q, k, v, g, beta, chain, lens, rec_pool, slots, be, store_last=True,
              plan=lambda: chain_plan(b, t, dev))
    return _output(o, z, w, eps, row_linear, be)


def exact_linear_tree(a, w, cfg, parents, src, plan, num_nodes, conv_pool, rec_pool, slots, eps,
                      linear, row_linear, be):
    """:func:`.gated_delta.linear_tree` exact: every node of ``a [B, N, Hd]`` (normed) stepped
    from its parent's state (the root from the committed one), its conv window gathered along
    its path (``src()``: ``python_ref.causal_conv1d_tree.conv_window_sources(parents, W)``;
    ``plan()``: the triton walk's ``tree_plan``; callables, so that a forward builds them once
    for its layers, after the parents are checked). States read only. Returns ``(out [B, N, Hd],
    ExactTreeInputs)``; padding nodes' rows are 0 before out_proj."""
    def sources_of(mixed):      # the conv op's checks: parents, num_nodes, slots (named errors)
        check_causal_conv1d_tree(mixed, parents, conv_pool, conv_weight(w), None, slots,
                                 num_nodes, "silu")
        seq = torch.cat([conv_pool[slots.long()].transpose(1, 2), mixed], dim=1)   # [B, W-1+N, C]
        return seq, src()
    mixed, z, q, k, v, g, beta = _inputs(a, w, cfg, sources_of, linear, be)
    b, n = parents.shape
    counts = torch.full((b,), n, dtype=torch.int32, device=a.device) if num_nodes is None else num_nodes
    o = _walk(q, k, v, g, beta, parents, counts, rec_pool, slots, be, plan=plan, store_last=False)
    return _output(o, z, w, eps, row_linear, be), ExactTreeInputs(mixed, k, v, g, beta, be)


def exact_linear_commit(kept: ExactTreeInputs, path, accept_len, conv_pool, rec_pool, slots) -> None:
    """:func:`.gated_delta.linear_commit` exact: the states at ``slots`` advanced along
    ``path[b, :accept_len[b] + 1]`` by the steps the tree walk took (the accepted nodes' kept
    operands as a chain from the committed state, on the walk's engine: the committed state is
    the bits the walk computed for the last accepted node), the conv state by copying the
    path's last W - 1 inputs. No host sync on triton."""
    be = kept.backend
    causal_conv1d_commit(kept.mixed, path, accept_len, conv_pool, state_slots=slots, backend=be)
    b, p = path.shape
    rows = torch.arange(b, device=path.device)[:, None]
    node = path.long().clamp(min=0)          # entries past accept_len: any node, never stepped
    k, v, g, beta = (t[rows, node] for t in (kept.k, kept.v, kept.g, kept.beta))
    if be == "triton":
        _kernels().walk(k, k, v, g, beta, chain_plan(b, p, path.device),
                        accept_len.to(torch.int32) + 1, rec_pool, slots.to(torch.int32), out=False,
                        store_last=True)
    else:
        chain = (torch.arange(p, device=path.device) - 1).expand(b, p)
        _reference_walk(k, k, v, g, beta, chain, accept_len + 1, rec_pool, slots, store_last=True)
