"""One GEMM for q, k and v and one for gate and up: a layer's projection weights concatenated
once at load. The checkpoint keys stay, as row views of the concatenations (no extra memory
once loaded; an in-place change to one shows in both)."""
from __future__ import annotations

import torch

QKV_KEY, QKV = "self_attn.qkv_proj.weight", ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                             "self_attn.v_proj.weight")
GATE_UP_KEY, GATE_UP = "mlp.gate_up_proj.weight", ("mlp.gate_proj.weight", "mlp.up_proj.weight")


def fuse_projections(layer: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    """``(layer, run)``: the layer's tensors with q/k/v and gate/up as views of their
    concatenations, and the dict ``models/layer.py``'s ``decoder_layer`` runs (the same plus
    ``self_attn.qkv_proj.weight`` [(Nq + 2 Nkv), H] and ``mlp.gate_up_proj.weight`` [2 I, H],
    where the layer has those parts). Code that sums over ``layer.values()`` sees each weight
    once."""
    layer = dict(layer)
    fused = {}
    for key, parts in ((QKV_KEY, QKV), (GATE_UP_KEY, GATE_UP)):
        if all(p in layer for p in parts):
            whole = torch.cat([layer[p] for p in parts])
            for p, view in zip(parts, whole.split([layer[p].shape[0] for p in parts])):
                layer[p] = view
            fused[key] = whole
    return layer, {**layer, **fused}


def fused_layers(layers: list[dict]) -> tuple[list[dict], list[dict]]:
    """:func:`fuse_projections` of each layer: ``(layers, run_layers)``, what a model keeps as
    ``layers`` (checkpoint keys) and what its forward runs."""
    pairs = [fuse_projections(layer) for layer in layers]
    return [layer for layer, _ in pairs], [run for _, run in pairs]
