"""Random (or loaded) target and draft-head models for bench_draft_head and bench_decode.

Sizes:
  ``tiny``   jetspec_kernels.models.tiny configs (hidden 64, vocab 97): CPU quick runs.
  ``small``  a 8-layer hidden-2048 Qwen3-style target with the real 151936 vocabulary and a
             2-layer head (block 16, 3 taps).
  ``8b``     Qwen3-8B's shape (hidden 4096, 36 layers, 32/8 heads, Dh 128, MLP 12288, V 151936)
             and a 5-layer JetSpec head (block 16, taps [1, 9, 17, 25, 33]): bench_decode on a
             GPU (the whole target, about 16.4 GB of bf16 weights) and bench_draft_head (the
             target's embedding and lm_head only).
  ``tiny_moe``  the tiny target with both layers sparse (8 experts, top-2, expert width 32).
  ``30b_a3b``   a Qwen3-30B-A3B-shaped MoE target (hidden 2048, 48 layers, 32/4 heads, Dh 128,
             128 experts, top-8 renormalised, expert width 768, vocab 151936) and a 5-layer head
             (block 16, taps [1, 12, 23, 34, 45]); about 61 GB of bf16 weights.
Random weights are drawn on the device in the bench dtype (scaled by 1/sqrt(fan_in)), so even the
8b target builds in seconds on a GPU. bench/decode_costs.py computes the costs of these shapes
from the same configs (:func:`configs`). Random heads accept almost nothing: decode ratios on random
models measure machinery, not the method; pass checkpoint directories for real numbers.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


class ModelsUnavailable(RuntimeError):
    """jetspec_kernels.models / decode cannot be imported (the message says why)."""


def import_models():
    """``(models, decode)`` modules of jetspec_kernels, or raise :class:`ModelsUnavailable`."""
    try:
        from jetspec_kernels import decode, models
    except Exception as e:
        raise ModelsUnavailable(f"jetspec_kernels.models / decode are not importable "
                                f"({type(e).__name__}: {e})") from e
    return models, decode


@dataclass
class Models:
    """A draft head, the target's embedding / lm_head, and the target itself when built."""

    head: object
    embed_weight: torch.Tensor
    lm_head_weight: torch.Tensor
    target: object | None
    label: str


def configs(size: str):
    """``(target config, draft-head config)`` of a model size (see the module docstring)."""
    from dataclasses import asdict

    from jetspec_kernels.models.config import Qwen3MoeConfig, default_target_layer_ids
    from jetspec_kernels.models.tiny import tiny_draft_config, tiny_qwen3_config

    if size == "tiny_moe":
        tcfg = Qwen3MoeConfig(**asdict(tiny_qwen3_config()), num_experts=8, num_experts_per_tok=2,
                              moe_intermediate_size=32, norm_topk_prob=True)
        return tcfg, tiny_draft_config(tcfg)
    if size == "30b_a3b":
        dense = tiny_qwen3_config(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                                  num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                                  head_dim=128, rope_theta=1e6)
        tcfg = Qwen3MoeConfig(**asdict(dense), num_experts=128, num_experts_per_tok=8,
                              moe_intermediate_size=768, norm_topk_prob=True)
        return tcfg, tiny_draft_config(tcfg, num_hidden_layers=5, block_size=16,
                                       target_layer_ids=default_target_layer_ids(48, 5))
    if size == "tiny":
        tcfg = tiny_qwen3_config()
        return tcfg, tiny_draft_config(tcfg)
    if size == "small":
        tcfg = tiny_qwen3_config(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                                 num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=8,
                                 head_dim=128, rope_theta=1e6)
        return tcfg, tiny_draft_config(tcfg, num_hidden_layers=2, block_size=16,
                                       target_layer_ids=[1, 4, 6])
    if size == "8b":
        tcfg = tiny_qwen3_config(vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                                 num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                                 head_dim=128, rope_theta=1e6)
        return tcfg, tiny_draft_config(tcfg, num_hidden_layers=5, block_size=16,
                                       target_layer_ids=[1, 9, 17, 25, 33])
    raise ValueError(f"unknown model size {size!r}")


def build(device: torch.device, dtype: torch.dtype, *, size: str, with_target: bool,
          target_dir: str | None = None, head_dir: str | None = None, seed: int = 0) -> Models:
    """Load the checkpoints given, else build random models of ``size`` on ``device``.

    Parameters
    ----------
    device, dtype : where and in what dtype the weights live
    size : "tiny" | "small" | "8b" | "tiny_moe" | "30b_a3b" (ignored for what is loaded from a
        directory)
    with_target : build the whole target (decode) or only its embedding and lm_head (draft head)
    target_dir, head_dir : Hugging Face Qwen3 / JetSpec head checkpoint directories, optional
    """
    models, _ = import_models()
    from jetspec_kernels.models.init import init_weights, layer_shapes, target_layer_shapes

    gen = torch.Generator(device=device).manual_seed(seed)
    tcfg, dcfg = configs(size)
    if target_dir:
        target = models.Qwen3.from_pretrained(target_dir, dtype=dtype, device=device)
        embed, lm_head = target.embed_weight, target.lm_head_weight
    else:
        embed = torch.randn(tcfg.vocab_size, tcfg.hidden_size, device=device, generator=gen).to(dtype)
        lm_head = (torch.randn(tcfg.vocab_size, tcfg.hidden_size, device=device, generator=gen)
                   / tcfg.hidden_size ** 0.5).to(dtype)
        target = None
        if with_target:
            w = {"model.embed_tokens.weight": embed, "lm_head.weight": lm_head,
                 "model.norm.weight": torch.ones(tcfg.hidden_size, device=device, dtype=dtype)}
            for i in range(tcfg.num_hidden_layers):
                w.update(init_weights(target_layer_shapes(tcfg, i), gen, prefix=f"model.layers.{i}.",
                                      device=device, dtype=dtype))
            target = models.Qwen3(tcfg, w)
    if head_dir:
        head = models.DraftHead.from_pretrained(head_dir, dtype=dtype, device=device)
    else:
        width = len(dcfg.target_layer_ids) * dcfg.target_hidden_size
        w = {"fc.weight": (torch.randn(dcfg.hidden_size, width, device=device, generator=gen)
                           / width ** 0.5).to(dtype),
             "hidden_norm.weight": torch.ones(dcfg.hidden_size, device=device, dtype=dtype),
             "norm.weight": torch.ones(dcfg.hidden_size, device=device, dtype=dtype)}
        for i in range(dcfg.num_hidden_layers):
            w.update(init_weights(layer_shapes(dcfg), gen, prefix=f"layers.{i}.", device=device,
                                  dtype=dtype))
        head = models.DraftHead(dcfg, w)
    label = f"target {target_dir or size}, head {head_dir or size}"
    return Models(head=head, embed_weight=embed, lm_head_weight=lm_head, target=target, label=label)


def head_param_counts(head) -> tuple[int, int, int]:
    """``(fc params, per-layer linear params summed over layers, k+v proj params over layers)``."""
    fc = head.fc_weight.numel()
    lin = sum(t.numel() for layer in head.layers for t in layer.values() if t.dim() == 2)
    kv = sum(layer[k].numel() for layer in head.layers
             for k in ("self_attn.k_proj.weight", "self_attn.v_proj.weight"))
    return fc, lin, kv
