"""Model configurations parsed from Hugging Face style ``config.json`` files.

:class:`Qwen3Config` covers the target (a Qwen3 decoder), :class:`Qwen3MoeConfig` a Qwen3-MoE target
(``model_type`` ``qwen3_moe``), :class:`Qwen3_5Config` a Qwen3.5 / Qwen3.6 hybrid (``qwen3_5``,
``qwen3_5_moe``: Gated DeltaNet and gated attention layers); :class:`DraftConfig` adds the JetSpec / DFlash draft-head fields
(DESIGN.md section 3). Fields the models do not implement (another
model_type, RoPE scaling, sliding windows, biases, quantisation, another activation) and fields of
the wrong type raise :class:`CheckpointError` (a ``ValueError``) naming the field, instead of
being silently ignored.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field

from .checkpoint import CheckpointError

__all__ = ["Qwen3Config", "Qwen3MoeConfig", "Qwen3_5Config", "DraftConfig",
           "default_target_layer_ids", "is_hybrid_config", "read_config", "text_config"]

TARGET_MODEL_TYPES = ("qwen3", "qwen3_moe")
# Draft-head configs are Qwen3 configs; some tools label DFlash heads with their own type.
DRAFT_MODEL_TYPES = ("qwen3", "dflash")


def _rope_theta(cfg: dict, what: str) -> float:
    """``rope_theta`` from either the classic top-level key or transformers 5's ``rope_parameters``."""
    for key in ("rope_parameters", "rope_scaling"):
        params = cfg.get(key)
        if params is None:
            continue
        if not isinstance(params, dict):
            raise CheckpointError(f"{what}: field {key!r} must be an object, got {params!r}")
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type not in (None, "default"):
            raise CheckpointError(f"{what}: field {key!r}: RoPE type {rope_type!r} is not supported "
                                  "(only 'default')")
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta"))
    if theta is None:
        return 1000000.0
    return _positive_number(theta, "rope_theta", what)


def _positive_number(v, key: str, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise CheckpointError(f"{what}: field {key!r} must be a positive number, got {v!r}")
    return float(v)


def _int(cfg: dict, key: str, what: str, *, lo: int = 1, default=None) -> int:
    """``cfg[key]`` as an int >= ``lo``; a missing (or null) key gives ``default``, or raises
    when there is none."""
    v = cfg.get(key)
    if v is None:
        if default is None:
            raise CheckpointError(f"{what}: has no {key!r}")
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise CheckpointError(f"{what}: field {key!r} must be an int >= {lo}, got {v!r}")
    return v


def _bool(cfg: dict, key: str, what: str, default: bool) -> bool:
    v = cfg.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise CheckpointError(f"{what}: field {key!r} must be true or false, got {v!r}")
    return v


def _check_supported(cfg: dict, what: str, model_types) -> None:
    """Raise on fields that change the model in ways this package does not implement."""
    mtype = cfg.get("model_type")
    if mtype is not None and mtype not in model_types:
        raise CheckpointError(f"{what}: model_type {mtype!r} is not supported (only "
                              f"{' / '.join(repr(t) for t in model_types)})")
    for key in ("use_sliding_window", "attention_bias", "mlp_bias"):
        if _bool(cfg, key, what, False):
            raise CheckpointError(f"{what}: field {key!r}=true is not supported")
    layer_types = cfg.get("layer_types")
    if layer_types is not None:
        other = sorted({t for t in layer_types if t != "full_attention"}) \
            if isinstance(layer_types, list) else [layer_types]
        if other:
            raise CheckpointError(f"{what}: field 'layer_types' has {other}; only 'full_attention' "
                                  "layers are supported")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"{what}: field 'hidden_act' {act!r} is not supported (only 'silu')")
    if cfg.get("quantization_config") is not None:
        raise CheckpointError(f"{what}: field 'quantization_config': quantised weights are not "
                              "supported")
    rotary = cfg.get("partial_rotary_factor", 1.0)
    if rotary != 1.0:
        raise CheckpointError(f"{what}: field 'partial_rotary_factor' {rotary!r} is not supported "
                              "(only 1.0)")


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
    def from_dict(cls, cfg: dict, what: str = "target config", *,
                  model_types=TARGET_MODEL_TYPES) -> "Qwen3Config":
        """Parse a config dict; raises :class:`CheckpointError` (a ``ValueError``) naming a
        missing or malformed field or an unsupported feature, prefixed with ``what``.
        A ``qwen3_moe`` config gives a :class:`Qwen3MoeConfig`."""
        if not isinstance(cfg, dict):
            raise CheckpointError(f"{what}: must be a JSON object, got {type(cfg).__name__}")
        _check_supported(cfg, what, model_types)
        heads = _int(cfg, "num_attention_heads", what)
        hidden = _int(cfg, "hidden_size", what)
        kv_heads = _int(cfg, "num_key_value_heads", what, default=heads)
        if heads % kv_heads:
            raise CheckpointError(f"{what}: num_attention_heads ({heads}) must be a multiple of "
                                  f"num_key_value_heads ({kv_heads})")
        if cfg.get("head_dim") is None and hidden % heads:
            raise CheckpointError(f"{what}: has no 'head_dim' and hidden_size ({hidden}) is not a "
                                  f"multiple of num_attention_heads ({heads})")
        fields = dict(
            vocab_size=_int(cfg, "vocab_size", what),
            hidden_size=hidden,
            intermediate_size=_int(cfg, "intermediate_size", what),
            num_hidden_layers=_int(cfg, "num_hidden_layers", what),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=_int(cfg, "head_dim", what, default=hidden // heads),
            rms_norm_eps=_positive_number(cfg.get("rms_norm_eps", 1e-6), "rms_norm_eps", what),
            rope_theta=_rope_theta(cfg, what),
            tie_word_embeddings=_bool(cfg, "tie_word_embeddings", what, False),
            eos_token_id=cfg.get("eos_token_id"),
        )
        if cfg.get("model_type") == "qwen3_moe":
            return Qwen3MoeConfig(**fields, **Qwen3MoeConfig.moe_fields(cfg, what,
                                                                        fields["num_hidden_layers"]))
        return cls(**fields)

    @classmethod
    def from_file(cls, path: str) -> "Qwen3Config":
        """Read ``path`` (a config.json, or a directory holding one)."""
        return cls.from_dict(read_config(path), f"target config {_config_path(path)}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["model_type"] = "qwen3"
        d["hidden_act"] = "silu"
        return d


@dataclass
class Qwen3MoeConfig(Qwen3Config):
    """A Qwen3-MoE decoder: :class:`Qwen3Config` plus the sparse-MLP fields of transformers'
    ``Qwen3MoeConfig``. Layer ``l`` is sparse when ``l not in mlp_only_layers``, ``num_experts > 0``
    and ``(l + 1) % decoder_sparse_step == 0``; other layers have a dense MLP of
    ``intermediate_size``."""

    num_experts: int = 0
    num_experts_per_tok: int = 1
    moe_intermediate_size: int = 1
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: list = field(default_factory=list)

    @staticmethod
    def moe_fields(cfg: dict, what: str, num_layers: int) -> dict:
        """The sparse-MLP fields of a ``qwen3_moe`` config dict, checked (CheckpointError naming
        the field). ``num_experts`` may be spelled ``num_local_experts`` (transformers 5's
        ``save_pretrained`` writes that name)."""
        names = [k for k in ("num_experts", "num_local_experts") if cfg.get(k) is not None]
        if len(names) == 2 and cfg["num_experts"] != cfg["num_local_experts"]:
            raise CheckpointError(f"{what}: fields 'num_experts' ({cfg['num_experts']!r}) and "
                                  f"'num_local_experts' ({cfg['num_local_experts']!r}) disagree")
        if not names:
            raise CheckpointError(f"{what}: has no 'num_experts' (needed for model_type 'qwen3_moe')")
        only = cfg.get("mlp_only_layers")
        only = [] if only is None else only
        if not isinstance(only, list) or any(isinstance(i, bool) or not isinstance(i, int)
                                             or not 0 <= i < num_layers for i in only):
            raise CheckpointError(f"{what}: field 'mlp_only_layers' must be a list of layer ids in "
                                  f"[0, {num_layers}), got {only!r}")
        out = dict(num_experts=_int(cfg, names[0], what, lo=0),
                   num_experts_per_tok=_int(cfg, "num_experts_per_tok", what),
                   moe_intermediate_size=_int(cfg, "moe_intermediate_size", what),
                   norm_topk_prob=_bool(cfg, "norm_topk_prob", what, False),
                   decoder_sparse_step=_int(cfg, "decoder_sparse_step", what, default=1),
                   mlp_only_layers=sorted(set(only)))
        if out["num_experts_per_tok"] > out["num_experts"] > 0:
            raise CheckpointError(f"{what}: field 'num_experts_per_tok' ({out['num_experts_per_tok']}) "
                                  f"exceeds 'num_experts' ({out['num_experts']})")
        return out

    def __post_init__(self):
        if self.num_experts_per_tok > self.num_experts > 0:
            raise ValueError(f"num_experts_per_tok ({self.num_experts_per_tok}) exceeds num_experts "
                             f"({self.num_experts})")

    def is_sparse(self, layer: int) -> bool:
        """Whether layer ``layer`` has the sparse (routed experts) MLP, as transformers decides."""
        return (layer not in self.mlp_only_layers and self.num_experts > 0
                and (layer + 1) % self.decoder_sparse_step == 0)

    def to_dict(self) -> dict:
        d = super().to_dict()
        d["model_type"] = "qwen3_moe"
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
    def from_dict(cls, cfg: dict, what: str = "draft head config") -> "DraftConfig":
        """Parse a draft-head config dict (as :meth:`Qwen3Config.from_dict`, plus the
        ``dflash_config`` fields)."""
        base = Qwen3Config.from_dict(cfg, what, model_types=DRAFT_MODEL_TYPES)
        dcfg = cfg.get("dflash_config") or {}
        if not isinstance(dcfg, dict):
            raise CheckpointError(f"{what}: field 'dflash_config' must be an object, got {dcfg!r}")
        merged = {**cfg, **dcfg}     # mask_token_id may sit at the top level too
        if merged.get("mask_token_id") is None:
            raise CheckpointError(f"{what}: has no 'dflash_config.mask_token_id'")
        mask_id = _int(merged, "mask_token_id", what, lo=0)
        if mask_id >= base.vocab_size:
            raise CheckpointError(f"{what}: mask_token_id {mask_id} is outside the vocabulary "
                                  f"[0, {base.vocab_size})")
        block = _int(cfg, "block_size", what, lo=2)
        n_target = _int(cfg, "num_target_layers", what, lo=0, default=0)
        ids = dcfg.get("target_layer_ids")
        if ids is None:
            if n_target <= 0:
                raise CheckpointError(f"{what}: has neither 'dflash_config.target_layer_ids' nor "
                                      "'num_target_layers'")
            ids = default_target_layer_ids(n_target, base.num_hidden_layers)
        if not isinstance(ids, list) or not ids or \
                any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
            raise CheckpointError(f"{what}: field 'dflash_config.target_layer_ids' must be a "
                                  f"non-empty list of layer ids >= 0, got {ids!r}")
        if n_target and max(ids) >= n_target:
            raise CheckpointError(f"{what}: target_layer_ids {ids} out of range for "
                                  f"num_target_layers={n_target}")
        return cls(**asdict(base), block_size=block, num_target_layers=n_target,
                   causal_head=_bool(dcfg, "causal_head", what, True), target_layer_ids=list(ids),
                   mask_token_id=mask_id,
                   target_hidden_size=_int(dcfg, "target_hidden_size", what, default=base.hidden_size))

    def to_dict(self) -> dict:
        d = super().to_dict()
        dflash = {k: d.pop(k) for k in ("causal_head", "target_layer_ids", "mask_token_id",
                                        "target_hidden_size")}
        d["dflash_config"] = dflash
        return d


def _config_path(path: str) -> str:
    return os.path.join(path, "config.json") if os.path.isdir(path) else path


def read_config(path: str) -> dict:
    """The parsed ``config.json`` at ``path`` (a file, or a directory holding one); a missing
    directory or file, or a file that is not a JSON object, raises :class:`CheckpointError`."""
    if not os.path.exists(path):
        raise CheckpointError(f"checkpoint directory {path} does not exist")
    file = _config_path(path)
    if not os.path.isfile(file):
        raise CheckpointError(f"no config.json in {path}")
    try:
        with open(file) as f:
            cfg = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{file} is not a readable JSON file: {e}") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{file} must hold a JSON object, got {type(cfg).__name__}")
    return cfg


HYBRID_MODEL_TYPES = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
_HYBRID_LAYER_TYPES = ("linear_attention", "full_attention")


def text_config(cfg: dict, what: str) -> dict:
    """The text model's fields of a Hugging Face config dict: ``text_config`` of a multimodal
    checkpoint (``model_type`` ``qwen3_5`` / ``qwen3_5_moe`` with a ``text_config``; the top level's
    ``tie_word_embeddings`` wins, as transformers ties the multimodal model's lm_head by it), or
    the dict itself."""
    text = cfg.get("text_config")
    if text is None:
        return cfg
    if not isinstance(text, dict):
        raise CheckpointError(f"{what}: field 'text_config' must be an object, got {text!r}")
    if cfg.get("tie_word_embeddings") is not None:
        text = {**text, "tie_word_embeddings": cfg["tie_word_embeddings"]}
    return text


def is_hybrid_config(cfg: dict) -> bool:
    """Whether a config dict describes a Qwen3.5 hybrid (Gated DeltaNet + attention) target."""
    return isinstance(cfg, dict) and cfg.get("model_type") in HYBRID_MODEL_TYPES


@dataclass
class Qwen3_5Config(Qwen3Config):
    """A Qwen3.5 / Qwen3.6 hybrid decoder (transformers' ``Qwen3_5TextConfig`` and, with
    ``num_experts > 0``, ``Qwen3_5MoeTextConfig``).

    ``layer_types[l]`` is ``"linear_attention"`` (a Gated DeltaNet layer) or ``"full_attention"``
    (gated attention: ``q_proj`` gives q and an output gate, RoPE on the first
    ``rotary_dim = int(head_dim * partial_rotary_factor)`` features). The linear layers have
    ``linear_num_key_heads`` q/k heads of ``linear_key_head_dim`` and ``linear_num_value_heads``
    v heads of ``linear_value_head_dim`` and a depthwise causal conv of width
    ``linear_conv_kernel_dim`` over their ``conv_dim`` q/k/v channels. MoE (every layer sparse):
    ``num_experts`` routed experts of ``moe_intermediate_size``, top ``num_experts_per_tok``
    renormalised, plus a shared expert of ``shared_expert_intermediate_size`` scaled by
    ``sigmoid(shared_expert_gate(x))``. Every RMSNorm but the linear layers' gated one stores
    ``weight - 1`` (transformers' zero-centred ``Qwen3_5RMSNorm``)."""

    layer_types: list = field(default_factory=list)
    partial_rotary_factor: float = 0.25
    linear_num_key_heads: int = 1
    linear_num_value_heads: int = 1
    linear_key_head_dim: int = 1
    linear_value_head_dim: int = 1
    linear_conv_kernel_dim: int = 4
    num_experts: int = 0
    num_experts_per_tok: int = 1
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0

    @classmethod
    def from_dict(cls, cfg: dict, what: str = "target config", **unused) -> "Qwen3_5Config":
        """Parse a ``qwen3_5`` / ``qwen3_5_moe`` config dict (the top level of a multimodal
        checkpoint, whose ``text_config`` is read, or the text config itself); raises
        :class:`CheckpointError` naming a missing or malformed field or an unsupported feature."""
        if not isinstance(cfg, dict):
            raise CheckpointError(f"{what}: must be a JSON object, got {type(cfg).__name__}")
        top_type = cfg.get("model_type")
        cfg = text_config(cfg, what)
        mtype = cfg.get("model_type", top_type)
        if mtype not in HYBRID_MODEL_TYPES:
            raise CheckpointError(f"{what}: model_type {mtype!r} is not a Qwen3.5 hybrid (one of "
                                  f"{' / '.join(repr(t) for t in HYBRID_MODEL_TYPES)})")
        moe = "moe" in mtype or "moe" in str(top_type)
        for key in ("attention_bias", "mlp_bias"):
            if _bool(cfg, key, what, False):
                raise CheckpointError(f"{what}: field {key!r}=true is not supported")
        if not _bool(cfg, "attn_output_gate", what, True):
            raise CheckpointError(f"{what}: field 'attn_output_gate'=false is not supported")
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise CheckpointError(f"{what}: field 'hidden_act' {act!r} is not supported (only 'silu')")
        if cfg.get("quantization_config") is not None:
            raise CheckpointError(f"{what}: field 'quantization_config': quantised weights are not "
                                  "supported")
        heads = _int(cfg, "num_attention_heads", what)
        kv_heads = _int(cfg, "num_key_value_heads", what, default=heads)
        if heads % kv_heads:
            raise CheckpointError(f"{what}: num_attention_heads ({heads}) must be a multiple of "
                                  f"num_key_value_heads ({kv_heads})")
        layers = _int(cfg, "num_hidden_layers", what)
        types = cfg.get("layer_types")
        if types is None:
            interval = _int(cfg, "full_attention_interval", what, default=4)
            types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                     for i in range(layers)]
        if not isinstance(types, list) or len(types) != layers or \
                any(t not in _HYBRID_LAYER_TYPES for t in types):
            raise CheckpointError(f"{what}: field 'layer_types' must list {layers} entries, each "
                                  f"'linear_attention' or 'full_attention', got {types!r}")
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        if not isinstance(rope, dict):
            raise CheckpointError(f"{what}: field 'rope_parameters' must be an object, got {rope!r}")
        if rope.get("rope_type", rope.get("type", "default")) not in (None, "default"):
            raise CheckpointError(f"{what}: field 'rope_parameters': RoPE type "
                                  f"{rope.get('rope_type', rope.get('type'))!r} is not supported "
                                  "(only 'default')")
        theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
        factor = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))
        factor = _positive_number(factor, "partial_rotary_factor", what)
        head_dim = _int(cfg, "head_dim", what, default=256)
        rotary = int(head_dim * factor)
        if factor > 1 or rotary < 2 or rotary % 2:
            raise CheckpointError(f"{what}: field 'partial_rotary_factor' {factor!r} gives a rotary "
                                  f"dim of {rotary} of head_dim {head_dim} (must be even, >= 2 and "
                                  "<= head_dim)")
        lk, lv = _int(cfg, "linear_num_key_heads", what), _int(cfg, "linear_num_value_heads", what)
        if lv % lk:
            raise CheckpointError(f"{what}: linear_num_value_heads ({lv}) must be a multiple of "
                                  f"linear_num_key_heads ({lk})")
        fields = dict(
            vocab_size=_int(cfg, "vocab_size", what),
            hidden_size=_int(cfg, "hidden_size", what),
            intermediate_size=_int(cfg, "intermediate_size", what, lo=0, default=0 if moe else None),
            num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=_positive_number(cfg.get("rms_norm_eps", 1e-6), "rms_norm_eps", what),
            rope_theta=_positive_number(theta, "rope_theta", what),
            tie_word_embeddings=_bool(cfg, "tie_word_embeddings", what, False),
            eos_token_id=cfg.get("eos_token_id"),
            layer_types=list(types), partial_rotary_factor=factor,
            linear_num_key_heads=lk, linear_num_value_heads=lv,
            linear_key_head_dim=_int(cfg, "linear_key_head_dim", what),
            linear_value_head_dim=_int(cfg, "linear_value_head_dim", what),
            linear_conv_kernel_dim=_int(cfg, "linear_conv_kernel_dim", what, lo=2, default=4))
        if moe:
            fields.update(num_experts=_int(cfg, "num_experts", what),
                          num_experts_per_tok=_int(cfg, "num_experts_per_tok", what),
                          moe_intermediate_size=_int(cfg, "moe_intermediate_size", what),
                          shared_expert_intermediate_size=_int(
                              cfg, "shared_expert_intermediate_size", what, lo=0, default=0))
            if fields["num_experts_per_tok"] > fields["num_experts"]:
                raise CheckpointError(f"{what}: field 'num_experts_per_tok' "
                                      f"({fields['num_experts_per_tok']}) exceeds 'num_experts' "
                                      f"({fields['num_experts']})")
        elif fields["intermediate_size"] < 1:
            raise CheckpointError(f"{what}: field 'intermediate_size' must be an int >= 1, got "
                                  f"{fields['intermediate_size']!r}")
        return cls(**fields)

    @property
    def moe(self) -> bool:
        return self.num_experts > 0

    @property
    def rotary_dim(self) -> int:
        """Features of each attention head that RoPE rotates (the first ones)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def conv_dim(self) -> int:
        """Channels of a linear layer's causal conv: q, k (key dim each) and v (value dim)."""
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + \
            self.linear_num_value_heads * self.linear_value_head_dim

    def is_linear(self, layer: int) -> bool:
        return self.layer_types[layer] == "linear_attention"

    def to_dict(self) -> dict:
        """The text config as transformers' ``save_pretrained`` of ``Qwen3_5ForCausalLM`` (or
        the MoE one) writes it."""
        d = asdict(self)
        d["rope_parameters"] = {"rope_type": "default", "rope_theta": d.pop("rope_theta"),
                                "partial_rotary_factor": d.pop("partial_rotary_factor")}
        d["hidden_act"] = "silu"
        if self.moe:
            d.pop("intermediate_size")
            d["model_type"] = "qwen3_5_moe_text"
        else:
            for key in ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                        "shared_expert_intermediate_size"):
                d.pop(key)
            d["model_type"] = "qwen3_5_text"
        return d
