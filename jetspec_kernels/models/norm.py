"""The models' RMSNorm: the public ``rms_norm`` op (the residual add fused in front) in the form
``models/layer.py``'s ``decoder_layer`` takes as its ``norm``."""
from __future__ import annotations

from ..ops.rms_norm import rms_norm


def layer_norm(eps: float, backend: str | None = None):
    """``norm(x, weight, residual) -> (normed, total)`` for :func:`decoder_layer
    <jetspec_kernels.models.layer.decoder_layer>`: one ``rms_norm`` call (x's dtype, the
    Hugging Face form) per norm, the residual add included, on ``backend`` (None: the default)."""
    def norm(x, weight, residual):
        if residual is None:
            return rms_norm(x, weight, eps=eps, backend=backend), x
        return rms_norm(x, weight, eps=eps, residual=residual, backend=backend)
    return norm
