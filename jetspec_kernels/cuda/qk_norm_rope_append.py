"""cuda backend: qk_norm_rope_append (one warp per (token, head) row; no q warps without q)."""
from __future__ import annotations

from typing import Optional

import torch

from .. import checks
from . import extension as ext
from .custom_op import custom_op


def _launch(q, k, v, q_norm_w, k_norm_w, positions, k_cache, v_cache, rope_theta, eps, block_table,
            cache_start, q_out, rotary_dim=0):
    """Call _C; ``q``, ``q_norm_w`` and ``q_out`` are None for a K/V-only append, both weights
    None without the norm; ``rotary_dim`` 0 rotates whole heads."""
    _C = ext.module()
    with ext.on_device(k.device):
        b, n, hkv, dh = k.shape
        hq = 0 if q is None else q.shape[2]
        norm = k_norm_w is not None
        qw = None if q is None or not norm else checks.as_dtype(q_norm_w, torch.float32).contiguous()
        kw = None if not norm else checks.as_dtype(k_norm_w, torch.float32).contiguous()
        pos = checks.as_dtype(positions, torch.int32).contiguous()
        start = None if cache_start is None else cache_start.contiguous()
        table = None if block_table is None else block_table.contiguous()
        _C.qk_norm_rope_append(
            q=ext.ptr(q), k=k.data_ptr(), v=v.data_ptr(), q_norm_w=ext.ptr(qw),
            k_norm_w=0 if kw is None else kw.data_ptr(),
            positions=pos.data_ptr(), cache_start=ext.ptr(start), q_out=ext.ptr(q_out),
            k_cache=k_cache.data_ptr(), v_cache=v_cache.data_ptr(), block_table=ext.ptr(table),
            q_strides=[0, 0, 0] if q is None else ext.strides3(q), k_strides=ext.strides3(k),
            v_strides=ext.strides3(v), k_cache_strides=ext.strides3(k_cache),
            v_cache_strides=ext.strides3(v_cache),
            block_table_batch_stride=0 if table is None else table.stride(0), batch=b, n=n, hq=hq,
            hkv=hkv, head_dim=dh,
            page_size=k_cache.shape[1], theta=float(rope_theta), eps=float(eps),
            dtype=ext.dtype_code(k), cache_dtype=ext.dtype_code(k_cache), stream=ext.stream(),
            rotary_dim=rotary_dim)


@custom_op("jetspec::qk_norm_rope_append", mutates_args=("k_cache", "v_cache"))
def _qk_norm_rope_append(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         q_norm_w: Optional[torch.Tensor], k_norm_w: Optional[torch.Tensor],
                         positions: torch.Tensor, k_cache: torch.Tensor,
                         v_cache: torch.Tensor, rope_theta: float, eps: float,
                         block_table: Optional[torch.Tensor],
                         cache_start: Optional[torch.Tensor], rotary_dim: int = 0) -> torch.Tensor:
    q_out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    _launch(q, k, v, q_norm_w, k_norm_w, positions, k_cache, v_cache, rope_theta, eps, block_table,
            cache_start, q_out, rotary_dim)
    return q_out


@_qk_norm_rope_append.register_fake
def _(q, k, v, q_norm_w, k_norm_w, positions, k_cache, v_cache, rope_theta, eps, block_table,
      cache_start, rotary_dim=0):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


# A separate op for the K/V-only form: it returns nothing, so it needs no fake output.
@custom_op("jetspec::kv_norm_rope_append", mutates_args=("k_cache", "v_cache"))
def _kv_norm_rope_append(k: torch.Tensor, v: torch.Tensor, k_norm_w: Optional[torch.Tensor],
                         positions: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         rope_theta: float, eps: float, block_table: Optional[torch.Tensor],
                         cache_start: Optional[torch.Tensor], rotary_dim: int = 0) -> None:
    _launch(None, k, v, None, k_norm_w, positions, k_cache, v_cache, rope_theta, eps, block_table,
            cache_start, None, rotary_dim)


@_kv_norm_rope_append.register_fake
def _(k, v, k_norm_w, positions, k_cache, v_cache, rope_theta, eps, block_table, cache_start,
      rotary_dim=0):
    return None


def qk_norm_rope_append(q, k, v, q_norm_w, k_norm_w, positions, k_cache, v_cache, rope_theta, eps,
                        block_table, cache_start, rotary_dim=None):
    """Per-head RMSNorm of q and k, RoPE at ``positions``, and the K/V cache append.

    Parameters
    ----------
    q : float32/float16/bfloat16 ``[B, N, Hq, Dh]``, or None (K/V only: no q warps launched)
    k, v : q.dtype ``[B, N, Hkv, Dh]``
    q_norm_w : float ``[Dh]`` (None allowed when q is None); k_norm_w : float ``[Dh]``, or None
        with q_norm_w None: no norm
    positions : int32/int64 ``[B, N]``; k_cache, v_cache : contiguous or paged cache
    rope_theta, eps : float; block_table : int32 ``[B, max_pages]`` or None
    cache_start : int32 ``[B]`` or None
    rotary_dim : even int < Dh (partial rotary), or None (whole heads)

    Returns
    -------
    q_out : q.dtype ``[B, N, Hq, Dh]``, or None when q is None. The caches receive the normed,
    rotated k and the raw v.
    """
    rotary_dim = rotary_dim or 0
    if q is None:
        _kv_norm_rope_append(k, v, k_norm_w, positions, k_cache, v_cache, float(rope_theta),
                             float(eps), block_table, cache_start, rotary_dim)
        return None
    return _qk_norm_rope_append(q, k, v, q_norm_w, k_norm_w, positions, k_cache, v_cache,
                                float(rope_theta), float(eps), block_table, cache_start, rotary_dim)
