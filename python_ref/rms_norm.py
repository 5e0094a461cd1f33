"""Reference RMSNorm: the plain form, the Hugging Face form, and the residual add before it."""

import torch

from ._common import compute_dtype

__all__ = ["rms_norm", "rms_scale", "add_rms_norm"]


def rms_norm(x, weight, eps=1e-6, dtype=None):
    """RMSNorm over the last dim: ``x * rsqrt(mean(x**2) + eps) * weight``.

    Parameters
    ----------
    x : ``[..., D]``; weight : ``[D]``; eps : float
    dtype : None for the reference form, else the Hugging Face form: x is normalised in float32,
        cast to ``dtype``, then multiplied by ``weight`` as it is (what the models run, so their
        bf16 results match transformers').

    Returns
    -------
    ``[..., D]``: dtype None -> in the compute dtype (float64 if x is float64, else float32);
    else in the promotion of ``weight.dtype`` and ``dtype``.
    """
    cd = compute_dtype(x) if dtype is None else torch.float32
    xf = x.to(cd)
    xf = xf * rms_scale(xf, eps)
    if dtype is None:
        return xf * weight.to(cd)
    return weight * xf.to(dtype)


def rms_scale(xf, eps):
    """``rsqrt(mean(xf**2) + eps)`` over the last dim of ``xf`` (in its dtype), ``[..., 1]``."""
    return torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)


def add_rms_norm(x, residual, weight, eps=1e-6, dtype=None):
    """The residual add and the RMSNorm after it, as a decoder layer runs them:
    ``total = x + residual`` (in their dtype: rounded as the models' add; ``total = x`` when
    ``residual`` is None), then ``rms_norm(total, weight, eps, dtype)``.

    Parameters
    ----------
    x : ``[..., D]``; residual : x's dtype and shape, or None; weight : ``[D]``;
    eps, dtype : as in :func:`rms_norm`

    Returns
    -------
    ``(normed, total)``: normed as :func:`rms_norm` returns it, total ``[..., D]`` in x's dtype.
    """
    total = x if residual is None else x + residual
    return rms_norm(total, weight, eps, dtype), total
