"""qk_norm_rope_append: per-head RMSNorm of q and k, RoPE, and the K/V cache append."""
from __future__ import annotations

import torch

from .. import backend as _backend
from .. import checks

POSITION_DTYPES = (torch.int32, torch.int64)


_STATIC: dict = {}  # signature -> cache capacity per sequence (checks.signature)


def check_qk_norm_rope_append(q, k, v, q_norm_w, k_norm_w, positions, k_cache, v_cache,
                              rope_theta, eps, block_table, cache_start, rotary_dim=None):
    key = checks.signature(q, k, v, q_norm_w, k_norm_w, positions, k_cache, v_cache, rope_theta,
                           eps, block_table, cache_start, rotary_dim)
    cap = None if key is None else _STATIC.get(key)  # (None: compiling; no read to guard on)
    if cap is None:  # dtypes, shapes, devices, layouts: once per signature
        if q is None:
            # K/V only: sizes and device come from k, and q_norm_w is optional.
            checks.tensor("k", k, dtypes=checks.FLOAT_DTYPES, ndim=4)
            b, n, hkv, dh = k.shape
            dev = k.device
            if dh % 2:
                raise ValueError(f"k head dim must be even for RoPE, got {dh}")
            if hkv == 0:
                raise ValueError(f"k must have at least one head, got shape {list(k.shape)}")
        else:
            checks.tensor("q", q, dtypes=checks.FLOAT_DTYPES, ndim=4)
            b, n, hq, dh = q.shape
            dev = q.device
            if dh % 2:
                raise ValueError(f"q head dim must be even for RoPE, got {dh}")
            checks.tensor("k", k, dtypes=(q.dtype,), ndim=4, device=dev)
            if k.shape[0] != b or k.shape[1] != n or k.shape[3] != dh:
                raise ValueError(f"k must have shape [{b}, {n}, Hkv, {dh}] to match q, got "
                                 f"{list(k.shape)}")
            hkv = k.shape[2]
            if hkv == 0 or hq % hkv != 0:
                raise ValueError(f"k must have a head count dividing q's {hq} heads (GQA) in dim 2, "
                                 f"got shape {list(k.shape)}")
        checks.tensor("v", v, dtypes=(k.dtype,), shape=list(k.shape), device=dev)
        if k_norm_w is None:             # no QK-norm (Llama, Mistral, Qwen2): q's is off too
            if q_norm_w is not None:
                raise ValueError("q_norm_w must be None when k_norm_w is None (the norm is on "
                                 "for both or for neither)")
        elif q is None:
            checks.optional("q_norm_w", q_norm_w, dtypes=checks.FLOAT_DTYPES, shape=[dh], device=dev)
        else:
            if q_norm_w is None:
                raise ValueError("q_norm_w must be a tensor [Dh] when k_norm_w is given (the "
                                 "norm is on for both or for neither)")
            checks.tensor("q_norm_w", q_norm_w, dtypes=checks.FLOAT_DTYPES, shape=[dh], device=dev)
        checks.optional("k_norm_w", k_norm_w, dtypes=checks.FLOAT_DTYPES, shape=[dh], device=dev)
        checks.tensor("positions", positions, dtypes=POSITION_DTYPES, shape=[b, n], device=dev)
        checks.number("rope_theta", rope_theta, positive=True)
        checks.number("eps", eps, lo=0.0)
        if rotary_dim is not None:
            checks.integer("rotary_dim", rotary_dim, lo=2, hi=dh)
            if rotary_dim % 2:
                raise ValueError(f"rotary_dim must be even (RoPE rotates halves), got {rotary_dim}")
        cap, _ = checks.cache_and_table(k_cache, v_cache, block_table, batch=b, hkv=hkv,
                                        head_dim=dh, dtypes=checks.FLOAT_DTYPES, device=dev)
        if cache_start is not None:
            checks.tensor("cache_start", cache_start, dtypes=checks.LENGTH_DTYPES, shape=[b],
                          device=dev)
        checks.remember(_STATIC, key, cap)
    checks.table_values(block_table, k_cache)
    checks.value_range("positions", positions, 0, checks.INT32_MAX)  # the cuda backend narrows to int32
    n = positions.shape[1]
    if cache_start is None:
        checks.value_range("positions", positions, 0, cap - 1)
        if checks.values_checked(positions) and n > 1:
            srt = positions.sort(1).values
            if bool((srt[:, 1:] == srt[:, :-1]).any()):
                raise ValueError("positions must be distinct within a sequence when they are the "
                                 "cache slots (cache_start=None); pass cache_start for tree rows")
    else:
        checks.fits_in_cache(cache_start, n, cap, "cache_start")


def qk_norm_rope_append(q, k, v, q_norm_w, k_norm_w, positions, k_cache, v_cache, *,
                        rope_theta: float, eps: float = 1e-6, block_table=None, cache_start=None,
                        rotary_dim: int | None = None, backend: str | None = None):
    """Per-head RMSNorm on q and k, RoPE at ``positions``, and k, v written into the cache.

    Parameters
    ----------
    q : float16/bfloat16/float32 [B, N, Hq, Dh], or None
        None appends K/V only (rows without a query, such as the draft head's context rows):
        no q is read, normalised, rotated or written.
    k, v : q.dtype [B, N, Hkv, Dh]         (float16/bfloat16/float32 when q is None)
    q_norm_w : float [Dh]                  q's RMSNorm weight; may be None when q is None
    k_norm_w : float [Dh]                  k's RMSNorm weight; None (with q_norm_w None): no norm,
                                           RoPE and the append alone (Llama, Mistral, Qwen2)
    positions : int32/int64 [B, N]        RoPE positions
    k_cache, v_cache : contiguous [B, L, Hkv, Dh] or paged [P, page_size, Hkv, Dh]
    rope_theta : float; eps : float >= 0 (RMSNorm epsilon)
    block_table : int32 [B, max_pages], optional (paged cache)
    cache_start : int32/int64 [B], optional
        Row n goes to cache slot ``cache_start[b] + n``; when None, to slot ``positions[b, n]``.
    rotary_dim : even int in [2, Dh], optional (None: Dh)
        Partial rotary (Hugging Face's ``partial_rotary_factor``: ``int(Dh * factor)``): RoPE
        rotates the first rotary_dim dims, rotate-half within them with angles
        ``theta ** (-2i / rotary_dim)``; the other dims pass through (normed).

    Returns
    -------
    q_out : q.dtype [B, N, Hq, Dh], normalised and rotated; None when q is None.
        k_cache and v_cache are updated in place.
    """
    check_qk_norm_rope_append(q, k, v, q_norm_w, k_norm_w, positions, k_cache, v_cache,
                              rope_theta, eps, block_table, cache_start, rotary_dim)
    if cache_start is not None and cache_start.dtype != torch.int32:  # checks.LENGTH_DTYPES
        cache_start = cache_start.to(torch.int32)
    if rotary_dim == k.shape[-1]:
        rotary_dim = None                # the whole head: the usual form
    return _backend.select(k.device, "qk_norm_rope_append", backend, dict(k=k))(
        q, k, v, q_norm_w, k_norm_w, positions, k_cache, v_cache, float(rope_theta), float(eps),
        block_table, cache_start, rotary_dim)
