"""The models' decoder layer: python_ref's Qwen3 layer as the target and the draft head run it.

Same order of operations as :func:`jetspec_kernels.python_ref.layers.decoder_layer` (pre-norm
attention, then pre-norm MLP, both residual), plus what production needs and the spec does not:
one stacked q/k/v GEMM, the all-reduce of tensor parallelism, a fused norm with the residual add
in front, and the MLP's residual add left to the next norm. ``tests/test_models_layer.py`` holds
the two to the same bits where their arithmetic is the same.
"""
from __future__ import annotations

import torch.nn.functional as F

from ..python_ref.layers import swiglu
from ..python_ref.rms_norm import add_rms_norm

__all__ = ["decoder_layer"]


def _identity(x):
    return x


def decoder_layer(h, w, attend, eps, *, mlp=swiglu, dtype=None, reduce=None, norm=None,
                  residual=None, defer_add=False, linear=F.linear, row_linear=None):
    """One pre-norm Qwen3 decoder layer: ``h += o_proj(attend(q, k, v))``, then
    ``h += mlp(post_attention_layernorm(h))``.

    Parameters
    ----------
    h : ``[B, N, H]`` the residual stream (with ``residual``: its last addend)
    w : one layer's tensors, keys as in Hugging Face checkpoints after ``layers.{i}.``; with
        ``self_attn.qkv_proj.weight`` (q, k and v stacked in that order) one GEMM computes q, k
        and v (``models/projections.py``), the per-projection weights giving the split sizes
    attend : callable ``(q [B, N, Hq, Dh], k [B, N, Hkv, Dh], v [B, N, Hkv, Dh], w) ->
        [B, N, Hq, Dh]`` on the raw projections (q/k norms, RoPE, the KV cache and attention)
    eps : float
    mlp : callable ``(x [B, N, H], w) -> [B, N, H]`` on the normed stream
    dtype : the norms' form when ``norm`` is None (:func:`~jetspec_kernels.python_ref.rms_norm.rms_norm`)
    reduce : callable ``[B, N, H] -> [B, N, H]`` on the attention's output projection and on the
        MLP's output before each is added to ``h`` (tensor parallelism: this rank's partial sums,
        all-reduced), or None
    norm : callable ``(x [B, N, H], weight [H], residual) -> (normed, total)``: the residual add
        ``total = x + residual`` (``residual`` None: ``total = x``) and the RMSNorm of ``total``
        (``models/norm.py``: one fused kernel), or None: ``add_rms_norm`` with ``eps``, ``dtype``
    residual : ``[B, N, H]`` or None. The stream is ``h + residual``, added by the input norm's
        fused add (a previous layer's ``defer_add`` output)
    defer_add : bool. Return the MLP's output and the stream before it, unsummed, so the next
        layer's input norm (or the final norm) adds them; False: their sum
    linear : callable ``(x [B, N, K], weight [M, K]) -> [B, N, M]`` for the q/k/v and o
        projections (the exact mode passes ``ops.exact.linear``, one M = 1 GEMM per row)
    row_linear : the same for the o projection, the row-parallel one whose output ``reduce``
        sums (the exact mode's splits K in fixed parts), or None: ``linear``

    Returns
    -------
    ``[B, N, H]``, or with ``defer_add`` ``(mlp_out, h)`` of that shape, whose sum is the
    layer's output
    """
    if norm is None:
        def norm(x, weight, residual):
            return add_rms_norm(x, residual, weight, eps, dtype)
    reduce = _identity if reduce is None else reduce
    a, h = norm(h, w["input_layernorm.weight"], residual)
    dh = w["self_attn.q_norm.weight"].shape[-1]
    if "self_attn.qkv_proj.weight" in w:                 # one GEMM, views of its output
        nq, nkv = w["self_attn.q_proj.weight"].shape[0], w["self_attn.k_proj.weight"].shape[0]
        q, k, v = (t.unflatten(-1, (-1, dh)) for t in
                   linear(a, w["self_attn.qkv_proj.weight"]).split([nq, nkv, nkv], dim=-1))
    else:
        q, k, v = (linear(a, w[f"self_attn.{p}_proj.weight"]).unflatten(-1, (-1, dh))
                   for p in "qkv")
    row_linear = linear if row_linear is None else row_linear
    attn = reduce(row_linear(attend(q, k, v, w).flatten(-2), w["self_attn.o_proj.weight"]))
    a, h = norm(attn, w["post_attention_layernorm.weight"], h)   # h + attn, then its norm
    out = reduce(mlp(a, w))
    return (out, h) if defer_add else h + out
