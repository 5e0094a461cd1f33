"""rms_norm: the models' RMSNorm, with the residual add before it fused (one kernel, not eight)."""
from __future__ import annotations

import torch

from .. import backend as _backend
from .. import checks

_STATIC: dict = {}  # signatures whose static checks passed (checks.signature)
_F32 = torch.finfo(torch.float32)


def check_rms_norm(x, weight, eps, residual) -> None:
    key = checks.signature(x, weight, eps, residual)
    if key is not None and key in _STATIC:
        return
    checks.tensor("x", x, dtypes=checks.FLOAT_DTYPES)
    if x.dim() < 1:
        raise ValueError(f"x must have at least one dimension (the normalised one), got shape "
                         f"{list(x.shape)}")
    h = x.shape[-1]
    if h < 1:
        raise ValueError(f"x must have a non-empty last dimension, got shape {list(x.shape)}")
    checks.tensor("weight", weight, dtypes=(x.dtype,), shape=[h], device=x.device)
    if not _F32.tiny <= checks.number("eps", eps, positive=True) <= _F32.max:
        raise ValueError(f"eps must be a positive float32 (the kernels add it in float32: from "
                         f"{_F32.tiny:g} to {_F32.max:g}), got {eps!r}")
    checks.optional("residual", residual, dtypes=(x.dtype,), shape=list(x.shape), device=x.device)
    checks.remember(_STATIC, key, True)


def _rows(t):
    """``t [..., H]`` as ``[R, H]``: a view when the leading dims flatten to one row stride, else a
    copy (the backends take one row stride)."""
    return t.reshape(-1, t.shape[-1])


def rms_norm(x, weight, *, eps: float = 1e-6, residual=None, backend: str | None = None):
    """RMSNorm over the last dim in the models' (Hugging Face Qwen3) form, optionally after the
    residual add that precedes it in a decoder layer.

    Per row: ``total = x + residual`` rounded to x's dtype (or x), then
    ``out = weight * round(total * rsqrt(mean(total**2) + eps))`` with the mean and rsqrt in
    float32 and both products rounded to x's dtype (``python_ref.add_rms_norm`` /
    ``python_ref.rms_norm`` with ``dtype=x.dtype``).

    Parameters
    ----------
    x : float32/float16/bfloat16 [..., H] (H >= 1; last dim contiguous, any other strides)
    weight : x.dtype [H]
    eps : float > 0
    residual : x.dtype, x's shape (last dim contiguous), optional
    backend : "auto", "cuda", "triton" or "reference" (default: :func:`get_backend`). ``auto``
        runs the reference (torch ops) on CUDA tensors until a GPU backend has passed on hardware
        (``backend.REFERENCE_UNTIL_VERIFIED``).

    Returns
    -------
    out : x.dtype [..., H], contiguous; with ``residual``, ``(out, total)`` with total x.dtype
    [..., H] contiguous (the new residual stream). No host sync (graph-capturable). No autograd:
    inputs that require grad (with grad enabled) are a ValueError.
    """
    check_rms_norm(x, weight, eps, residual)
    if (x.requires_grad or weight.requires_grad or (residual is not None and residual.requires_grad)) \
            and torch.is_grad_enabled():
        raise ValueError("rms_norm has no backward: its inputs must not require grad (call it under "
                         "torch.no_grad() or torch.inference_mode())")
    rows = _rows(x)
    res = None if residual is None else _rows(residual)
    out, total = _backend.select(x.device, "rms_norm", backend, dict(x=rows))(
        rows, res, weight, float(eps))
    out = out.view(x.shape)
    return out if residual is None else (out, total.view(x.shape))
