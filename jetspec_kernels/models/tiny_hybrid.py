"""Small random Qwen3.5 hybrid targets for tests and demos, and their checkpoint writer."""
from __future__ import annotations

import json
import math
import os

import torch

from .checkpoint import save_safetensors
from .config import Qwen3_5Config
from .qwen3_5 import Qwen3_5, hybrid_layer_shapes

__all__ = ["tiny_qwen3_5_config", "random_qwen3_5_weights", "save_qwen3_5", "tiny_qwen3_5"]


def tiny_qwen3_5_config(**overrides) -> Qwen3_5Config:
    """A 4-layer hidden-64 hybrid (three Gated DeltaNet layers, then one gated attention layer;
    97-token vocabulary); ``num_experts`` > 0 makes it MoE (fields overridable)."""
    base = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                rope_theta=10000.0, partial_rotary_factor=0.25,
                layer_types=["linear_attention"] * 3 + ["full_attention"],
                linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                linear_value_head_dim=8, linear_conv_kernel_dim=4)
    base.update(overrides)
    if base.get("num_experts", 0):
        base.setdefault("moe_intermediate_size", 32)
        base.setdefault("shared_expert_intermediate_size", 48)
        base.setdefault("num_experts_per_tok", 2)
        base["intermediate_size"] = 0
    return Qwen3_5Config(**base)


def random_qwen3_5_weights(cfg: Qwen3_5Config, seed: int = 0, *, experts_fused: bool = False,
                           logit_scale: float = 1.0) -> dict[str, torch.Tensor]:
    """Random Hugging Face-keyed weights (float32, ``model.`` prefix). Zero-centred norms are
    ``0.1 N(0, 1)``, the gated norm ``1 + 0.1 N(0, 1)``, ``A_log = log U(1, 8)``, ``dt_bias N(0, 1)``,
    matrices ``N(0, 1) / sqrt(fan_in)``; per-expert MoE tensors unless ``experts_fused``."""
    gen = torch.Generator().manual_seed(seed)
    h = cfg.hidden_size
    w = {"model.embed_tokens.weight": torch.randn(cfg.vocab_size, h, generator=gen)}
    for i in range(cfg.num_hidden_layers):
        for key, shape in hybrid_layer_shapes(cfg, i).items():
            if key == "linear_attn.A_log":
                t = torch.log(1 + 7 * torch.rand(shape, generator=gen))
            elif key == "linear_attn.dt_bias":
                t = torch.randn(shape, generator=gen)
            elif key == "linear_attn.norm.weight":
                t = 1 + 0.1 * torch.randn(shape, generator=gen)
            elif len(shape) == 1:
                t = 0.1 * torch.randn(shape, generator=gen)
            else:
                t = torch.randn(shape, generator=gen) / math.sqrt(shape[-1])
            w[f"model.layers.{i}.{key}"] = t
        if cfg.moe and not experts_fused:
            base = f"model.layers.{i}.mlp.experts."
            gate_up, down = w.pop(base + "gate_up_proj"), w.pop(base + "down_proj")
            inter = cfg.moe_intermediate_size
            for j in range(cfg.num_experts):
                w[f"{base}{j}.gate_proj.weight"] = gate_up[j, :inter].clone()
                w[f"{base}{j}.up_proj.weight"] = gate_up[j, inter:].clone()
                w[f"{base}{j}.down_proj.weight"] = down[j].clone()
    w["model.norm.weight"] = 0.1 * torch.randn(h, generator=gen)
    if not cfg.tie_word_embeddings:
        w["lm_head.weight"] = torch.randn(cfg.vocab_size, h, generator=gen) * (logit_scale / h ** 0.5)
    return w


def tiny_qwen3_5(*, seed: int = 0, dtype: torch.dtype = torch.float32, device="cpu",
                 **overrides) -> Qwen3_5:
    """A random :class:`Qwen3_5` of :func:`tiny_qwen3_5_config` (``overrides``)."""
    cfg = tiny_qwen3_5_config(**overrides)
    weights = {k: v.to(dtype=dtype, device=device) for k, v in random_qwen3_5_weights(cfg, seed).items()}
    return Qwen3_5(cfg, weights)


def save_qwen3_5(cfg: Qwen3_5Config, weights: dict[str, torch.Tensor], path: str, *,
                 multimodal: bool = False, max_shard_bytes: int | None = None) -> None:
    """Write a Hugging Face-style checkpoint directory: the text model's (``Qwen3_5ForCausalLM``)
    or, ``multimodal``, the layout of a ``Qwen3_5ForConditionalGeneration`` export (config
    nested as ``text_config``, tensors under ``model.language_model.``)."""
    os.makedirs(path, exist_ok=True)
    d = cfg.to_dict()
    if multimodal:
        top = "qwen3_5_moe" if cfg.moe else "qwen3_5"
        d = {"model_type": top, "architectures": ["Qwen3_5ForConditionalGeneration"],
             "tie_word_embeddings": d.pop("tie_word_embeddings"), "text_config": d,
             "vision_config": {"depth": 1}}
        weights = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
                   for k, v in weights.items()}
    else:
        d["architectures"] = ["Qwen3_5MoeForCausalLM" if cfg.moe else "Qwen3_5ForCausalLM"]
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(d, f, indent=1)
    save_safetensors(weights, path, max_shard_bytes=max_shard_bytes)
