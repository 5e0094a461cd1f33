"""Reference top-k / top-p filtering of sampled target tokens: which tokens a row keeps."""

import torch

__all__ = ["MASS_BITS", "MAX_TOP_P_VOCAB", "token_masses", "filter_keep"]

# Probability mass in fixed point: sums of integers are exact in any order, so every backend
# finds the same top-p boundary.
MASS_BITS = 32
# Row masses stay below V * 2**32 <= 2**53, so they (and their partial sums) are exact in float64.
MAX_TOP_P_VOCAB = 2 ** 21


def token_masses(x):
    """Fixed-point unnormalised probabilities of rows of scaled logits.

    Parameters
    ----------
    x : float ``[..., V]`` (logits / temperature)

    Returns
    -------
    int64 ``[..., V]``: ``q = floor(e * 2**32)`` with ``e = exp(x - max(x))`` in x's dtype, and
    ``e = 1`` exactly where ``x`` equals the row maximum (so -inf or +inf maxima give 0/1 masses
    rather than NaN). ``e * 2**32`` is an exact scaling, so only ``exp`` rounds.
    """
    m = x.max(dim=-1, keepdim=True).values
    e = torch.where(x == m, torch.ones_like(x), torch.exp(x - m))
    return torch.floor(e * 2.0 ** MASS_BITS).to(torch.int64)


def filter_keep(x, top_k=None, top_p=None):
    """Which tokens each row keeps under top-k, then top-p (transformers' order).

    Parameters
    ----------
    x : float ``[B, ..., V]``, logits already divided by the temperature
    top_k : int ``[B]`` or None; per sequence, ``0 < k < V`` keeps the k first tokens, anything
        else (0 = off, k >= V) keeps all
    top_p : float ``[B]`` or None; per sequence, rounded to float32; ``>= 1`` is off

    Returns
    -------
    bool ``[B, ..., V]``

    Rank order: x descending, ties to the lower token id (-0.0 equals +0.0). Masses: see
    :func:`token_masses`. top-k keeps ranks ``r < k``; top-p then keeps a token iff the mass of
    the top-k tokens ranked before it is below ``P = float64(top_p) * float64(Z_k)``, ``Z_k``
    the mass of the top-k set (the product rounds once, in float64): the smallest prefix of the
    renormalised top-k distribution whose probability reaches top_p. Rank 0 is always kept.
    """
    shape = x.shape
    B, V = shape[0], shape[-1]
    rows = x.reshape(B, -1, V)
    keep = torch.ones(rows.shape, dtype=torch.bool, device=x.device)
    if top_k is None and top_p is None:
        return keep.view(shape)
    order = torch.sort(rows, dim=-1, descending=True, stable=True).indices  # ties: lower id first
    q = token_masses(rows).gather(-1, order)                                   # in rank order
    rank = torch.arange(V, device=x.device)
    k = torch.full((B,), V, dtype=torch.int64, device=x.device)
    if top_k is not None:
        k_in = top_k.to(device=x.device, dtype=torch.int64)
        k = torch.where((k_in > 0) & (k_in < V), k_in, k)
    in_k = rank < k[:, None, None]
    keep_sorted = in_k.expand(order.shape)
    if top_p is not None:
        p = top_p.to(device=x.device, dtype=torch.float32)
        z_k = torch.where(in_k, q, 0).sum(-1)                                  # [B, rows]
        budget = p.to(torch.float64)[:, None] * z_k.to(torch.float64)
        before = torch.cumsum(q, dim=-1) - q                                   # exclusive, exact
        in_p = (before.to(torch.float64) < budget[..., None]) | (rank == 0) | (p >= 1)[:, None, None]
        keep_sorted = keep_sorted & in_p
    keep.scatter_(-1, order, keep_sorted)
    return keep.view(shape)
