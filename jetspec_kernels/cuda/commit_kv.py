"""cuda backend: commit_kv (in-place K/V compaction along the accepted path + hidden gather)."""
from __future__ import annotations

from typing import Optional

import torch

from . import extension as ext
from .custom_op import custom_op


@custom_op("jetspec::commit_kv", mutates_args=("k_cache", "v_cache"))
def _commit_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, prefix_lens: torch.Tensor,
               path: torch.Tensor, accept_len: torch.Tensor, block_table: Optional[torch.Tensor],
               hidden: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    _C = ext.module()
    with ext.on_device(k_cache.device):
        b, cols = path.shape
        dev = path.device
        prefix_lens = prefix_lens.contiguous()
        path = path.contiguous()
        accept_len = accept_len.contiguous()
        table = None if block_table is None else block_table.contiguous()
        new_lens = torch.empty(b, device=dev, dtype=torch.int32)
        if hidden is None:
            rows = torch.empty(0, device=dev, dtype=k_cache.dtype)
            hidden_dim, hidden_batch_stride, hidden_row_stride, hidden_elem_bytes = 0, 0, 0, 4
        else:
            hidden_dim = hidden.shape[2]
            rows = torch.empty(b, cols, hidden_dim, device=dev, dtype=hidden.dtype)
            hidden_batch_stride, hidden_row_stride = hidden.stride(0), hidden.stride(1)
            hidden_elem_bytes = hidden.element_size()
        _C.commit_kv(k_cache=ext.ptr(k_cache), v_cache=ext.ptr(v_cache),
                     k_cache_strides=ext.strides3(k_cache), v_cache_strides=ext.strides3(v_cache),
                     block_table=ext.ptr(table),
                     block_table_batch_stride=0 if table is None else table.stride(0),
                     prefix_lens=ext.ptr(prefix_lens), path=ext.ptr(path), accept_len=ext.ptr(accept_len),
                     new_prefix_lens=ext.ptr(new_lens), hidden=ext.ptr(hidden),
                     hidden_batch_stride=hidden_batch_stride, hidden_row_stride=hidden_row_stride,
                     hidden_rows=0 if hidden is None else ext.ptr(rows), batch=b, cols=cols,
                     hkv=k_cache.shape[2], head_dim=k_cache.shape[3], page_size=k_cache.shape[1],
                     hidden_dim=hidden_dim, cache_elem_bytes=k_cache.element_size(),
                     hidden_elem_bytes=hidden_elem_bytes, stream=ext.stream())
        return new_lens, rows


@_commit_kv.register_fake
def _(k_cache, v_cache, prefix_lens, path, accept_len, block_table, hidden):
    b, cols = path.shape
    new_lens = path.new_empty(b)
    if hidden is None:
        return new_lens, k_cache.new_empty(0)
    return new_lens, hidden.new_empty(b, cols, hidden.shape[2])


def commit_kv(k_cache, v_cache, prefix_lens, path, accept_len, block_table, hidden):
    """Move slot prefix+path[i] to prefix+i (i <= accept_len) in place.

    Returns (new_prefix_lens int32 [B], hidden_rows [B, M, Hh] in hidden's dtype or None).
    """
    new_lens, rows = _commit_kv(k_cache, v_cache, prefix_lens, path, accept_len, block_table, hidden)
    return new_lens, (None if hidden is None else rows)
