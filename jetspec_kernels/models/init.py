"""Shape tables of the checkpoint tensors, and the one weight init (random models and training).

Keys are named as in Hugging Face checkpoints after ``model.layers.{i}.`` (target) or
``layers.{i}.`` (draft head).
"""
from __future__ import annotations

import math

import torch

from .config import Qwen3Config, Qwen3MoeConfig
from .moe import moe_shapes

__all__ = ["LAYER_KEYS", "layer_shapes", "target_layer_shapes", "init_weights"]

LAYER_KEYS = (
    "input_layernorm.weight", "post_attention_layernorm.weight",
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
)

# Projections that write into the residual stream (scaled down by the training init).
_RESIDUAL_OUT = ("self_attn.o_proj.weight", "mlp.down_proj.weight")


def layer_shapes(cfg: Qwen3Config) -> dict[str, tuple[int, ...]]:
    """Expected shape of each per-layer tensor of a Qwen3-style layer with config ``cfg``."""
    h, dh, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_attention_heads * dh, cfg.num_key_value_heads * dh
    return {
        "input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,),
        "self_attn.q_proj.weight": (q, h), "self_attn.k_proj.weight": (kv, h),
        "self_attn.v_proj.weight": (kv, h), "self_attn.o_proj.weight": (h, q),
        "self_attn.q_norm.weight": (dh,), "self_attn.k_norm.weight": (dh,),
        "mlp.gate_proj.weight": (i, h), "mlp.up_proj.weight": (i, h), "mlp.down_proj.weight": (h, i),
    }


def target_layer_shapes(cfg: Qwen3Config, layer: int) -> dict[str, tuple[int, ...]]:
    """Expected shape of each tensor of target layer ``layer``: :func:`layer_shapes`, or for a
    sparse layer of a Qwen3-MoE config the attention and norms plus the router and fused experts."""
    shapes = layer_shapes(cfg)
    if not (isinstance(cfg, Qwen3MoeConfig) and cfg.is_sparse(layer)):
        return shapes
    out = {k: v for k, v in shapes.items() if not k.startswith("mlp.")}
    out.update(moe_shapes(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size))
    return out


def init_weights(shapes: dict[str, tuple[int, ...]], gen: torch.Generator, *, prefix: str = "",
                 std: float | None = None, num_layers: int | None = None, device=None,
                 dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Random tensors for a shape table, drawn from ``gen`` in the table's order.

    Two schemes:
      ``std`` None (random models for tests, demos, benches): vectors (norm weights)
      ``1 + 0.1 N(0, 1)``, around 1 so that they matter but stay tame; other tensors
      ``N(0, 1) / sqrt(fan_in)``, fan-in being the last dim.
      ``std`` given (training from scratch): vectors ones (nothing drawn); other tensors
      ``std N(0, 1)``, the residual-stream outputs (o_proj, down_proj) divided further by
      ``sqrt(2 num_layers)`` (GPT-2 style).

    Parameters
    ----------
    shapes : key -> shape (e.g. :func:`layer_shapes`); prefix : prepended to every key
    device, dtype : drawn on ``device`` (the default when None), returned in ``dtype``

    Returns
    -------
    dict ``prefix + key -> tensor``.
    """
    if std is not None and num_layers is None:
        raise ValueError("init_weights: num_layers is required with std")
    out = {}
    for key, shape in shapes.items():
        if std is None:
            if len(shape) == 1:
                t = 1.0 + 0.1 * torch.randn(shape, device=device, generator=gen)
            else:
                t = torch.randn(shape, device=device, generator=gen) / shape[-1] ** 0.5
        elif len(shape) == 1:
            t = torch.ones(shape, device=device)
        else:
            scale = std / math.sqrt(2 * num_layers) if key in _RESIDUAL_OUT else std
            t = torch.randn(shape, device=device, generator=gen) * scale
        out[prefix + key] = t.to(dtype)
    return out
