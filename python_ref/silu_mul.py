"""Reference silu_mul: SwiGLU's activation on the gate/up GEMM's output."""

import torch
import torch.nn.functional as F

from ._common import compute_dtype

__all__ = ["silu_mul"]


def silu_mul(x, dtype=None):
    """SwiGLU's activation ``silu(gate) * up`` of ``x = [gate, up]`` (the gate/up GEMM's output).

    Parameters
    ----------
    x : ``[..., 2I]``: gate in the first I columns, up in the last I
    dtype : None for the reference form (``g / (1 + exp(-g)) * u`` in the compute dtype, no
        rounding between), else the Hugging Face form: ``F.silu(gate)`` rounded to ``dtype``,
        then the product rounded to ``dtype`` (what the models run)

    Returns
    -------
    ``[..., I]``: dtype None -> in the compute dtype; else in ``dtype``.
    """
    if dtype is None:
        gate, up = x.to(compute_dtype(x)).chunk(2, dim=-1)
        return gate / (1 + torch.exp(-gate)) * up
    gate, up = x.to(dtype).chunk(2, dim=-1)
    return F.silu(gate) * up
