"""Reference tree attention over a KV cache (contiguous or paged)."""

import math

import torch

from ._common import compute_dtype
from .pack_mask import unpack_mask

__all__ = ["tree_attention", "tree_attention_logical", "gather_cache", "visibility", "visible_slots"]


def gather_cache(cache, b, length, block_table=None):
    """Keys (or values) of logical positions ``0..length-1`` of sequence ``b``.

    Parameters
    ----------
    cache : ``[B, L_max, H, D]`` (contiguous) or ``[num_pages, page_size, H, D]`` (paged)
    b : int; length : int
    block_table : int ``[B, max_pages]`` or None (contiguous)

    Returns
    -------
    ``[length, H, D]`` in the cache dtype.
    """
    if block_table is None:
        return cache[b, :length]
    page_size = cache.shape[1]
    pos = torch.arange(length, device=cache.device)
    pages = block_table[b].to(torch.long)[pos // page_size]
    return cache[pages, pos % page_size]


def visibility(prefix_len, N, tree_mask_b=None, tail="causal"):
    """Boolean ``[N, prefix_len + N]``: may query i see key position p?

    Keys ``p < prefix_len`` are always visible. Tail key ``prefix_len + j`` is visible iff
    bit (i, j) of ``tree_mask_b`` (int32 ``[N, W]``) is set; without a mask, iff ``j <= i``
    (``tail="causal"``) or always (``tail="full"``).
    """
    vis = torch.zeros(N, prefix_len + N, dtype=torch.bool)
    vis[:, :prefix_len] = True
    if tree_mask_b is not None:
        vis[:, prefix_len:] = unpack_mask(tree_mask_b.detach().cpu()[None], N)[0]
    elif tail == "causal":
        vis[:, prefix_len:] = torch.ones(N, N, dtype=torch.bool).tril()
    elif tail == "full":
        vis[:, prefix_len:] = True
    else:
        raise ValueError(f"tail must be 'causal' or 'full', got {tail!r}")
    return vis


def tree_attention(q, k_cache, v_cache, prefix_lens, tree_mask=None, tail="causal",
                   block_table=None, scale=None):
    """Attention of N tail queries over the prefix and the (tree-masked) tail.

    Parameters
    ----------
    q : ``[B, N, Hq, Dh]``
    k_cache, v_cache : ``[B, L_max, Hkv, Dh]`` or paged ``[num_pages, page_size, Hkv, Dh]``;
        the tail's K/V must already sit at positions ``prefix_lens[b] .. prefix_lens[b] + N - 1``
    prefix_lens : int ``[B]`` (0 allowed)
    tree_mask : int32 ``[B, N, ceil(N/32)]`` or None (then ``tail`` decides)
    tail : ``"causal"`` or ``"full"`` (ignored when ``tree_mask`` is given)
    block_table : int32 ``[B, max_pages]`` for paged caches, else None
    scale : float, default ``1 / sqrt(Dh)``

    Returns
    -------
    out : ``[B, N, Hq, Dh]`` and lse : ``[B, Hq, N]`` (natural log), both in the compute dtype
    (float64 if q or the caches are float64, else float32). GQA: query head h reads kv head
    ``h // (Hq // Hkv)``. A query with no visible key gets out = 0, lse = -inf.

    Non-finite inputs (DESIGN.md, ``tree_attention``): a -inf score weighs 0 (its V row still
    enters the product: 0 * NaN is NaN); a row whose visible scores are all -inf is a row with
    no visible key; a NaN or +inf among a row's visible scores makes its out and lse all NaN.
    """
    B, N, Hq, Dh = q.shape
    Hkv = k_cache.shape[2]
    group = Hq // Hkv
    cd = compute_dtype(q, k_cache, v_cache)
    scale = 1.0 / math.sqrt(Dh) if scale is None else float(scale)
    kv_head = torch.arange(Hq, device=q.device) // group

    out = torch.zeros(B, N, Hq, Dh, dtype=cd, device=q.device)
    lse = torch.full((B, Hq, N), -math.inf, dtype=cd, device=q.device)
    for b in range(B):
        P = int(prefix_lens[b])
        L = P + N
        keys = gather_cache(k_cache, b, L, block_table).to(cd)[:, kv_head]    # [L, Hq, Dh]
        vals = gather_cache(v_cache, b, L, block_table).to(cd)[:, kv_head]
        vis = visibility(P, N, None if tree_mask is None else tree_mask[b], tail).to(q.device)
        s = torch.einsum("nhd,lhd->hnl", q[b].to(cd), keys) * scale             # [Hq, N, L]
        s = s.masked_fill(~vis, -math.inf)
        row_lse = torch.logsumexp(s, dim=-1)                                    # [Hq, N]
        no_key = row_lse == -math.inf          # no visible key, or every visible score is -inf
        poisoned = (s.isnan() | (s == math.inf)).any(dim=-1)                    # IEEE: NaN
        p = torch.exp(s - row_lse.masked_fill(no_key | poisoned, 0.0)[..., None])
        o = torch.einsum("hnl,lhd->nhd", p, vals)
        o = o.masked_fill(no_key.T[..., None], 0.0)        # 0 whatever the V rows hold
        out[b] = o.masked_fill(poisoned.T[..., None], math.nan)
        lse[b] = row_lse.masked_fill(poisoned, math.nan)
    return out, lse


def visible_slots(prefix_len, N, tree_mask_b=None, tail="causal"):
    """The key positions each of the N tail queries sees, in logical order.

    Returns a list of N int64 tensors: query i's visible positions ascending, that is the prefix
    ``0..prefix_len-1`` and then its visible tail slots by index. For a tree (parents precede
    children) that is the prefix, then the node's ancestors by depth, then the node itself: the
    order in which autoregressive decoding would have written the same keys.
    """
    vis = visibility(prefix_len, N, tree_mask_b, tail)
    return [row.nonzero()[:, 0] for row in vis]


def tree_attention_logical(q, k_cache, v_cache, prefix_lens, tree_mask=None, tail="causal",
                           block_table=None, scale=None):
    """Tree attention computed row by row in logical key order (the exact mode's attention).

    Same inputs and result as :func:`tree_attention`, computed so that a row's bits depend only on
    its query and the keys and values it sees, in logical order: for each query its visible
    keys are gathered into a contiguous cache of exactly that many positions, and that one-row
    call is :func:`tree_attention` with ``N = 1`` and ``prefix = L - 1``, the form of a one-token
    decode step. A tree node's row therefore equals the decode step's row at the same logical
    position once its ancestors are committed, whatever N, B, the page size or the other rows.

    Returns
    -------
    out : ``[B, N, Hq, Dh]`` and lse : ``[B, Hq, N]`` in the compute dtype, as :func:`tree_attention`.
    """
    B, N, Hq, Dh = q.shape
    cd = compute_dtype(q, k_cache, v_cache)
    out = torch.zeros(B, N, Hq, Dh, dtype=cd, device=q.device)
    lse = torch.full((B, Hq, N), -math.inf, dtype=cd, device=q.device)
    one = torch.zeros(1, dtype=torch.int64, device=q.device)
    for b, i, kc, vc in logical_rows(k_cache, v_cache, prefix_lens, N, tree_mask, tail,
                                     block_table):
        o, l = tree_attention(q[b:b + 1, i:i + 1].clone(), kc, vc, one + (kc.shape[1] - 1),
                              None, "causal", None, scale)
        out[b, i] = o[0, 0]
        lse[b, :, i] = l[0, :, 0]
    return out, lse


def logical_rows(k_cache, v_cache, prefix_lens, N, tree_mask=None, tail="causal",
                 block_table=None):
    """Each tree row's visible keys in logical order, as the decode step at its position sees
    them: yields ``(b, i, k, v)``, k and v fresh contiguous ``[1, length, Hkv, Dh]`` copies
    (length = prefix_lens[b] + the row's depth + 1 for a tree; caches as :func:`tree_attention`)."""
    Hkv, Dh = k_cache.shape[2], k_cache.shape[3]
    for b in range(prefix_lens.shape[0]):
        P = int(prefix_lens[b])
        keys = gather_cache(k_cache, b, P + N, block_table)
        vals = gather_cache(v_cache, b, P + N, block_table)
        rows = visible_slots(P, N, None if tree_mask is None else tree_mask[b], tail)
        for i, slots in enumerate(rows):
            slots = slots.to(keys.device)
            length = slots.numel()
            yield (b, i, keys[slots].reshape(1, length, Hkv, Dh).contiguous(),
                   vals[slots].reshape(1, length, Hkv, Dh).contiguous())
