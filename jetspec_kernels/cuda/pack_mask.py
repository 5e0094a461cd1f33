"""cuda backend: pack_mask."""
from __future__ import annotations

import torch

from ..tree import mask_words
from . import extension as ext
from .custom_op import custom_op


@custom_op("jetspec::pack_mask", mutates_args=())
def _pack_mask(parents: torch.Tensor, num_nodes: torch.Tensor) -> torch.Tensor:
    _C = ext.module()
    with ext.on_device(parents.device):
        b, n = parents.shape
        w = mask_words(n)
        parents = parents.contiguous()
        num_nodes = num_nodes.contiguous()
        mask = torch.empty(b, n, w, dtype=torch.int32, device=parents.device)
        _C.pack_mask(parents=ext.ptr(parents), num_nodes=ext.ptr(num_nodes), mask=ext.ptr(mask), batch=b,
                     n=n, words=w, stream=ext.stream())
        return mask


@_pack_mask.register_fake
def _(parents, num_nodes):
    b, n = parents.shape
    return parents.new_empty(b, n, mask_words(n))


def pack_mask(parents, num_nodes):
    return _pack_mask(parents, num_nodes)
