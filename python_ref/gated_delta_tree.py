"""Reference Gated DeltaNet tree verification: every tree node's output as if decoded one token
at a time along its own ancestor path from the committed prefix's recurrent state.

One decoding step of the gated delta rule (transformers' ``torch_recurrent_gated_delta_rule``,
in its order of operations), for one v-head with state ``S [Dk, Dv]``::

    S = S * exp(g)
    u = (v - (S * k[:, None]).sum(0)) * beta
    S = S + k[:, None] * u[None, :]
    o = (S * q[:, None]).sum(0)

with ``q = l2norm(q) * scale`` and ``k = l2norm(k)`` (``x * rsqrt(sum(x * x) + 1e-6)``) when
``use_qk_l2norm``. :func:`gated_delta_tree` is the definition (a walk along each node's path);
:func:`gated_delta_tree_chunked` is the same function in the chunked (WY) form with the
ancestor mask in place of the causal mask: batched matmuls and one triangular solve, no host
reads (what the reference backend runs, also inside a CUDA graph).
"""

import torch

from ._common import compute_dtype
from .pack_mask import ancestors

__all__ = ["l2norm", "gated_delta_step", "gated_delta_tree", "gated_delta_tree_chunked",
           "ancestor_mask"]

L2NORM_EPS = 1e-6  # transformers' l2norm (the fla library's fallback)


def l2norm(x, eps=L2NORM_EPS):
    """``x * rsqrt(sum(x * x, -1) + eps)`` over the last dim (transformers' / fla's form)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gated_delta_step(S, q, k, v, g, beta, exp=torch.exp):
    """One recurrent step for every v-head at once: ``S [..., Hv, Dk, Dv]``, ``q, k [..., Hv,
    Dk]`` (already normalised and, for q, scaled), ``v [..., Hv, Dv]``, ``g, beta [..., Hv]``.
    Returns ``(S_new, o [..., Hv, Dv])`` (transformers' order of operations). ``exp``: how the
    decay's exponential is taken (the exact mode pads its lanes)."""
    S = S * exp(g)[..., None, None]
    kv_mem = (S * k[..., :, None]).sum(dim=-2)
    delta = (v - kv_mem) * beta[..., None]
    S = S + k[..., :, None] * delta[..., None, :]
    return S, (S * q[..., :, None]).sum(dim=-2)


def _prepare(q, k, v, g, beta, scale, use_qk_l2norm, cd):
    """q, k repeated to the v-heads ([B, N, Hv, Dk]), normalised, q scaled; all in ``cd``."""
    H, Hv = k.shape[2], v.shape[2]
    q, k = (x.repeat_interleave(Hv // H, dim=2).to(cd) for x in (q, k))
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    # transformers divides by sqrt(Dk); an explicit scale multiplies
    q = q / q.shape[-1] ** 0.5 if scale is None else q * scale
    return q, k, v.to(cd), g.to(cd), beta.to(cd)


def gated_delta_tree(q, k, v, g, beta, parents, state, state_slots=None, num_nodes=None,
                     scale=None, use_qk_l2norm=True):
    """Each node's gated-delta-rule output, decoded along its ancestor path.

    Parameters
    ----------
    q, k : ``[B, N, H, Dk]``; v : ``[B, N, Hv, Dv]`` (Hv a multiple of H: q/k head ``h`` serves
        v-heads ``h * Hv / H ..``)
    g : ``[B, N, Hv]`` log-decay (<= 0 in the models); beta : ``[B, N, Hv]``
    parents : int ``[B, N]`` (``-1``: child of the committed prefix; a parent precedes its child)
    state : ``[S, Hv, Dk, Dv]`` pool, the recurrent state after the committed prefix (read only)
    state_slots : int ``[B]`` or None (slot ``b``); num_nodes : int ``[B]`` or None (all N)
    scale : float or None (``q / sqrt(Dk)``, as transformers); use_qk_l2norm : L2-normalise q and k first

    Returns
    -------
    o : ``[B, N, Hv, Dv]`` in the compute dtype; rows ``>= num_nodes[b]`` are 0. Node ``i``'s row
    is the output of the last of :func:`gated_delta_step` applied from ``state[slot]`` to the
    nodes ``root, ..., parent(i), i`` of its path.
    """
    cd = compute_dtype(q, k, v, g, beta, state)
    B, N = parents.shape
    q, k, v, g, beta = _prepare(q, k, v, g, beta, scale, use_qk_l2norm, cd)
    o = torch.zeros(B, N, v.shape[2], v.shape[3], dtype=cd, device=v.device)
    slots = list(range(B)) if state_slots is None else [int(s) for s in state_slots.tolist()]
    counts = [N] * B if num_nodes is None else [int(n) for n in num_nodes.tolist()]
    for b in range(B):
        for i in range(counts[b]):
            S = state[slots[b]].to(cd)
            for j in reversed(ancestors(parents[b], i)):
                S, out = gated_delta_step(S, q[b, j], k[b, j], v[b, j], g[b, j], beta[b, j])
            o[b, i] = out
    return o


def ancestor_mask(parents, num_nodes=None):
    """bool ``[B, N, N]``: ``[b, i, j]`` iff node j is node i or one of its ancestors, for valid
    nodes ``i, j < num_nodes[b]`` (False elsewhere, also on a padding node's diagonal). No host
    reads: the parent links are followed by pointer doubling (log2 N boolean matmuls)."""
    B, N = parents.shape
    dev = parents.device
    idx = torch.arange(N, device=dev)
    valid = torch.ones(B, N, dtype=torch.bool, device=dev) if num_nodes is None else (
        idx[None, :] < num_nodes[:, None])
    p = parents.to(torch.long)
    link = (p[:, :, None] == idx[None, None, :]) & valid[:, :, None] & valid[:, None, :]
    reach = link | torch.diag_embed(valid)
    steps = 1
    while steps < N:
        r = reach.to(torch.float32)
        reach = reach | (torch.bmm(r, r) > 0)
        steps *= 2
    return reach


def gated_delta_tree_chunked(q, k, v, g, beta, parents, state, state_slots=None, num_nodes=None,
                             scale=None, use_qk_l2norm=True):
    """:func:`gated_delta_tree` in the chunked (WY) form, the whole tree one chunk. With
    ``C_i = sum of g over i's path`` and ``M`` the ancestor(-or-self) mask, ``D[i, j] =
    exp(C_i - C_j)`` on ``M``, 0 off it:

        (I + A) U = beta * (V - exp(C) * (K S0)),   A[i, j] = beta_i D[i, j] (k_i . k_j), j != i
        O = exp(C) * (Q S0) + (D * Q K^T) U

    (``u_i`` is the delta written at node i; node i's state is ``exp(C_i) S0 + sum over its path
    of D[i, j] k_j u_j^T``). Same arguments and result; padding nodes' inputs never reach a
    valid row (selected away, not multiplied by 0, so NaN there stays out)."""
    cd = compute_dtype(q, k, v, g, beta, state)
    B, N = parents.shape
    q, k, v, g, beta = _prepare(q, k, v, g, beta, scale, use_qk_l2norm, cd)
    mask = ancestor_mask(parents, num_nodes)[:, None]                  # [B, 1, N, N]
    valid = mask.diagonal(dim1=-2, dim2=-1)                            # [B, 1, N]
    q, k, v = (torch.where(valid[..., None], x.transpose(1, 2), 0) for x in (q, k, v))
    g, beta = (torch.where(valid, x.transpose(1, 2), 0) for x in (g, beta))   # [B, Hv, N]
    S0 = state.to(cd) if state_slots is None else state.index_select(0, state_slots.long()).to(cd)
    C = (mask.to(cd) @ g[..., None])[..., 0]                           # path sums of g
    D = torch.where(mask, (C[..., :, None] - C[..., None, :]).exp(), 0)
    eye = torch.eye(N, dtype=torch.bool, device=q.device)
    A = torch.where(eye, 1, beta[..., None] * D * (k @ k.transpose(-1, -2)))
    R = beta[..., None] * (v - C.exp()[..., None] * (k @ S0))
    U = torch.linalg.solve_triangular(A, R, upper=False, unitriangular=True)
    o = C.exp()[..., None] * (q @ S0) + (D * (q @ k.transpose(-1, -2))) @ U
    return torch.where(valid[..., None], o, 0).transpose(1, 2).contiguous()
