"""Reference Qwen3 decoder layer: the one layer the target, the draft head and training all run.

The layer fixes the order of operations (pre-norm attention, then pre-norm MLP, both residual);
callers pass what differs between them: the attention (a KV cache and kernels, or a dense
masked softmax), the MLP (dense SwiGLU or routed experts), and the draft head's context rows.
"""

import torch
import torch.nn.functional as F

from .qk_norm_rope_append import apply_rope
from .rms_norm import rms_norm
from .silu_mul import silu_mul

__all__ = ["layer_weights", "swiglu", "qk_norm_rope", "decoder_layer"]


def layer_weights(weights, prefix):
    """One layer's tensors out of a checkpoint-keyed dict: ``{key: weights[prefix + key]}`` for
    every key starting with ``prefix`` (e.g. ``"model.layers.3."``)."""
    n = len(prefix)
    return {k[n:]: t for k, t in weights.items() if k.startswith(prefix)}


def swiglu(x, w, act=None, linear=F.linear):
    """SwiGLU MLP ``down(silu(gate(x)) * up(x))``.

    Parameters
    ----------
    x : ``[..., H]``; w : ``mlp.gate_proj.weight``, ``mlp.up_proj.weight`` ``[I, H]``,
        ``mlp.down_proj.weight`` ``[H, I]``; with ``mlp.gate_up_proj.weight`` ``[2I, H]`` (the
        two stacked, gate first) one GEMM computes both
    act : callable ``[..., 2I] -> [..., I]`` on the gate/up GEMM's output (the models pass the
        fused ``silu_mul`` op; used with ``mlp.gate_up_proj.weight``), or None:
        :func:`silu_mul` in x's dtype
    linear : callable ``(x, weight) -> x @ weight.T`` for the three projections (the exact mode
        passes its row-invariant GEMM)

    Returns
    -------
    ``[..., H]``
    """
    if "mlp.gate_up_proj.weight" in w:                   # gate rows, then up rows: one GEMM
        gate_up = linear(x, w["mlp.gate_up_proj.weight"])
        h = silu_mul(gate_up, gate_up.dtype) if act is None else act(gate_up)
    else:
        h = F.silu(linear(x, w["mlp.gate_proj.weight"])) * linear(x, w["mlp.up_proj.weight"])
    return linear(h, w["mlp.down_proj.weight"])


def qk_norm_rope(q, k, w, eps, q_positions, k_positions, theta):
    """Per-head RMSNorm (``self_attn.{q,k}_norm.weight [Dh]``) then RoPE of the queries and keys.

    Parameters
    ----------
    q : ``[B, N, Hq, Dh]``; k : ``[B, M, Hkv, Dh]``
    q_positions, k_positions : int, broadcastable to ``[B, N]`` / ``[B, M]``; eps, theta : float

    Returns
    -------
    ``(q, k)`` of the same shapes, in the compute dtype.
    """
    q = apply_rope(rms_norm(q, w["self_attn.q_norm.weight"], eps), q_positions, theta)
    k = apply_rope(rms_norm(k, w["self_attn.k_norm.weight"], eps), k_positions, theta)
    return q, k


def decoder_layer(h, w, attend, eps, *, mlp=swiglu, context=None, dtype=None):
    """One pre-norm Qwen3 decoder layer: ``h += o_proj(attend(q, k, v))``, then
    ``h += mlp(post_attention_layernorm(h))``.

    Parameters
    ----------
    h : ``[B, N, H]`` the residual stream
    w : one layer's tensors, keys as in Hugging Face checkpoints after ``layers.{i}.``
        (``input_layernorm.weight``, ``self_attn.{q,k,v,o}_proj.weight``,
        ``self_attn.{q,k}_norm.weight [Dh]``, ``post_attention_layernorm.weight``, the MLP's)
    attend : callable ``(q [B, N, Hq, Dh], k [B, M, Hkv, Dh], v [B, M, Hkv, Dh], w) ->
        [B, N, Hq, Dh]`` on the raw projections: it applies the q/k norms and RoPE
        (:func:`qk_norm_rope`, or a fused kernel that also fills a KV cache) and attends
    eps : float
    mlp : callable ``(x [B, N, H], w) -> [B, N, H]`` on the normed stream (default :func:`swiglu`)
    context : ``[B, T, H]`` or None. Rows in front of the normed ``h`` for the keys and values
        only (``M = T + N``; the draft head's context, which takes no input layernorm).
        None: ``M = N``.
    dtype : the norms' form (:func:`rms_norm`): None for the reference, the model dtype for the
        Hugging Face form

    Returns
    -------
    ``[B, N, H]``. The models run the same layer with production knobs (stacked projections,
    tensor parallelism, fused norms, deferred adds): ``jetspec_kernels/models/layer.py``.
    """
    dh = w["self_attn.q_norm.weight"].shape[-1]
    a = rms_norm(h, w["input_layernorm.weight"], eps, dtype)
    kv_in = a if context is None else torch.cat([context, a], dim=-2)
    q = F.linear(a, w["self_attn.q_proj.weight"]).unflatten(-1, (-1, dh))
    k = F.linear(kv_in, w["self_attn.k_proj.weight"]).unflatten(-1, (-1, dh))
    v = F.linear(kv_in, w["self_attn.v_proj.weight"]).unflatten(-1, (-1, dh))
    h = h + F.linear(attend(q, k, v, w).flatten(-2), w["self_attn.o_proj.weight"])
    return h + mlp(rms_norm(h, w["post_attention_layernorm.weight"], eps, dtype), w)
