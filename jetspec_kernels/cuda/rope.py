"""cuda backend: qk_norm_rope_append (one warp per (token, head) row)."""
from __future__ import annotations

from typing import Optional

import torch

from . import _util as U

MAX_HEAD_DIM = 512  # 2 * 32 lanes * kRopeMaxPairsPerLane


@torch.library.custom_op("jetspec::qk_norm_rope_append", mutates_args=("k_cache", "v_cache"))
def _qk_norm_rope_append(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_norm_w: torch.Tensor,
                         k_norm_w: torch.Tensor, positions: torch.Tensor, k_cache: torch.Tensor,
                         v_cache: torch.Tensor, rope_theta: float, eps: float,
                         block_table: Optional[torch.Tensor],
                         cache_start: Optional[torch.Tensor]) -> torch.Tensor:
    from .. import _C

    b, n, hq, dh = q.shape
    hkv = k.shape[2]
    q_out = torch.empty(b, n, hq, dh, device=q.device, dtype=q.dtype)
    qw = q_norm_w.to(torch.float32).contiguous()
    kw = k_norm_w.to(torch.float32).contiguous()
    pos = positions.to(torch.int32).contiguous()
    start = None if cache_start is None else cache_start.contiguous()
    table = None if block_table is None else block_table.contiguous()
    _C.qk_norm_rope_append(
        U.ptr(q), U.ptr(k), U.ptr(v), U.ptr(qw), U.ptr(kw), U.ptr(pos), U.ptr(start), U.ptr(q_out),
        U.ptr(k_cache), U.ptr(v_cache), U.ptr(table), U.strides3(q), U.strides3(k), U.strides3(v),
        U.strides3(k_cache), U.strides3(v_cache), 0 if table is None else table.stride(0),
        b, n, hq, hkv, dh, k_cache.shape[1], float(rope_theta), float(eps), U.dtype_code(q),
        U.dtype_code(k_cache), U.stream())
    return q_out


@_qk_norm_rope_append.register_fake
def _(q, k, v, q_norm_w, k_norm_w, positions, k_cache, v_cache, rope_theta, eps, block_table,
      cache_start):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def qk_norm_rope_append(q, k, v, q_norm_w, k_norm_w, positions, k_cache, v_cache, rope_theta, eps,
                        block_table, cache_start):
    """Return q_out [B, N, Hq, Dh] (q.dtype); write normed+rotated k and raw v into the caches."""
    if q.shape[-1] > MAX_HEAD_DIM:
        raise U.unavailable(f"qk_norm_rope_append supports head dims up to {MAX_HEAD_DIM}, "
                            f"got {q.shape[-1]}")
    return _qk_norm_rope_append(q, k, v, q_norm_w, k_norm_w, positions, k_cache, v_cache,
                                float(rope_theta), float(eps), block_table, cache_start)
