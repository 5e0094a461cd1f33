"""cuda backend: silu_mul (SwiGLU's silu(gate) * up over the rows of [R, 2I]; silu_mul.cuh)."""
from __future__ import annotations

import torch

from . import extension as ext
from .custom_op import custom_op


@custom_op("jetspec::silu_mul", mutates_args=())
def _silu_mul(x: torch.Tensor) -> torch.Tensor:
    _C = ext.module()
    with ext.on_device(x.device):
        rows, inner = x.shape[0], x.shape[1] // 2
        out = torch.empty(rows, inner, device=x.device, dtype=x.dtype)
        _C.silu_mul(x=ext.ptr(x), x_row_stride=x.stride(0), out=ext.ptr(out), rows=rows,
                    inner=inner, dtype=ext.dtype_code(x), stream=ext.stream())
        return out


@_silu_mul.register_fake
def _(x):
    return x.new_empty(x.shape[0], x.shape[1] // 2)


def silu_mul(x):
    """out [R, I] = rnd(rnd(silu(gate)) * up) per element of x [R, 2I] (gate = x[:, :I], up =
    x[:, I:]; silu(g) = g / (1 + exp(-g)) in float32), contiguous in x's dtype."""
    return _silu_mul(x)
