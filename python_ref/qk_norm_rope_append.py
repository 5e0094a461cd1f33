"""Reference qk_norm_rope_append: per-head RMSNorm of q and k, RoPE, and the KV cache append.

RoPE angle convention (so every backend can reproduce it exactly):
``inv_freq[i] = float32(theta ** (-2 i / Dh))`` (correctly rounded from float64, ``i < Dh/2``),
``angle = float32(float32(position) * inv_freq[i])`` (one float32 multiply), and
``cos``/``sin`` of that float32 angle evaluated in float64, then cast to the compute dtype.
The float32 angle follows the Hugging Face Qwen3 rotary embedding (which also forms the angle in
float32) and keeps float32 kernels within float32 tolerance of a float64 reference at long
positions; the exact-real-angle alternative would not be reproducible by a float32 kernel.
"""

import torch

from ._common import cache_indices, compute_dtype
from .rms_norm import rms_norm

__all__ = ["rope_inv_freq", "rope_cos_sin", "apply_rope", "qk_norm_rope_append"]


def rope_inv_freq(head_dim, theta):
    """float32 ``[head_dim // 2]``: ``theta ** (-2 i / head_dim)`` correctly rounded to float32."""
    i = torch.arange(head_dim // 2, dtype=torch.float64)
    return (float(theta) ** (-2.0 * i / head_dim)).to(torch.float32)


def rope_cos_sin(positions, head_dim, theta, dtype=torch.float32):
    """cos and sin tables ``[*positions.shape, head_dim // 2]`` in ``dtype`` (see module doc)."""
    inv = rope_inv_freq(head_dim, theta).to(positions.device)
    angle = positions.to(torch.float32)[..., None] * inv          # float32 multiply
    angle = angle.to(torch.float64)
    return torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)


def apply_rope(x, positions, theta, rotary_dim=None):
    """Neox / Qwen "rotate half" RoPE, on the first ``rotary_dim`` dims of each head (partial
    rotary, Hugging Face's ``partial_rotary_factor``: ``rotary_dim = int(Dh * factor)``).

    Parameters
    ----------
    x : ``[..., H, Dh]``
    positions : int tensor broadcastable to ``x.shape[:-2]``
    theta : float (rope_theta)
    rotary_dim : even int in ``[2, Dh]``, or None for ``Dh``

    Returns
    -------
    ``[..., H, Dh]`` in the compute dtype: with ``R = rotary_dim`` and ``h = R/2``,
    ``out[:h] = x[:h]*cos - x[h:R]*sin``, ``out[h:R] = x[h:R]*cos + x[:h]*sin``,
    ``out[R:] = x[R:]``; the angles are :func:`rope_cos_sin` of ``R`` (``theta ** (-2i / R)``).
    """
    cd = compute_dtype(x)
    R = x.shape[-1] if rotary_dim is None else rotary_dim
    h = R // 2
    cos, sin = rope_cos_sin(positions, R, theta, cd)
    cos = cos[..., None, :]                                     # [..., 1, h] broadcast over heads
    sin = sin[..., None, :]
    xf = x.to(cd)
    x1, x2 = xf[..., :h], xf[..., h:R]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, xf[..., R:]], dim=-1)


def qk_norm_rope_append(q, k, v, q_norm_w, k_norm_w, positions, k_cache, v_cache, rope_theta,
                        eps=1e-6, block_table=None, cache_start=None, rotary_dim=None):
    """Per-head RMSNorm of q and k, RoPE at ``positions``, and the K/V cache append.

    Parameters
    ----------
    q : ``[B, N, Hq, Dh]`` or None (K/V only: the cache writes alone, e.g. draft context rows)
    k, v : ``[B, N, Hkv, Dh]``
    q_norm_w : ``[Dh]`` (ignored, may be None, when q is None); k_norm_w : ``[Dh]``, or None:
        no norm (targets without QK-norm: Llama, Mistral, Qwen2; q_norm_w is then None too)
    positions : int32 ``[B, N]``, RoPE positions
    k_cache, v_cache : ``[B, L_max, Hkv, Dh]`` or paged ``[num_pages, page_size, Hkv, Dh]``
        (written in place, in the cache dtype)
    rope_theta : float; eps : float (unused without the norm)
    block_table : int32 ``[B, max_pages]`` or None
    cache_start : int32 ``[B]`` or None. Row n of sequence b goes to slot ``positions[b, n]``
        when None, else to slot ``cache_start[b] + n``.
    rotary_dim : see :func:`apply_rope` (None: the whole head)

    Returns
    -------
    q_out : ``[B, N, Hq, Dh]`` in the compute dtype (float64 if q is float64, else float32),
    ``apply_rope(rms_norm(q, q_norm_w))`` (``apply_rope(q)`` without the norm); None when q is
    None. The cache receives k the same way and the raw ``v``, both cast to the cache dtype.
    """
    B, N = k.shape[:2]

    def norm_rope(x, w):
        x = x if k_norm_w is None else rms_norm(x, w, eps)
        return apply_rope(x, positions, rope_theta, rotary_dim)

    q_out = None if q is None else norm_rope(q, q_norm_w)
    k_out = norm_rope(k, k_norm_w)
    if cache_start is None:
        slots = positions.to(torch.long)
    else:
        slots = cache_start.to(torch.long)[:, None] + torch.arange(N, device=k.device)
    i0, i1 = cache_indices(slots, block_table, k_cache.shape[1])
    k_cache[i0, i1] = k_out.to(k_cache.dtype)
    v_cache[i0, i1] = v.to(v_cache.dtype)
    return q_out
