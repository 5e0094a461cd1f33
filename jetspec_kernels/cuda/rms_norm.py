"""cuda backend: rms_norm (fused residual add + RMSNorm over the rows of [R, H]; rms_norm.cuh)."""
from __future__ import annotations

from typing import Optional

import torch

from . import extension as ext
from .custom_op import custom_op


@custom_op("jetspec::rms_norm", mutates_args=())
def _rms_norm(x: torch.Tensor, residual: Optional[torch.Tensor], weight: torch.Tensor,
              eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    _C = ext.module()
    with ext.on_device(x.device):
        rows, hidden = x.shape
        out = torch.empty(rows, hidden, device=x.device, dtype=x.dtype)
        # Without a residual there is no total: an empty tensor stands for None (a custom op
        # cannot return None), mapped back by rms_norm below.
        total = torch.empty(0 if residual is None else rows, hidden, device=x.device,
                            dtype=x.dtype)
        _C.rms_norm(x=ext.ptr(x), x_row_stride=x.stride(0), residual=ext.ptr(residual),
                    residual_row_stride=0 if residual is None else residual.stride(0),
                    weight=ext.ptr(weight), out=ext.ptr(out),
                    total=0 if residual is None else ext.ptr(total), rows=rows, hidden=hidden,
                    eps=float(eps), dtype=ext.dtype_code(x), stream=ext.stream())
        return out, total


@_rms_norm.register_fake
def _(x, residual, weight, eps):
    rows, hidden = x.shape
    return x.new_empty(rows, hidden), x.new_empty(0 if residual is None else rows, hidden)


def rms_norm(x, residual, weight, eps):
    """out = weight * rnd(h * rsqrt(mean(h^2) + eps)) per row of h = rnd(x + residual) (or x).

    Returns (out [R, H], total [R, H] = h, or None without a residual), both contiguous in
    x's dtype.
    """
    out, total = _rms_norm(x, residual, weight, eps)
    return out, (None if residual is None else total)
