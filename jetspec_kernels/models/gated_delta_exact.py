"""The Gated DeltaNet layer in the exact mode (:mod:`jetspec_kernels.ops.exact`): a token's
output, and every state it leaves, the same bits whether the token is decoded alone, verified at
any node of any tree, prefilled inside a prompt of any length, or inside a batch of any size.

The normal forms (:mod:`.gated_delta`) verify a tree in the chunked (WY) form and prefill in
64-token chunks: the same function in other associations, so a tree node's bits differ from the
one-token step's. Here the recurrence *is* the one-token step
(``python_ref.gated_delta_tree.gated_delta_step``: transformers' order of operations, float32)
and every node steps from its parent's state: a tree is walked node by node in topological
order, a prompt is a chain, and the commit replays the accepted path's steps from the committed
state. Each step, conv window, q/k normalisation and gate is its own call of a fixed shape (the
config's, never B's or N's) on fresh copies (``ops.exact.per_row``), so its bits follow its
values alone; the conv and recurrent states are only copied.

Reference backend (the CPU) only. The walk keeps one tree's per-node states until it ends (N x
Hv x Dk x Dv float32 a sequence): a cost of this reference path, not of a kernel.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..ops.exact import per_row
from ..python_ref.causal_conv1d_tree import conv_window_sources
from ..python_ref.gated_delta_tree import gated_delta_step, l2norm
from .gated_delta import _conv_weight, _split

__all__ = ["ExactTreeInputs", "exact_linear_prompt", "exact_linear_tree", "exact_linear_commit"]


@dataclass
class ExactTreeInputs:
    """What the exact commit keeps of a verified tree: the conv inputs ``mixed [B, N, C]`` and
    the steps' own operands, ``k`` float32 [B, N, Hv, Dk] (normalised), ``v [B, N, Hv, Dv]``,
    ``g, beta [B, N, Hv]``."""

    mixed: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor


def _gates(b_row, a_row, w):
    """One token's gates from its ``in_proj_b`` / ``in_proj_a`` rows [1, Hv]: (g float32,
    beta in the model dtype), transformers' formulas."""
    g = -w["linear_attn.A_log"].float().exp() * F.softplus(a_row.float() + w["linear_attn.dt_bias"])
    return g, b_row.sigmoid()


def _project(a, w, cfg, linear):
    """As :func:`.gated_delta._project`, every GEMM ``linear`` (exact) and the gates row by row."""
    mixed = linear(a, w["linear_attn.in_proj_qkv.weight"])
    z = linear(a, w["linear_attn.in_proj_z.weight"]).unflatten(-1, (-1, cfg.linear_value_head_dim))
    g, beta = per_row(lambda b_row, a_row: _gates(b_row, a_row, w),
                      linear(a, w["linear_attn.in_proj_b.weight"]),
                      linear(a, w["linear_attn.in_proj_a.weight"]))
    return mixed, z, g, beta


def _conv(windows, weight):
    """``silu(sum_j weight[:, j] * window[j])`` of every token's window ``[..., W, C]`` (model
    dtype), a window a call, float32, rounded to the model dtype (transformers' conv output)."""
    width, c = windows.shape[-2:]
    wt = weight.float().t().contiguous()                     # [W, C]

    def one(row):
        return F.silu((row.view(1, width, c).float() * wt).sum(dim=1)).to(row.dtype)
    return per_row(one, windows.flatten(-2))


def _units(x, rep, scale=None):
    """q or k rows ``[..., H, Dk]`` -> float32 ``[..., Hv, Dk]``: repeated to the v-heads,
    L2-normalised (transformers' l2norm), times ``scale`` when given; a token a call."""
    h, dk = x.shape[-2:]

    def one(row):
        u = l2norm(row.view(1, h, dk).repeat_interleave(rep, dim=1).float())
        return (u if scale is None else u * scale).reshape(1, -1)
    return per_row(one, x.flatten(-2)).unflatten(-1, (h * rep, dk))


def _output(o, z, w, eps, row_linear):
    """transformers' ``Qwen3_5RMSNormGated(o) * silu(z)`` a token at a time, then out_proj by
    ``row_linear``. ``o`` float32 [B, N, Hv, Dv] (rounded to z's dtype first), ``z`` the same shape."""
    dtype, hv, dv = z.dtype, z.shape[-2], z.shape[-1]
    weight = w["linear_attn.norm.weight"]

    def one(o_row, z_row):
        of = o_row.view(1, hv, dv).to(dtype).float()
        normed = (of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)
        gated = (weight * normed) * F.silu(z_row.view(1, hv, dv).float())
        return gated.to(dtype).reshape(1, -1)
    return row_linear(per_row(one, o.flatten(-2), z.flatten(-2)), w["linear_attn.out_proj.weight"])


def _step(S, q, k, v, g, beta):
    """One recurrent step of one token (every v-head), on fresh copies of its rows: ``S`` float32
    [1, Hv, Dk, Dv]; q, k float32 [Hv, Dk]; v [Hv, Dv]; g, beta [Hv]. Returns (S', o [1, Hv, Dv])."""
    fresh = (lambda t: t.float().clone()[None])
    return gated_delta_step(S, fresh(q), fresh(k), fresh(v), fresh(g), fresh(beta))


def _qkv(conv, cfg):
    """Conv outputs [B, N, C] -> (q scaled, k) float32 [B, N, Hv, Dk] and v [B, N, Hv, Dv]."""
    q, k, v = _split(conv, cfg)
    rep = cfg.linear_num_value_heads // cfg.linear_num_key_heads
    return _units(q, rep, cfg.linear_key_head_dim ** -0.5), _units(k, rep), v


def exact_linear_prompt(a, w, cfg, lens, conv_pool, rec_pool, slots, eps, linear, row_linear):
    """:func:`.gated_delta.linear_prefill` exact: right-padded prompts ``a [B, T, Hd]`` (normed)
    from zero states, each token stepped as a one-token decode would; the states after
    ``lens[b]`` tokens written at ``slots``. Rows past a prompt's length are 0 before out_proj.
    ``linear`` / ``row_linear``: the exact GEMMs (column- and row-parallel)."""
    b, t, _ = a.shape
    mixed, z, g, beta = _project(a, w, cfg, linear)
    weight = _conv_weight(w)
    width, c = weight.shape[1], mixed.shape[-1]
    windows = mixed.new_zeros(b, t, width, c)
    o = torch.zeros(b, t, cfg.linear_num_value_heads, cfg.linear_value_head_dim, device=a.device)
    for s in range(b):
        n = int(lens[s])
        seq = torch.cat([mixed.new_zeros(width - 1, c), mixed[s, :n]])      # zeros before the prompt
        windows[s, :n] = seq.unfold(0, width, 1).transpose(1, 2)            # [n, W, C]
        conv_pool[int(slots[s])] = seq[n:].t()                              # its last W - 1 inputs
    q, k, v = _qkv(_conv(windows, weight), cfg)
    for s in range(b):
        S = rec_pool.new_zeros(1, *rec_pool.shape[1:])
        for i in range(int(lens[s])):
            S, o[s, i] = _step(S, q[s, i], k[s, i], v[s, i], g[s, i], beta[s, i])
        rec_pool[int(slots[s])] = S[0]
    return _output(o, z, w, eps, row_linear)


def exact_linear_tree(a, w, cfg, parents, num_nodes, conv_pool, rec_pool, slots, eps, linear,
                      row_linear):
    """:func:`.gated_delta.linear_tree` exact: every node of ``a [B, N, Hd]`` (normed) stepped
    from its parent's state (the root from the committed one), its conv window gathered along
    its path. States read only. Returns ``(out [B, N, Hd], ExactTreeInputs)``; padding nodes' rows
    are 0 before out_proj."""
    b, n, _ = a.shape
    mixed, z, g, beta = _project(a, w, cfg, linear)
    weight = _conv_weight(w)
    width = weight.shape[1]
    slots_l = slots.long()
    seq = torch.cat([conv_pool[slots_l].transpose(1, 2), mixed], dim=1)    # [B, W-1+N, C]
    src = conv_window_sources(parents, width)
    windows = seq.gather(1, src.reshape(b, n * width, 1).expand(-1, -1, seq.shape[-1]))
    q, k, v = _qkv(_conv(windows.view(b, n, width, -1), weight), cfg)
    counts = [n] * b if num_nodes is None else [int(x) for x in num_nodes.tolist()]
    o = torch.zeros(b, n, cfg.linear_num_value_heads, cfg.linear_value_head_dim, device=a.device)
    for s in range(b):
        root = rec_pool[int(slots[s])].clone()[None]
        states = []
        for i in range(counts[s]):
            p = int(parents[s, i])
            S, o[s, i] = _step(root if p < 0 else states[p], q[s, i], k[s, i], v[s, i], g[s, i],
                               beta[s, i])
            states.append(S)
    return _output(o, z, w, eps, row_linear), ExactTreeInputs(mixed, k, v, g, beta)


def exact_linear_commit(kept: ExactTreeInputs, path, accept_len, conv_pool, rec_pool, slots) -> None:
    """:func:`.gated_delta.linear_commit` exact: the states at ``slots`` advanced along
    ``path[b, :accept_len[b] + 1]`` by the same one-token steps the tree walk took (so the
    committed state is the bits the walk computed for the last accepted node), the conv state
    by copying the path's last W - 1 inputs."""
    from ..ops.causal_conv1d_commit import causal_conv1d_commit
    causal_conv1d_commit(kept.mixed, path, accept_len, conv_pool, state_slots=slots,
                         backend="reference")
    k = kept.k
    for s in range(path.shape[0]):
        S = rec_pool[int(slots[s])].clone()[None]
        for node in path[s, :int(accept_len[s]) + 1].tolist():
            S, _ = _step(S, k[s, node], k[s, node], kept.v[s, node], kept.g[s, node],
                         kept.beta[s, node])
        rec_pool[int(slots[s])] = S[0]
