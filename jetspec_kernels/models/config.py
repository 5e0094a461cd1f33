"""Model configurations parsed from Hugging Face style ``config.json`` files.

:class:`Qwen3Config` covers the target (a Qwen3 decoder); :class:`DraftConfig` adds the JetSpec /
DFlash draft-head fields (DESIGN.md section 3). Unsupported features (RoPE scaling, sliding
windows, attention biases) raise instead of being silently ignored.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

__all__ = ["Qwen3Config", "DraftConfig", "default_target_layer_ids", "read_config"]


def _rope_theta(cfg: dict) -> float:
    """``rope_theta`` from either the classic top-level key or transformers 5's ``rope_parameters``."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    rope_type = params.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    if rope_type not in (None, "default"):
        raise ValueError(f"config: RoPE type {rope_type!r} is not supported (only 'default')")
    theta = params.get("rope_theta", cfg.get("rope_theta"))
    return 1000000.0 if theta is None else float(theta)


def _require(cfg: dict, key: str, what: str):
    if key not in cfg:
        raise ValueError(f"{what} config.json has no {key!r}")
    return cfg[key]


@dataclass
class Qwen3Config:
    """Shape and numerics of a Qwen3 decoder (the subset this package implements)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1000000.0
    tie_word_embeddings: bool = False
    eos_token_id: int | list | None = None

    @classmethod
    def from_dict(cls, cfg: dict, what: str = "target") -> "Qwen3Config":
        """Parse a config dict; raises ``ValueError`` naming a missing key or unsupported feature."""
        if cfg.get("use_sliding_window"):
            raise ValueError(f"{what} config: sliding-window attention is not supported")
        if cfg.get("attention_bias"):
            raise ValueError(f"{what} config: attention_bias=true is not supported")
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"{what} config: hidden_act {act!r} is not supported (only 'silu')")
        heads = int(_require(cfg, "num_attention_heads", what))
        hidden = int(_require(cfg, "hidden_size", what))
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        if heads % kv_heads:
            raise ValueError(f"{what} config: num_attention_heads ({heads}) must be a multiple of "
                             f"num_key_value_heads ({kv_heads})")
        return cls(
            vocab_size=int(_require(cfg, "vocab_size", what)),
            hidden_size=hidden,
            intermediate_size=int(_require(cfg, "intermediate_size", what)),
            num_hidden_layers=int(_require(cfg, "num_hidden_layers", what)),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=_rope_theta(cfg),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            eos_token_id=cfg.get("eos_token_id"),
        )

    @classmethod
    def from_file(cls, path: str) -> "Qwen3Config":
        """Read ``path`` (a config.json, or a directory holding one)."""
        return cls.from_dict(read_config(path))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["model_type"] = "qwen3"
        d["hidden_act"] = "silu"
        return d


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Target layers to tap when ``dflash_config.target_layer_ids`` is missing (DESIGN.md).

    One draft layer -> ``[L // 2]``; otherwise evenly spaced over ``[1, L - 3]``, rounded.
    """
    if num_draft_layers < 1:
        raise ValueError(f"num_draft_layers must be >= 1, got {num_draft_layers}")
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [int(round(1 + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]


@dataclass
class DraftConfig(Qwen3Config):
    """A JetSpec / DFlash draft head: a Qwen3 layer stack plus the ``dflash_config`` fields."""

    block_size: int = 16
    num_target_layers: int = 0
    causal_head: bool = True
    target_layer_ids: list = field(default_factory=list)
    mask_token_id: int = 0
    target_hidden_size: int = 0

    @classmethod
    def from_dict(cls, cfg: dict, what: str = "draft head") -> "DraftConfig":
        base = Qwen3Config.from_dict(cfg, what)
        dcfg = cfg.get("dflash_config") or {}
        mask_id = dcfg.get("mask_token_id", cfg.get("mask_token_id"))
        if mask_id is None:
            raise ValueError(f"{what} config.json has no 'dflash_config.mask_token_id'")
        block = int(_require(cfg, "block_size", what))
        if block < 2:
            raise ValueError(f"{what} config: block_size must be >= 2, got {block}")
        ids = dcfg.get("target_layer_ids")
        n_target = int(cfg.get("num_target_layers") or 0)
        if ids is None:
            if n_target <= 0:
                raise ValueError(f"{what} config.json has neither 'dflash_config.target_layer_ids' "
                                 "nor 'num_target_layers'")
            ids = default_target_layer_ids(n_target, base.num_hidden_layers)
        return cls(**asdict(base), block_size=block, num_target_layers=n_target,
                   causal_head=bool(dcfg.get("causal_head", True)),
                   target_layer_ids=[int(i) for i in ids], mask_token_id=int(mask_id),
                   target_hidden_size=int(dcfg.get("target_hidden_size") or base.hidden_size))

    def to_dict(self) -> dict:
        d = super().to_dict()
        dflash = {k: d.pop(k) for k in ("causal_head", "target_layer_ids", "mask_token_id",
                                        "target_hidden_size")}
        d["dflash_config"] = dflash
        return d


def read_config(path: str) -> dict:
    """The parsed ``config.json`` at ``path`` (a file, or a directory holding one)."""
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no config.json at {path}")
    with open(path) as f:
        return json.load(f)
