"""Reference target sampling (greedy / seeded Gumbel-max) and the tree acceptance walk."""

import math

import torch

from ._common import compute_dtype
from .sampling import filter_keep

__all__ = ["mix32", "gumbel_uniform", "sample_tokens", "verify_tree"]

_M32 = 0xFFFFFFFF


def _mul32(x, c):
    """``(x * c) mod 2**32`` for int64 tensors holding uint32 values, without int64 overflow."""
    lo = x & 0xFFFF
    hi = x >> 16
    return (lo * c + (((hi * c) & 0xFFFF) << 16)) & _M32


def mix32(x):
    """The uint32 mixer of CONTRIBUTING.md on an int64 tensor of values in ``[0, 2**32)``.

    ``x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16`` (mod 2**32).
    """
    x = x & _M32
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    x = x ^ (x >> 16)
    return x


def gumbel_uniform(seed, offset, N, V):
    """The uniforms ``u [B, N, V]`` (float32, in (0, 1)) that drive Gumbel-max sampling.

    ``h = mix32(seed[b]); h = mix32(h ^ offset[b]); h = mix32(h ^ b); h = mix32(h ^ i);
    h = mix32(h ^ v)`` (seed/offset masked to their low 32 bits), then
    ``u = float32((h >> 8) + 0.5) / 2**24``: one float32 rounding of the exact value.

    One deliberate clamp: for ``h >> 8 == 2**24 - 1`` the exact value ``1 - 2**-25`` rounds
    (to even) to 1.0 in float32, which would give an infinite Gumbel; it is clamped to the
    largest float32 below 1 (``1 - 2**-24``), so ``u`` really lies in (0, 1).
    """
    dev = seed.device
    B = seed.shape[0]
    s = seed.to(torch.int64) & _M32
    o = offset.to(torch.int64) & _M32
    h = mix32(s)
    h = mix32(h ^ o)
    h = mix32(h ^ torch.arange(B, device=dev, dtype=torch.int64))             # [B]
    h = mix32(h[:, None] ^ torch.arange(N, device=dev, dtype=torch.int64))    # [B, N]
    h = mix32(h[:, :, None] ^ torch.arange(V, device=dev, dtype=torch.int64))  # [B, N, V]
    u = (((h >> 8).to(torch.float64) + 0.5) / 2.0 ** 24).to(torch.float32)
    return torch.clamp(u, max=1.0 - 2.0 ** -24)


def sample_tokens(logits, temperature, seed=None, offset=None, top_k=None, top_p=None):
    """One target token per node.

    Parameters
    ----------
    logits : float ``[B, N, V]``
    temperature : float >= 0, or float ``[B]`` / ``[]`` tensor (one value per sequence)
    seed, offset : int64 ``[B]`` (required when temperature is a tensor or > 0)
    top_k : int ``[B]`` or None; top_p : float ``[B]`` or None (see :func:`filter_keep`)

    Returns
    -------
    int32 ``[B, N]``: for a sequence with temperature 0, ``argmax_v logits`` (filters do not
    apply); else ``argmax_v(logits / T + g)`` over the tokens :func:`filter_keep` keeps, with
    ``g = -log(-log(u))`` from :func:`gumbel_uniform` (computed in the compute dtype: float64 for
    float64 logits, else float32). Ties to lower v.
    """
    cd = compute_dtype(logits)
    x = logits.to(cd)
    greedy = torch.argmax(x, dim=-1).to(torch.int32)  # first maximal index: ties -> lower v
    B, N, V = logits.shape
    if torch.is_tensor(temperature):
        T = temperature.to(device=x.device, dtype=cd).reshape(-1).expand(B)
        sampled = T > 0
        scaled = x / torch.where(sampled, T, torch.ones_like(T))[:, None, None]
    else:
        T = float(temperature)
        if T == 0.0:
            return greedy
        sampled = torch.ones(B, dtype=torch.bool, device=x.device)
        scaled = x / T
    if seed is None or offset is None:
        raise ValueError("sampling (a temperature tensor, or temperature > 0) needs seed and offset")
    u = gumbel_uniform(seed, offset, N, V).to(device=x.device, dtype=cd)
    g = -torch.log(-torch.log(u))
    keep = filter_keep(scaled, top_k, top_p)
    score = torch.where(keep, scaled + g, torch.full_like(scaled, -math.inf))
    sample = torch.argmax(score, dim=-1).to(torch.int32)
    return torch.where(sampled[:, None], sample, greedy)


def verify_tree(tokens, parents, num_nodes, max_depth, target_logits=None, target_tokens=None,
                temperature=0.0, seed=None, offset=None, top_k=None, top_p=None):
    """Accept the longest tree path that matches the target's tokens.

    Parameters
    ----------
    tokens, parents : int ``[B, N]``; num_nodes : int ``[B]``
    max_depth : int (static); outputs have ``max_depth + 1`` columns
    target_logits : float ``[B, N, V]`` or None; target_tokens : int ``[B, N]`` or None
        (exactly one is used; ``target_tokens`` wins when both are given)
    temperature, seed, offset, top_k, top_p : see :func:`sample_tokens`

    Returns
    -------
    dict of int32 tensors
        accept_len ``[B]`` (accepted draft tokens, root excluded),
        path ``[B, max_depth + 1]`` (accepted node indices, root first, -1 padded),
        bonus ``[B]`` (the target token at the last accepted node),
        emitted ``[B, max_depth + 1]`` (accepted draft tokens then bonus, -1 padded).

    A node ``c < num_nodes`` (not the root) *agrees* when ``tokens[c]`` is the target's token
    at its parent, ``target[b, parents[c]]``; an accepted path is a chain of agreeing nodes from
    the root, at most ``max_depth`` of them. Where siblings share a token, more than one chain
    may agree:

    * greedy rows (temperature 0 for the sequence, and rows verified from ``target_tokens``
      with temperature 0): the longest chain; among the longest, the one ending at the lowest
      node index. Same-token siblings share their whole context, so the target's greedy
      continuation is every one of their subtrees: any agreeing chain is lossless.
    * sampled rows: at node ``cur`` the accepted child is the lowest-index agreeing child of
      ``cur`` (the first such sibling); stop when there is none. Each node's sample is keyed by
      its node index (:func:`gumbel_uniform`), so choosing among same-token siblings by what
      their own samples say next would bias the accepted tokens.

    Without shared tokens both rules give the same path. The root is always verified: with
    ``num_nodes[b] == 0`` the row is a one-node tree (accept_len 0, bonus = ``target[b, 0]``).
    """
    if target_tokens is None:
        if target_logits is None:
            raise ValueError("give target_logits or target_tokens")
        target_tokens = sample_tokens(target_logits, temperature, seed, offset, top_k, top_p)
    B, N = tokens.shape
    dev = tokens.device
    tok = tokens.detach().cpu().tolist()
    par = parents.detach().cpu().tolist()
    nn_ = num_nodes.detach().cpu().tolist()
    tgt = target_tokens.detach().cpu().tolist()

    if torch.is_tensor(temperature):
        sampled = (temperature.detach().cpu().reshape(-1).expand(B) > 0).tolist()
    else:
        sampled = [float(temperature) > 0] * B

    C = max_depth + 1
    accept_len = torch.zeros(B, dtype=torch.int32)
    path = torch.full((B, C), -1, dtype=torch.int32)
    bonus = torch.zeros(B, dtype=torch.int32)
    emitted = torch.full((B, C), -1, dtype=torch.int32)
    for b in range(B):
        if sampled[b]:
            nodes = _first_sibling_walk(tok[b], par[b], nn_[b], tgt[b], C)
        else:
            nodes = _longest_agreeing_chain(tok[b], par[b], nn_[b], tgt[b], C)
        cur = nodes[-1]
        a = len(nodes) - 1
        accept_len[b] = a
        path[b, :a + 1] = torch.tensor(nodes, dtype=torch.int32)
        bonus[b] = tgt[b][cur]
        for i in range(a):
            emitted[b, i] = tok[b][nodes[i + 1]]
        emitted[b, a] = tgt[b][cur]
    return dict(accept_len=accept_len.to(dev), path=path.to(dev), bonus=bonus.to(dev),
                emitted=emitted.to(dev))


def _first_sibling_walk(tok, par, num_nodes, tgt, cols):
    """Nodes of the sampled rows' path: from the root, the lowest-index agreeing child."""
    cur, nodes = 0, [0]
    while len(nodes) < cols:
        nxt = next((c for c in range(num_nodes) if par[c] == cur and tok[c] == tgt[cur]), None)
        if nxt is None:
            break
        nodes.append(nxt)
        cur = nxt
    return nodes


def _longest_agreeing_chain(tok, par, num_nodes, tgt, cols):
    """Nodes of the greedy rows' path: the longest chain of agreeing nodes (at most ``cols``
    nodes with the root), ending at the lowest node index among the longest."""
    level = {0: 0}                                        # node -> its depth on an agreeing chain
    for c in range(1, num_nodes):                         # parents precede children
        p = par[c]
        if 0 <= p < c and p in level and level[p] < cols - 1 and tok[c] == tgt[p]:
            level[c] = level[p] + 1
    deepest = max(level.values())
    end = min(c for c, d in level.items() if d == deepest)
    nodes = [end]
    while nodes[-1] != 0:
        nodes.append(par[nodes[-1]])
    return nodes[::-1]
