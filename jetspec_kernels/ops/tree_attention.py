"""tree_attention: prefix + tree-masked (or causal / full tail) attention over a KV cache."""
from __future__ import annotations

import math

import torch

from .. import backend as _backend
from .. import checks
from ..device_guard import cuda_device_guard
from ..python_ref.tree_attention import tree_attention_logical
from ..tree import mask_words
from .exact import exact_backend

TAILS = ("causal", "full")


_STATIC: dict = {}  # signature -> cache capacity per sequence (checks.signature)


def check_tree_attention(q, k_cache, v_cache, prefix_lens, tree_mask, tail, block_table, scale, out,
                         lse=None, return_lse=False):
    """Raise for a call :func:`tree_attention` cannot take; return its ``checks.signature``."""
    key = checks.signature(q, k_cache, v_cache, prefix_lens, tree_mask, tail, block_table, scale,
                           out, lse, return_lse)
    cap = None if key is None else _STATIC.get(key)  # (None: compiling; no read to guard on)
    if cap is None:  # dtypes, shapes, devices, layouts: once per signature
        checks.tensor("q", q, dtypes=checks.FLOAT_DTYPES, ndim=4)
        b, n, hq, dh = q.shape
        if dh < 1:
            raise ValueError(f"q head dim (dim 3) must be >= 1, got shape {list(q.shape)}")
        dev = q.device
        cap, _ = checks.cache_and_table(k_cache, v_cache, block_table, batch=b, hkv=None,
                                        head_dim=dh, dtypes=(q.dtype,), device=dev)
        hkv = k_cache.shape[2]
        if hkv == 0 or hq % hkv != 0:
            raise ValueError(f"k_cache must be [B, L, Hkv, Dh] (paged: [P, page_size, Hkv, Dh]) with "
                             f"Hkv dividing q's {hq} heads (GQA), got shape {list(k_cache.shape)} "
                             f"(Hkv = {hkv}); a heads-major [B, Hkv, L, Dh] cache is passed as its "
                             f".transpose(1, 2) view")
        checks.tensor("prefix_lens", prefix_lens, dtypes=checks.LENGTH_DTYPES, shape=[b], device=dev)
        checks.optional("tree_mask", tree_mask, dtypes=checks.INDEX_DTYPES,
                        shape=[b, n, mask_words(n)], device=dev)
        checks.choice("tail", tail, TAILS)
        if tree_mask is not None and tail != "causal":
            raise ValueError(f"tail must be 'causal' (the default) when tree_mask is given: the "
                             f"mask alone decides which tail keys a row sees, got {tail!r}")
        if scale is not None:
            checks.number("scale", scale, positive=True)
        checks.optional("out", out, dtypes=(q.dtype,), shape=list(q.shape), device=dev)
        checks.optional("lse", lse, dtypes=(torch.float32,), shape=[b, hq, n], device=dev)
        checks.flag("return_lse", return_lse)
        checks.remember(_STATIC, key, cap)
    checks.table_values(block_table, k_cache)
    checks.fits_in_cache(prefix_lens, q.shape[1], cap)
    if tree_mask is not None and tree_mask.numel() and checks.values_checked(tree_mask):
        # Every row i has its own bit (i, i): a node sees itself.
        i = torch.arange(tree_mask.shape[1], device=tree_mask.device)
        missing = ((tree_mask[:, i, i // 32] >> (i % 32)) & 1) == 0          # [B, N]
        if bool(missing.any()):
            b, row = (int(x) for x in missing.nonzero()[0])
            raise ValueError(f"tree_mask row {row} of sequence {b} must have its own bit set (bit "
                             f"{row % 32} of word {row // 32}: a node sees itself), got "
                             f"{missing.sum().item()} rows without it")
    return key


def tree_attention(q, k_cache, v_cache, prefix_lens, tree_mask=None, *, tail: str = "causal",
                   block_table=None, scale: float | None = None, return_lse: bool = False,
                   out=None, lse=None, backend: str | None = None, exact: bool = False):
    """Attention of N tree (or draft-block) queries over a cached prefix plus the N tail keys.

    Query i of sequence b sees every key at positions ``< prefix_lens[b]`` and the tail key at
    ``prefix_lens[b] + j`` iff bit (i, j) of ``tree_mask[b]`` is set; without a mask, ``tail``
    says which tail keys are visible: ``"causal"`` (j <= i) or ``"full"`` (all N).

    Parameters
    ----------
    q : float16/bfloat16/float32 [B, N, Hq, Dh]
    k_cache, v_cache : q.dtype, contiguous [B, L, Hkv, Dh] or paged [P, page_size, Hkv, Dh]
        The tail's K/V must already be in positions prefix_lens .. prefix_lens + N - 1.
    prefix_lens : int32/int64 [B]
    tree_mask : int32 [B, N, ceil(N/32)], optional
        Packed ancestor-or-self bits (``Tree.mask``); every row has its own bit.
    tail : "causal" | "full"; with a tree_mask it must stay "causal" (the mask decides).
    block_table : int32 [B, max_pages], optional; present iff the cache is paged.
    scale : float, optional; default 1/sqrt(Dh).
    return_lse : bool; also return float32 [B, Hq, N] natural-log log-sum-exp.
    out : [B, N, Hq, Dh] q.dtype, optional; written in place and returned.
    lse : float32 [B, Hq, N], optional; written in place (implies return_lse).
    exact : bool; compute every row as the one-token decode step at its logical position would
        (its visible keys reduced in logical order), so a tree node's row is the same bits as the
        autoregressive step's once its ancestors are committed: the reference
        (``python_ref.tree_attention.tree_attention_logical``, CPU) or triton
        (``triton.exact_attention``, no per-row launches); ``ops.exact.exact_backend`` says where each
        runs, and raises ``ExactModeError`` elsewhere.

    Returns
    -------
    out, or (out, lse) when return_lse.
    """
    key = check_tree_attention(q, k_cache, v_cache, prefix_lens, tree_mask, tail, block_table,
                               scale, out, lse, return_lse)
    if exact is not False:          # no call on the normal path (the host-call budget)
        checks.flag("exact", exact)
        return _exact(q, k_cache, v_cache, prefix_lens, tree_mask, tail, block_table, scale,
                      return_lse, out, lse, backend, key)
    if prefix_lens.dtype != torch.int32:  # int64 (checks.LENGTH_DTYPES): the backends take int32
        prefix_lens = prefix_lens.to(torch.int32)
    impl = _backend.select(q.device, "tree_attention", backend,
                           dict(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table,
                                signature=key))
    dh = q.shape[-1]
    if out is None:
        out = torch.empty_like(q)
    return_lse = return_lse or lse is not None
    if return_lse and lse is None:
        lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], device=q.device, dtype=torch.float32)
    scale = 1.0 / math.sqrt(dh) if scale is None else float(scale)
    impl(q, k_cache, v_cache, prefix_lens, tree_mask, tail, block_table, scale, out, lse)
    return (out, lse) if return_lse else out


def _exact(q, k_cache, v_cache, prefix_lens, tree_mask, tail, block_table, scale, return_lse, out,
           lse, backend, key):
    """tree_attention(exact=True): the logical-order row form (reference, or triton when named)."""
    name = exact_backend("tree_attention", q.device, backend)
    return_lse = return_lse or lse is not None
    if name == "triton":
        # The normal triton kernel's availability and support checks (head dims, layouts): the
        # same refusals as a normal call; its implementation is not the one run here.
        _backend.select(q.device, "tree_attention", "triton",
                        dict(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table,
                             signature=key))
        from ..triton.exact_attention import exact_tree_attention
        out = torch.empty_like(q) if out is None else out
        if return_lse and lse is None:
            lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32,
                              device=q.device)
        with cuda_device_guard(q.device):         # Triton launches on the current device
            exact_tree_attention(q, k_cache, v_cache, prefix_lens, tree_mask, tail, block_table,
                                 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale),
                                 out, lse)
        return (out, lse) if return_lse else out
    o, l = tree_attention_logical(q, k_cache, v_cache, prefix_lens, tree_mask, tail, block_table,
                                  scale)
    out = o.to(q.dtype) if out is None else out.copy_(o)
    if not return_lse:
        return out
    lse = l.to(torch.float32) if lse is None else lse.copy_(l)
    return out, lse
