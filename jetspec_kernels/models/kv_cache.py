"""A multi-layer KV cache in the package's layouts (DESIGN.md section 3).

All layers share one tensor per K and V, with the layers side by side in the head dimension:
contiguous ``[B, L_max, num_layers * Hkv, Dh]`` or paged ``[P, page_size, num_layers * Hkv, Dh]``.
Layer ``l`` is the view ``[..., l*Hkv:(l+1)*Hkv, :]`` (contiguous in its last dim, as every op
requires), and one :func:`jetspec_kernels.commit_kv` call compacts every layer at once.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["KVCache"]


@dataclass
class KVCache:
    """K/V storage of ``num_layers`` layers.

    Attributes
    ----------
    k, v : [B, L_max, num_layers * Hkv, Dh] (contiguous) or [P, page_size, num_layers * Hkv, Dh]
    block_table : int32 [B, max_pages] for a paged cache, else None
    num_layers, kv_heads : ints
    """

    k: torch.Tensor
    v: torch.Tensor
    block_table: torch.Tensor | None
    num_layers: int
    kv_heads: int

    @classmethod
    def allocate(cls, num_layers: int, batch: int, capacity: int, kv_heads: int, head_dim: int, *,
                 dtype: torch.dtype, device, page_size: int | None = None) -> "KVCache":
        """Zeroed cache for ``batch`` sequences of up to ``capacity`` positions.

        Paged caches get ``ceil(capacity / page_size)`` pages per sequence, assigned through a
        fixed shuffled block table so that logical and physical page order differ.
        """
        width = num_layers * kv_heads
        if page_size is None:
            shape = (batch, capacity, width, head_dim)
            table = None
        else:
            if page_size < 1:
                raise ValueError(f"page_size must be >= 1, got {page_size}")
            per_seq = -(-capacity // page_size)
            shape = (batch * per_seq, page_size, width, head_dim)
            gen = torch.Generator().manual_seed(0)
            table = torch.randperm(batch * per_seq, generator=gen).view(batch, per_seq)
            table = table.to(device=device, dtype=torch.int32)
        k = torch.zeros(shape, dtype=dtype, device=device)
        return cls(k=k, v=torch.zeros_like(k), block_table=table, num_layers=num_layers,
                   kv_heads=kv_heads)

    @property
    def capacity(self) -> int:
        """Positions each sequence can hold."""
        if self.block_table is None:
            return self.k.shape[1]
        return self.block_table.shape[1] * self.k.shape[1]

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views ``(k, v)`` of layer ``i``: [..., Hkv, Dh]."""
        sl = slice(i * self.kv_heads, (i + 1) * self.kv_heads)
        return self.k[:, :, sl], self.v[:, :, sl]
