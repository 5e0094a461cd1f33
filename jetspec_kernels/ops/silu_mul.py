"""silu_mul: SwiGLU's activation on the gate/up GEMM's output (one kernel, not two)."""
from __future__ import annotations

import torch

from .. import backend as _backend
from .. import checks

_STATIC: dict = {}  # signatures whose static checks passed (checks.signature)


def check_silu_mul(x) -> None:
    key = checks.signature(x)
    if key is not None and key in _STATIC:
        return
    checks.tensor("x", x, dtypes=checks.FLOAT_DTYPES)
    if x.dim() < 1 or x.shape[-1] < 2 or x.shape[-1] % 2:
        raise ValueError(f"x must have an even last dimension of at least 2 (gate, then up), got "
                         f"shape {list(x.shape)}")
    checks.remember(_STATIC, key, True)


def silu_mul(x, *, backend: str | None = None):
    """SwiGLU's activation in the models' (Hugging Face Qwen3) form: ``silu(gate) * up`` of
    ``x = [gate, up]``, the output of the MLP's fused gate/up GEMM.

    Per element, with g = x[..., j] and u = x[..., I + j]: ``s = round(g / (1 + exp(-g)))``
    computed in float32 and rounded to x's dtype, then ``out = round(s * u)`` (the product in
    float32); torch's specials (silu(-inf) is NaN, silu of a large negative g is -0.0).
    ``python_ref.silu_mul(x, dtype=x.dtype)``; backends' float32 exp and division may differ from
    torch's by a few ulps before the rounding to x's dtype.

    Parameters
    ----------
    x : float32/float16/bfloat16 [..., 2I] (I >= 1; gate in the first I columns, up in the last I;
        last dim contiguous, any other strides)
    backend : "auto", "cuda", "triton" or "reference" (default: :func:`get_backend`). ``auto``
        runs the reference (torch ops) on CUDA tensors until a GPU backend has passed on hardware
        (``backend.REFERENCE_UNTIL_VERIFIED``).

    Returns
    -------
    out : x.dtype [..., I], contiguous. No host sync (graph-capturable). No autograd: an input
    that requires grad (with grad enabled) is a ValueError.
    """
    check_silu_mul(x)
    if x.requires_grad and torch.is_grad_enabled():
        raise ValueError("silu_mul has no backward: x must not require grad (call it under "
                         "torch.no_grad() or torch.inference_mode())")
    rows = x.reshape(-1, x.shape[-1])   # a view when the leading dims flatten to one stride
    out = _backend.select(x.device, "silu_mul", backend, dict(x=rows))(rows)
    return out.view(*x.shape[:-1], x.shape[-1] // 2)
