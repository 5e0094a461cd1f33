"""The Gated DeltaNet (linear attention) layer of Qwen3.5 / Qwen3.6 targets.

transformers' ``Qwen3_5GatedDeltaNet`` in three modes over a per-sequence state (a conv state pool
[S, C, W - 1] in the model dtype and a recurrent state pool float32 [S, Hv, Dk, Dv], indexed by
state slots int32 [B]):

    prefill  the prompt from zero states; writes the states after each prompt's last token
    tree     every node of a draft tree from the committed states (read only), along its own
             ancestor path; keeps the nodes' inputs for the commit
    commit   advance the states along the accepted path (the kept inputs; no recompute)

Decoding one token is a one-node tree and its commit. Projections, gates and the output norm are
torch; the conv is :func:`~jetspec_kernels.causal_conv1d_tree` / ``causal_conv1d_commit``, the
recurrence :func:`~jetspec_kernels.gated_delta_tree` / ``gated_delta_commit`` and, over a prompt,
:func:`chunked_recurrence` (64 tokens a chunk) after a torch conv (prompts of any length).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..ops.causal_conv1d_commit import causal_conv1d_commit
from ..ops.causal_conv1d_tree import causal_conv1d_tree
from ..ops.gated_delta_commit import gated_delta_commit
from ..ops.gated_delta_tree import gated_delta_tree
from ..python_ref.gated_delta_tree import l2norm

__all__ = ["LINEAR_KEYS", "linear_layer_shapes", "TreeInputs", "split_qkv", "conv_weight",
           "chunked_recurrence", "linear_prefill", "linear_tree", "linear_commit"]

LINEAR_KEYS = ("linear_attn.in_proj_qkv.weight", "linear_attn.in_proj_z.weight",
               "linear_attn.in_proj_b.weight", "linear_attn.in_proj_a.weight",
               "linear_attn.conv1d.weight", "linear_attn.A_log", "linear_attn.dt_bias",
               "linear_attn.norm.weight", "linear_attn.out_proj.weight")


def linear_layer_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """Checkpoint shapes of a linear layer's mixer (keys after ``layers.{i}.``)."""
    h, hv = cfg.hidden_size, cfg.linear_num_value_heads
    vdim = hv * cfg.linear_value_head_dim
    return {"linear_attn.in_proj_qkv.weight": (cfg.conv_dim, h),
            "linear_attn.in_proj_z.weight": (vdim, h),
            "linear_attn.in_proj_b.weight": (hv, h), "linear_attn.in_proj_a.weight": (hv, h),
            "linear_attn.conv1d.weight": (cfg.conv_dim, 1, cfg.linear_conv_kernel_dim),
            "linear_attn.A_log": (hv,), "linear_attn.dt_bias": (hv,),
            "linear_attn.norm.weight": (cfg.linear_value_head_dim,),
            "linear_attn.out_proj.weight": (h, vdim)}


@dataclass
class TreeInputs:
    """What a linear layer's commit needs of the tree it verified: the conv inputs ``mixed
    [B, N, C]`` and the recurrence's ``k [B, N, H, Dk]`` (before its L2 norm), ``v [B, N, Hv,
    Dv]``, ``g, beta [B, N, Hv]``."""

    mixed: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor


def _project(a, w, cfg):
    """Input projections of normed ``a [B, N, Hd]``: conv inputs [B, N, C], z [B, N, Hv, Dv],
    and the gates g (float32 log-decay) and beta (model dtype), [B, N, Hv]."""
    mixed = F.linear(a, w["linear_attn.in_proj_qkv.weight"])
    z = F.linear(a, w["linear_attn.in_proj_z.weight"]).unflatten(-1, (-1, cfg.linear_value_head_dim))
    beta = F.linear(a, w["linear_attn.in_proj_b.weight"]).sigmoid()
    a_ = F.linear(a, w["linear_attn.in_proj_a.weight"])
    g = -w["linear_attn.A_log"].float().exp() * F.softplus(a_.float() + w["linear_attn.dt_bias"])
    return mixed, z, g, beta


def split_qkv(conv_out, cfg):
    """Post-conv channels -> q, k [B, N, H, Dk] and v [B, N, Hv, Dv]."""
    kd = cfg.linear_num_key_heads * cfg.linear_key_head_dim
    q, k, v = conv_out.split([kd, kd, cfg.linear_num_value_heads * cfg.linear_value_head_dim], dim=-1)
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    return q.unflatten(-1, (-1, dk)), k.unflatten(-1, (-1, dk)), v.unflatten(-1, (-1, dv))


def _output(o, z, w, eps):
    """transformers' ``Qwen3_5RMSNormGated(o) * silu(z)`` (o in the model dtype), then out_proj."""
    dtype = o.dtype
    of = o.float()
    normed = (of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)
    gated = (w["linear_attn.norm.weight"] * normed) * F.silu(z.float())
    return F.linear(gated.to(dtype).flatten(-2), w["linear_attn.out_proj.weight"])


def conv_weight(w):
    """A linear layer's depthwise conv weight ``[C, W]`` (the checkpoint's ``[C, 1, W]``)."""
    return w["linear_attn.conv1d.weight"].squeeze(1)


PREFILL_CHUNK = 64    # prompt tokens a chunk of the prefill's recurrence


def chunked_recurrence(q, k, v, g, beta, state, chunk: int = PREFILL_CHUNK):
    """The gated delta rule over whole sequences, ``chunk`` tokens at a time (the chunked WY form
    of transformers' and fla's chunk kernels, in float32).

    Within a chunk, with ``C`` the running sum of g from the chunk's start state ``S0``:
    ``(I + A) U = beta * (V - exp(C) K S0)``, ``A[i, j] = beta_i exp(C_i - C_j) k_i . k_j`` for
    ``j < i``; ``O = exp(C) Q S0 + (exp(C_i - C_j) q_i . k_j, j <= i) U``; the next chunk starts
    from ``exp(C_L) S0 + sum_j exp(C_L - C_j) k_j u_j^T``. A token with ``g = 0`` and ``beta = 0``
    leaves the state as it is (right padding).

    Parameters
    ----------
    q, k : float32 [B, T, Hv, Dk] (L2-normed, repeated to the v heads, q scaled); v : float32
    [B, T, Hv, Dv]; g, beta : float32 [B, T, Hv]; state : float32 [B, Hv, Dk, Dv] (not modified)

    Returns
    -------
    (o float32 [B, T, Hv, Dv], the state after the T tokens [B, Hv, Dk, Dv])
    """
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))          # [B, Hv, T, D]
    g, beta = g.transpose(1, 2), beta.transpose(1, 2)         # [B, Hv, T]
    t = q.shape[2]
    outs = []
    for lo in range(0, t, chunk):
        hi = min(t, lo + chunk)
        qc, kc, vc, gc, bc = q[:, :, lo:hi], k[:, :, lo:hi], v[:, :, lo:hi], g[:, :, lo:hi], beta[:, :, lo:hi]
        n = hi - lo
        c = gc.cumsum(-1)
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        decay = torch.where(causal, c[..., :, None] - c[..., None, :], float("-inf")).exp()
        strict = decay.masked_fill(torch.eye(n, dtype=torch.bool, device=q.device), 0)
        a = torch.eye(n, device=q.device) + bc[..., None] * strict * (kc @ kc.transpose(-1, -2))
        r = bc[..., None] * (vc - c.exp()[..., None] * (kc @ state))
        u = torch.linalg.solve_triangular(a, r, upper=False, unitriangular=True)
        outs.append(c.exp()[..., None] * (qc @ state) + (decay * (qc @ kc.transpose(-1, -2))) @ u)
        last = (c[..., -1:] - c).exp()[..., None]                 # exp(C_L - C_j)
        state = c[..., -1].exp()[..., None, None] * state + (kc * last).transpose(-1, -2) @ u
    return torch.cat(outs, dim=2).transpose(1, 2), state


def linear_prefill(a, w, cfg, lens, conv_pool, rec_pool, slots, eps):
    """The layer over right-padded prompts ``a [B, T, Hd]`` (normed) from zero states; writes
    each sequence's states after its ``lens[b]`` tokens into the pools at ``slots``. Returns
    ``[B, T, Hd]`` (rows past a prompt's length are not meaningful)."""
    b, t, _ = a.shape
    mixed, z, g, beta = _project(a, w, cfg)
    weight = conv_weight(w)
    width = weight.shape[1]
    dev = a.device
    # The conv over the prompt (any length), float32 as the tree op; its state: the last W - 1
    # inputs before each prompt's end (zeros before the prompt's start).
    padded = F.pad(mixed.transpose(1, 2).float(), (width - 1, 0))          # [B, C, W-1+T]
    conv = F.silu(F.conv1d(padded, weight.float()[:, None, :], groups=weight.shape[0]))
    keep = lens.long()[:, None] + torch.arange(width - 1, device=dev)
    tail = padded.gather(2, keep[:, None, :].expand(-1, padded.shape[1], -1))
    conv_pool.index_copy_(0, slots.long(), tail.to(conv_pool.dtype))
    q, k, v = split_qkv(conv.transpose(1, 2).to(mixed.dtype), cfg)
    rep = cfg.linear_num_value_heads // cfg.linear_num_key_heads
    qf = l2norm(q.repeat_interleave(rep, dim=2).float()) / cfg.linear_key_head_dim ** 0.5
    kf = l2norm(k.repeat_interleave(rep, dim=2).float())
    valid = (torch.arange(t, device=dev)[None, :] < lens[:, None])[..., None]   # padding: no step
    gf = torch.where(valid, g.float(), 0)
    bf = torch.where(valid, beta.float(), 0)
    out, state = chunked_recurrence(qf, kf, v.float(), gf, bf,
                                    rec_pool.new_zeros(b, *rec_pool.shape[1:]))
    rec_pool.index_copy_(0, slots.long(), state)
    return _output(out.to(v.dtype), z, w, eps)


def linear_tree(a, w, cfg, parents, num_nodes, conv_pool, rec_pool, slots, eps):
    """The layer over the nodes of a tree ``a [B, N, Hd]`` (normed), each decoded along its
    ancestor path from the committed states (read only). Returns ``(out [B, N, Hd],
    TreeInputs)``."""
    mixed, z, g, beta = _project(a, w, cfg)
    conv = causal_conv1d_tree(mixed, parents, conv_pool, conv_weight(w), state_slots=slots,
                              num_nodes=num_nodes)
    q, k, v = split_qkv(conv, cfg)
    o = gated_delta_tree(q, k, v, g, beta, parents, rec_pool, state_slots=slots, num_nodes=num_nodes)
    return _output(o, z, w, eps), TreeInputs(mixed, k, v, g, beta)


def linear_commit(kept: TreeInputs, path, accept_len, conv_pool, rec_pool, slots) -> None:
    """Advance the layer's states at ``slots`` along ``path[b, :accept_len[b] + 1]`` of the tree
    whose inputs are ``kept`` (in place; no host sync)."""
    causal_conv1d_commit(kept.mixed, path, accept_len, conv_pool, state_slots=slots)
    gated_delta_commit(kept.k, kept.v, kept.g, kept.beta, path, accept_len, rec_pool,
                       state_slots=slots)
