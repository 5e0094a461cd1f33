"""Built-in tiny random models: a Qwen3 target and a matching draft head, for tests and the demo.

The weights are random (seeded), so the draft's acceptance is low; the point is exercising every
code path in seconds on a CPU. :func:`save_qwen3` / :func:`save_draft_head` write them in the
Hugging Face and JetSpec checkpoint formats so the loaders can be tested on them.
"""
from __future__ import annotations

import json
import os

import torch

from .checkpoint import save_safetensors
from .config import DraftConfig, Qwen3Config
from .draft_head import DraftHead
from .init import init_weights, layer_shapes, target_layer_shapes
from .qwen3 import Qwen3

__all__ = ["tiny_qwen3_config", "tiny_draft_config", "random_qwen3_weights", "random_draft_weights",
           "tiny_models", "save_qwen3", "save_draft_head"]


def tiny_qwen3_config(**overrides) -> Qwen3Config:
    """A 2-layer, hidden-64 Qwen3 config with a 97-token vocabulary (fields overridable)."""
    base = dict(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                rope_theta=10000.0, tie_word_embeddings=False)
    base.update(overrides)
    return Qwen3Config(**base)


def tiny_draft_config(target: Qwen3Config, **overrides) -> DraftConfig:
    """A 1-layer draft head for ``target`` tapping its last layer, block size 5 (overridable)."""
    base = dict(vocab_size=target.vocab_size, hidden_size=target.hidden_size,
                intermediate_size=target.intermediate_size, num_hidden_layers=1,
                num_attention_heads=target.num_attention_heads,
                num_key_value_heads=target.num_key_value_heads, head_dim=target.head_dim,
                rms_norm_eps=target.rms_norm_eps, rope_theta=target.rope_theta, block_size=5,
                num_target_layers=target.num_hidden_layers, causal_head=True,
                target_layer_ids=[target.num_hidden_layers - 1], mask_token_id=target.vocab_size - 1,
                target_hidden_size=target.hidden_size)
    base.update(overrides)
    return DraftConfig(**base)


def random_qwen3_weights(cfg: Qwen3Config, seed: int = 0, *,
                         logit_scale: float = 1.0) -> dict[str, torch.Tensor]:
    """Random Hugging Face-keyed Qwen3 weights (float32). ``logit_scale`` sharpens the output
    distribution (it scales the lm_head, or the final norm when embeddings are tied)."""
    gen = torch.Generator().manual_seed(seed)
    w = {"model.embed_tokens.weight": torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen)}
    for i in range(cfg.num_hidden_layers):
        w.update(init_weights(target_layer_shapes(cfg, i), gen, prefix=f"model.layers.{i}."))
    w["model.norm.weight"] = 1.0 + 0.1 * torch.randn(cfg.hidden_size, generator=gen)
    if cfg.tie_word_embeddings:
        w["model.norm.weight"] *= logit_scale / cfg.hidden_size ** 0.5
    else:
        w["lm_head.weight"] = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen) * \
            (logit_scale / cfg.hidden_size ** 0.5)
    return w


def random_draft_weights(cfg: DraftConfig, seed: int = 1) -> dict[str, torch.Tensor]:
    """Random draft-head weights keyed as in the JetSpec checkpoint format (float32)."""
    gen = torch.Generator().manual_seed(seed)
    width = len(cfg.target_layer_ids) * cfg.target_hidden_size
    w = {"fc.weight": torch.randn(cfg.hidden_size, width, generator=gen) / width ** 0.5,
         "hidden_norm.weight": 1.0 + 0.1 * torch.randn(cfg.hidden_size, generator=gen),
         "norm.weight": 1.0 + 0.1 * torch.randn(cfg.hidden_size, generator=gen)}
    for i in range(cfg.num_hidden_layers):
        w.update(init_weights(layer_shapes(cfg), gen, prefix=f"layers.{i}."))
    return w


def _cast(weights, dtype, device):
    return {k: v.to(dtype=dtype, device=device) for k, v in weights.items()}


def tiny_models(*, seed: int = 0, dtype: torch.dtype = torch.float32, device="cpu",
                target_overrides: dict | None = None, draft_overrides: dict | None = None,
                group=None):
    """``(target, head)``: a tiny random :class:`Qwen3` and a matching random :class:`DraftHead`
    (split over the tensor-parallel ``group`` as the constructors do; the same weights on every
    rank before the split)."""
    tcfg = tiny_qwen3_config(**(target_overrides or {}))
    dcfg = tiny_draft_config(tcfg, **(draft_overrides or {}))
    target = Qwen3(tcfg, _cast(random_qwen3_weights(tcfg, seed), dtype, device), group=group)
    head = DraftHead(dcfg, _cast(random_draft_weights(dcfg, seed + 1), dtype, device), group=group)
    return target, head


def save_qwen3(cfg: Qwen3Config, weights: dict[str, torch.Tensor], path: str, *,
               max_shard_bytes: int | None = None) -> None:
    """Write a Hugging Face-style Qwen3 checkpoint directory (config.json + safetensors)."""
    os.makedirs(path, exist_ok=True)
    d = cfg.to_dict()
    d["architectures"] = ["Qwen3ForCausalLM"]
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(d, f, indent=1)
    if cfg.tie_word_embeddings:
        weights = {k: v for k, v in weights.items() if k != "lm_head.weight"}
    save_safetensors(weights, path, max_shard_bytes=max_shard_bytes)


def save_draft_head(cfg: DraftConfig, weights: dict[str, torch.Tensor], path: str, *,
                    max_shard_bytes: int | None = None) -> None:
    """Write a JetSpec-format draft-head checkpoint directory."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg.to_dict(), f, indent=1)
    save_safetensors(weights, path, max_shard_bytes=max_shard_bytes)
