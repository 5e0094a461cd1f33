"""Which checkpoint tensor of a layer is split how under tensor parallelism (:mod:`jetspec_kernels.tp`).

Attention: q/k/v column-parallel by whole heads (this rank keeps heads ``r*Hq/tp ..`` and
``r*Hkv/tp ..``, so each q head keeps its GQA kv head), o_proj row-parallel. MLP: gate/up
column-parallel, down row-parallel. MoE experts: the same column/row split inside every expert
(the fused ``gate_up_proj [E, 2I, H]`` per block, ``down_proj [E, H, I]``), the router replicated,
so every rank routes every token identically and no token moves between ranks. Norm weights are
replicated. Row-parallel outputs are partial sums: the layer all-reduces them (decoder_layer's
``reduce``), one all-reduce after attention and one after the MLP.
"""
from __future__ import annotations

import torch

from ..tp import Shard, colwise, rowwise

__all__ = ["COLWISE", "ROWWISE", "check_tp", "shard_layer", "local_heads"]

# key -> blocks side by side in the output dim (fused gate|up is two)
COLWISE = {"self_attn.q_proj.weight": 1, "self_attn.k_proj.weight": 1, "self_attn.v_proj.weight": 1,
           "mlp.gate_proj.weight": 1, "mlp.up_proj.weight": 1, "mlp.experts.gate_up_proj": 2}
ROWWISE = ("self_attn.o_proj.weight", "mlp.down_proj.weight", "mlp.experts.down_proj")


def check_tp(cfg, shard: Shard, where: str, sizes: dict[str, int]) -> None:
    """Raise ``ValueError`` naming tp and the head counts when tp does not divide the query and
    key/value heads of ``cfg``, or naming the field when it does not divide one of ``sizes``
    (field name -> size split column-wise, e.g. ``{"intermediate_size": I}``)."""
    tp = shard.size
    if tp == 1:
        return
    if cfg.num_attention_heads % tp or cfg.num_key_value_heads % tp:
        raise ValueError(f"{where}: tp={tp} must divide num_attention_heads "
                         f"({cfg.num_attention_heads}) and num_key_value_heads "
                         f"({cfg.num_key_value_heads}): each rank holds whole heads")
    for name, size in sizes.items():
        if size % tp:
            raise ValueError(f"{where}: tp={tp} must divide {name} ({size})")


def shard_layer(weights: dict[str, torch.Tensor], shard: Shard) -> dict[str, torch.Tensor]:
    """One layer's tensors (keys after ``layers.{i}.``) with this rank's part of each split tensor
    (copies) and the others as they are; the dict itself when alone."""
    if not shard.parallel:
        return weights
    out = {}
    for key, t in weights.items():
        if key in COLWISE:
            out[key] = colwise(t, shard, blocks=COLWISE[key], what=key)
        elif key in ROWWISE:
            out[key] = rowwise(t, shard, what=key)
        else:
            out[key] = t
    return out


def local_heads(cfg, shard: Shard) -> tuple[int, int]:
    """``(query heads, key/value heads)`` this rank holds."""
    return cfg.num_attention_heads // shard.size, cfg.num_key_value_heads // shard.size
